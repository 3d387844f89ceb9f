# python3 -m proxyep.bench rl (proxyep/rl/bench_rl.py): --quick end to end with one repeat (4 real
# GRPO runs of 4 iterations: ProxyEP and the a2a baseline, a preempted configuration, 1 and 2
# workers), its JSON recomputed from the runs' own files, the report and the PNGs checked; the
# figures over several repeats on made-up runs; bad options refused (the four invocations started
# together); a run past its deadline fails the benchmark. About 75 s here: each quick run starts a
# trainer and its workers as `proxyep launch` jobs (~11 s, mostly their Python/torch start-ups),
# the deadline case ~20 s. Needs the proxyep CLI and matplotlib (python3-matplotlib).
if(NOT TARGET proxyep)
  proxyep_test_dependency_missing("Python tests: python.rl.bench_rl not registered (the proxyep CLI is not built)")
  return()
endif()
execute_process(COMMAND ${Python_EXECUTABLE} -c "import matplotlib"
                RESULT_VARIABLE bench_rl_matplotlib OUTPUT_QUIET ERROR_QUIET)
if(NOT bench_rl_matplotlib EQUAL 0)
  proxyep_test_dependency_missing("Python tests: python.rl.bench_rl not registered (no matplotlib: python3-matplotlib, "
                 "scripts/install-deps.sh)")
  return()
endif()
add_test(NAME python.rl.bench_rl
         COMMAND ${Python_EXECUTABLE} -m pytest -q -p no:cacheprovider --confcutdir=${PROXYEP_RL_TEST_DIR}
                 ${PROXYEP_RL_TEST_DIR}/test_bench_rl.py)
proxyep_timeout(timeout 900)
set_tests_properties(python.rl.bench_rl PROPERTIES TIMEOUT ${timeout} LABELS python
                     ENVIRONMENT "PYTHONPATH=${PROXYEP_PYTHON_DIR};PYTHONDONTWRITEBYTECODE=1;PROXYEP_RL_CLI=$<TARGET_FILE:proxyep>"
                     RESOURCE_LOCK busy_polling_ranks)
