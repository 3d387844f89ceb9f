# proxyep.rl.train.grpo (advantages, the clipped surrogate, k3 KL, aggregation) against a direct
# scalar computation, and the addition task's reward (train/tasks.py). One process, about 2 s.
add_test(NAME python.rl.grpo
         COMMAND ${Python_EXECUTABLE} -m pytest -q -p no:cacheprovider --confcutdir=${PROXYEP_RL_TEST_DIR}
                 ${PROXYEP_RL_TEST_DIR}/test_grpo.py)
proxyep_timeout(timeout 60)
set_tests_properties(python.rl.grpo PROPERTIES TIMEOUT ${timeout} LABELS python
                     ENVIRONMENT "PYTHONPATH=${PROXYEP_PYTHON_DIR};PYTHONDONTWRITEBYTECODE=1")
# GRPOTrainer's EP step against the dense reference's gradient of the global token-mean loss:
# 2 ranks on one node, and 2 "nodes" over TCP with the reorder shim. About 3 s each.
proxyep_add_python_test(rl.grpo_trainer.2ranks test_grpo_trainer.py 2 2 60)
proxyep_add_python_test(rl.grpo_trainer.2ranks.2nodes test_grpo_trainer.py 2 1 60
                        PROXYEP_FABRIC_PROVIDER=tcp PROXYEP_FABRIC_REORDER=1)
# `proxyep rl ...` hands every argument to python3 -m proxyep.rl (tools/cmd_rl.cpp): its own
# --config reaches the run's validation, which refuses the bad value before anything starts.
add_test(NAME cli.rl_handover COMMAND $<TARGET_FILE:proxyep> rl run --config "{\"grpo\": {\"group_size\": 0}}")
set_tests_properties(cli.rl_handover PROPERTIES TIMEOUT 60 LABELS python
                     PASS_REGULAR_EXPRESSION "rl run: run config: grpo.group_size must be a positive integer, got 0")
