# The roles as programs of their own (python3 -m proxyep.rl coordinator | trainer | worker;
# python/proxyep/rl/roles, deploy/kubernetes/rl):
# python.rl.roles: their logic without a run (rank variables of an indexed Job, the trainer's and
# the worker's arguments, flags.json against the parsers, the publisher's announcement in a real
# redis-server, the coordinator role stopped by SIGTERM); about 10 s.
# python.rl.roles_run: a coordinator, a worker started before the trainer (finds the publisher
# through the store), a one-rank trainer; a worker whose trainer never comes; SIGTERM drains the
# worker; the trainer started again resumes from its checkpoint. About 30 s.
if(NOT EXISTS /usr/bin/redis-server)
  proxyep_test_dependency_missing("Python tests: python.rl.roles* not registered (missing: /usr/bin/redis-server)")
  return()
endif()
foreach(suite roles roles_run)
  add_test(NAME python.rl.${suite}
           COMMAND ${Python_EXECUTABLE} -m pytest -q -p no:cacheprovider --confcutdir=${PROXYEP_RL_TEST_DIR}
                   ${PROXYEP_RL_TEST_DIR}/test_rl_${suite}.py)
endforeach()
proxyep_timeout(roles_timeout 120)
proxyep_timeout(roles_run_timeout 300)
set_tests_properties(python.rl.roles PROPERTIES TIMEOUT ${roles_timeout} LABELS python
                     ENVIRONMENT "PYTHONPATH=${PROXYEP_PYTHON_DIR}:${PROXYEP_RL_TEST_DIR};PYTHONDONTWRITEBYTECODE=1")
# The roles' weight transfer polls the fabric: not alongside the other launched suites.
set_tests_properties(python.rl.roles_run PROPERTIES TIMEOUT ${roles_run_timeout} LABELS python
                     ENVIRONMENT "PYTHONPATH=${PROXYEP_PYTHON_DIR}:${PROXYEP_RL_TEST_DIR};PYTHONDONTWRITEBYTECODE=1"
                     RESOURCE_LOCK busy_polling_ranks)
