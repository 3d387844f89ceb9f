# proxyep.rl.grpo (advantages, the clipped surrogate, k3 KL, aggregation) against a direct scalar
# computation, and the addition task's reward. One process, about 2 s.
add_test(NAME python.rl.grpo
         COMMAND ${Python_EXECUTABLE} -m pytest -q -p no:cacheprovider --confcutdir=${PROXYEP_RL_TEST_DIR}
                 ${PROXYEP_RL_TEST_DIR}/test_grpo.py)
proxyep_timeout(timeout 60)
set_tests_properties(python.rl.grpo PROPERTIES TIMEOUT ${timeout} LABELS python
                     ENVIRONMENT "PYTHONPATH=${PROXYEP_PYTHON_DIR};PYTHONDONTWRITEBYTECODE=1")
