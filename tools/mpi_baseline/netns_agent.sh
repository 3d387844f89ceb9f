#!/bin/sh
# proxyep-netns-agent HOST WORDS...: Open MPI's remote-shell agent (plm_rsh_agent) for the MPI
# baseline on the testbed (docs/TESTBED.md). HOST is an emulated node's network namespace; the
# words are the daemon's command line as mpirun writes it for a remote shell. Runs it inside the
# namespace with a hostname of its own (a UTS namespace): Open MPI names its shared-memory
# segments after the hostname, so two nodes sharing one would open each other's and crash.
host=$1
shift
if [ ! -e "/run/netns/$host" ]; then
  echo "proxyep-netns-agent: network namespace '$host' does not exist (/run/netns/$host)" >&2
  exit 1
fi
exec ip netns exec "$host" unshare --uts -- sh -c "hostname '$host' && exec $*"
