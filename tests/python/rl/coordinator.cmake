# proxyep.rl's rollout coordinator: the same suite against MemoryCoordinator, RedisCoordinator on
# a real redis-server started by the tests on loopback, and a MemoryCoordinator in another
# process behind the RPC service (test_coordinator.py, ~5 s here); the hypothesis state machine
# of random worker runs against the three (test_coordinator_property.py, ~20 s); the service's
# deadlines, authentication and threads (test_coordinator_service.py, ~6 s); coordinator and
# redis-server restarts (test_coordinator_restart.py, ~4 s). One process each, plus the
# redis-server and service processes they start and stop.
execute_process(COMMAND ${Python_EXECUTABLE} -c "import redis, hypothesis, pytest"
                RESULT_VARIABLE rl_coordinator_deps OUTPUT_QUIET ERROR_QUIET)
if(NOT rl_coordinator_deps EQUAL 0)
  proxyep_test_dependency_missing("Python tests: python.rl.coordinator* not registered (${Python_EXECUTABLE} cannot import "
                 "redis, hypothesis and pytest: python3-redis, python3-hypothesis, python3-pytest)")
elseif(NOT EXISTS /usr/bin/redis-server)
  proxyep_test_dependency_missing("Python tests: python.rl.coordinator* not registered (/usr/bin/redis-server is missing: "
                 "the Debian package redis-server)")
else()
  foreach(suite coordinator coordinator_property coordinator_service coordinator_restart)
    add_test(NAME python.rl.${suite}
             COMMAND ${Python_EXECUTABLE} -m pytest -q -p no:cacheprovider --confcutdir=${PROXYEP_RL_TEST_DIR}
                     ${PROXYEP_RL_TEST_DIR}/test_${suite}.py)
    proxyep_timeout(timeout 180)
    set_tests_properties(python.rl.${suite} PROPERTIES TIMEOUT ${timeout} LABELS python
                         ENVIRONMENT "PYTHONPATH=${PROXYEP_PYTHON_DIR}:${PROXYEP_RL_TEST_DIR};PYTHONDONTWRITEBYTECODE=1")
  endforeach()
endif()
