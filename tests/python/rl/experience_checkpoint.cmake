# proxyep.rl.train.experience (admission control with the staleness bound as a hypothesis property,
# pop order, eviction, the DAPO filter, deadlines, threads, snapshot/restore; ~12 s here) and
# proxyep.rl.train.checkpoint over a directory and over S3 through a real s3rver on loopback
# (s3_server.py here), with a writer SIGKILLed half-way (~12 s). One process each (plus the
# children they start).
execute_process(COMMAND ${Python_EXECUTABLE} -c "import hypothesis"
                RESULT_VARIABLE rl_hypothesis OUTPUT_QUIET ERROR_QUIET)
if(rl_hypothesis EQUAL 0)
  add_test(NAME python.rl.experience
           COMMAND ${Python_EXECUTABLE} -m pytest -q -p no:cacheprovider --confcutdir=${PROXYEP_RL_TEST_DIR}
                   ${PROXYEP_RL_TEST_DIR}/test_experience.py)
  proxyep_timeout(timeout 180)
  set_tests_properties(python.rl.experience PROPERTIES TIMEOUT ${timeout} LABELS python
                       ENVIRONMENT "PYTHONPATH=${PROXYEP_PYTHON_DIR};PYTHONDONTWRITEBYTECODE=1")
else()
  proxyep_test_dependency_missing("Python tests: python.rl.experience not registered (${Python_EXECUTABLE} cannot import "
                 "hypothesis: python3-hypothesis, scripts/install-deps.sh)")
endif()

execute_process(COMMAND ${Python_EXECUTABLE} -c "import boto3"
                RESULT_VARIABLE rl_boto3 OUTPUT_QUIET ERROR_QUIET)
if(rl_boto3 EQUAL 0)
  add_test(NAME python.rl.checkpoint
           COMMAND ${Python_EXECUTABLE} -m pytest -q -p no:cacheprovider -rs --confcutdir=${PROXYEP_RL_TEST_DIR}
                   ${PROXYEP_RL_TEST_DIR}/test_checkpoint.py)
  proxyep_timeout(timeout 180)
  set_tests_properties(python.rl.checkpoint PROPERTIES TIMEOUT ${timeout} LABELS python
                       ENVIRONMENT "PYTHONPATH=${PROXYEP_PYTHON_DIR}:${PROXYEP_RL_TEST_DIR};PYTHONDONTWRITEBYTECODE=1")
  if(NOT EXISTS ${PROXYEP_RL_TEST_DIR}/s3/node_modules/.bin/s3rver)
    proxyep_test_dependency_missing("Python tests: python.rl.checkpoint skips its S3 cases (s3rver is not installed: run "
                   "scripts/install-deps.sh, which runs npm ci --prefix tests/python/rl/s3)")
  endif()
else()
  proxyep_test_dependency_missing("Python tests: python.rl.checkpoint not registered (${Python_EXECUTABLE} cannot import "
                 "boto3: python3-boto3, scripts/install-deps.sh)")
endif()
