# python3 -m proxyep.rl run end to end (run.py, train/loop.py, train/host.py, train/controller.py):
# python.rl.run: pytest in one process starting real runs (a supervisor process, the trainer's
# and the workers' `proxyep launch` jobs over TCP with the reorder shim, a redis-server) on
# loopback: a seeded run that learns with every metric; a worker preempted and one SIGKILLed; the
# trainer SIGKILLed and resumed; the redis coordinator's server SIGKILLed and restarted. About 2
# minutes here (2.5 when loaded): 5 runs of ~12 s start-up each (the trainer's and the workers'
# Python/torch start-ups) plus their replacement workers; the redis case takes 20-50 s, the upper
# end when workers die holding leases (they expire only after 30 s: a worker's RedisCoordinator
# leases with its default lease_timeout_s, not the run's rollout.lease_timeout_s).
set(rl_run_missing "")
if(NOT TARGET proxyep)
  list(APPEND rl_run_missing "the proxyep CLI target")
endif()
if(NOT EXISTS /usr/bin/redis-server)
  list(APPEND rl_run_missing "/usr/bin/redis-server (Debian package redis-server)")
endif()
if(rl_run_missing)
  proxyep_test_dependency_missing("Python tests: python.rl.run not registered (missing: ${rl_run_missing})")
  return()
endif()
add_test(NAME python.rl.run
         COMMAND ${Python_EXECUTABLE} -m pytest -q -p no:cacheprovider --confcutdir=${PROXYEP_RL_TEST_DIR}
                 ${PROXYEP_RL_TEST_DIR}/test_rl_run.py)
proxyep_timeout(timeout 900)
# Every run's ranks busy-poll the fabric: not alongside the other launched suites.
set_tests_properties(python.rl.run PROPERTIES TIMEOUT ${timeout} LABELS python
                     ENVIRONMENT
                     "PYTHONPATH=${PROXYEP_PYTHON_DIR}:${PROXYEP_RL_TEST_DIR};PYTHONDONTWRITEBYTECODE=1;PROXYEP_RL_CLI=$<TARGET_FILE:proxyep>"
                     RESOURCE_LOCK busy_polling_ranks)
