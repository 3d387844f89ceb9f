# Suites whose tools are not Debian build dependencies (Python packages, redis-server, node, Open
# MPI) register only where those are installed. A quiet "not registered" would let a whole suite
# vanish from a green run, so where every test must run -- CI (CI=true) and scripts/test.sh
# (PROXYEP_REQUIRE_ALL_TESTS=1) -- a missing one stops the configure, naming it. Elsewhere (a
# developer's partial install) it is a warning. The environment is read at each configure.
function(proxyep_test_dependency_missing)
  string(CONCAT what ${ARGN})
  if("$ENV{CI}" STREQUAL "true" OR "$ENV{PROXYEP_REQUIRE_ALL_TESTS}" STREQUAL "1")
    message(FATAL_ERROR "${what}\nEvery test must be registered here (CI=true or "
                        "PROXYEP_REQUIRE_ALL_TESTS=1): install what is missing "
                        "(scripts/install-deps.sh) and configure again.")
  else()
    message(WARNING "${what}")
  endif()
endfunction()
