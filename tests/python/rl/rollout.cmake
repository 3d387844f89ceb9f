# proxyep.rl.rollout: rollout workers (generation.py, loop.py, spot.py, worker.py).
# python.rl.rollout_generation: BatchGenerator on the dense reference against the model's own
# full-sequence forward, ModelConfig, StopNotice (file, local HTTP server, SIGTERM). One process,
# about 2 s.
# python.rl.rollout_worker / python.rl.rollout_spot: pytest in one process holding a served
# MemoryCoordinator; the workers are real `proxyep launch -n 2 --ranks-per-node 1` jobs (TCP
# fabric, reorder shim) started and stopped by pid. About 10 s and 35 s here.
set(rollout_needs ${PROJECT_SOURCE_DIR}/python/proxyep/rl/coordinator/memory.py
                  ${PROJECT_SOURCE_DIR}/python/proxyep/rl/coordinator/service.py
                  ${PROJECT_SOURCE_DIR}/python/proxyep/rl/coordinator/open.py)
set(rollout_missing "")
foreach(file ${rollout_needs})
  if(NOT EXISTS ${file})
    list(APPEND rollout_missing ${file})
  endif()
endforeach()

add_test(NAME python.rl.rollout_generation
         COMMAND ${Python_EXECUTABLE} -m pytest -q -p no:cacheprovider --confcutdir=${PROXYEP_RL_TEST_DIR}
                 ${PROXYEP_RL_TEST_DIR}/test_rollout_generation.py)
proxyep_timeout(timeout 60)
set_tests_properties(python.rl.rollout_generation PROPERTIES TIMEOUT ${timeout} LABELS python
                     ENVIRONMENT "PYTHONPATH=${PROXYEP_PYTHON_DIR};PYTHONDONTWRITEBYTECODE=1")

# python.rl.rollout_loop: RolloutWorker's loop in one process (a one-rank gloo group, the dense
# reference, a MemoryCoordinator called directly): stale leases found by the heartbeat and by a
# refused report are dropped at once; a failing coordinator stops it with an error. About 4 s.
if(rollout_missing)
  proxyep_test_dependency_missing("Python tests: python.rl.rollout_loop not registered (missing: ${rollout_missing})")
else()
  add_test(NAME python.rl.rollout_loop
           COMMAND ${Python_EXECUTABLE} -m pytest -q -p no:cacheprovider --confcutdir=${PROXYEP_RL_TEST_DIR}
                   ${PROXYEP_RL_TEST_DIR}/test_rollout_loop.py)
  set_tests_properties(python.rl.rollout_loop PROPERTIES TIMEOUT ${timeout} LABELS python
                       ENVIRONMENT "PYTHONPATH=${PROXYEP_PYTHON_DIR};PYTHONDONTWRITEBYTECODE=1")
endif()

if(NOT TARGET proxyep)
  list(APPEND rollout_missing "the proxyep CLI target")
endif()
if(rollout_missing)
  proxyep_test_dependency_missing("Python tests: python.rl.rollout_worker and python.rl.rollout_spot not registered "
                 "(missing: ${rollout_missing})")
  return()
endif()
foreach(suite worker spot)
  add_test(NAME python.rl.rollout_${suite}
           COMMAND ${Python_EXECUTABLE} -m pytest -q -p no:cacheprovider --confcutdir=${PROXYEP_RL_TEST_DIR}
                   ${PROXYEP_RL_TEST_DIR}/test_rollout_${suite}.py)
  proxyep_timeout(timeout 180)
  # The worker ranks busy-poll the fabric like the launched suites: not alongside them.
  set_tests_properties(python.rl.rollout_${suite} PROPERTIES TIMEOUT ${timeout} LABELS python
                       ENVIRONMENT
                       "PYTHONPATH=${PROXYEP_PYTHON_DIR};PYTHONDONTWRITEBYTECODE=1;PROXYEP_RL_CLI=$<TARGET_FILE:proxyep>"
                       RESOURCE_LOCK busy_polling_ranks)
endforeach()
