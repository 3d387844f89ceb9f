"""The rendezvous of a Buffer's ranks, set up through their own process group (as DeepEP's
constructor exchanges its setup data with ``dist.all_gather_object``).

Rank 0 of the group picks where the native bootstrap listens and makes a job id and a secret for
this Buffer; ``all_gather_object`` (or mpi4py's ``allgather`` and ``bcast`` with ``comm=``) gives
every rank those and every rank's node. The native bootstrap then connects over TCP, and only
ranks that got the secret through the group can join it.

Nodes: torchrun's layout, node = global rank // LOCAL_WORLD_SIZE on each host (``proxyep launch
--ranks-per-node`` emulates nodes on one host the same way). With ``comm=`` a node is the
communicator's shared-memory domain (``comm.Split_type(MPI.COMM_TYPE_SHARED)``), see
``_mpi_node_key``. The group's ranks must come in equal, contiguous blocks per node
(ranks_per_node); otherwise every rank counts as its own node, which works (everything goes
through the fabric) but slower, and a warning says so. ``ranks_per_node=`` overrides both.
"""

import os
import secrets
import socket
import sys
import uuid
import warnings

from ._proxyep import GroupRendezvous


def _local_world_size():
    value = os.environ.get("LOCAL_WORLD_SIZE")
    return int(value) if value else None


def _global_rank():
    value = os.environ.get("RANK")
    return int(value) if value else 0


def _host_id():
    """This host as the group tells hosts apart: its name and its network namespace. Processes
    in other network namespaces of one machine (containers, the testbed's emulated nodes) share
    the name but not the loopback, so they must not be told to meet at 127.0.0.1."""
    try:
        return f"{socket.gethostname()}@{os.readlink('/proc/self/ns/net')}"
    except OSError:  # no /proc: the name alone
        return socket.gethostname()


def _node_key():
    lws = _local_world_size()
    return (_host_id(), _global_rank() // lws if lws else 0)


def _address_for_peers(all_local, peer_hosts=()):
    """An address of this host that the group's other ranks can reach."""
    if all_local:
        return "127.0.0.1"
    master = os.environ.get("MASTER_ADDR")
    # The interface this host uses towards the master (a UDP connect sends nothing); without
    # one (an MPI job sets no MASTER_ADDR), towards another host of the group: gethostbyname
    # of this host's own name is often a loopback address (Debian's 127.0.1.1).
    targets = [(master, int(os.environ.get("MASTER_PORT", "1")))] if master else []
    # A few other hosts (each may ask DNS) by name, not _host_id's namespace.
    others = sorted({h.split("@")[0] for h in peer_hosts} - {socket.gethostname()})[:3]
    targets += [(host, 1) for host in others]
    for target in targets:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect(target)
                address = s.getsockname()[0]
            if not address.startswith("127."):
                return address
        except OSError:
            pass
    return socket.gethostbyname(socket.gethostname())


def _free_port(address):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def _ranks_per_node(nodes):
    """Ranks per node when the group's ranks form equal, contiguous blocks per node, else None."""
    size = len(nodes)
    block = 1
    while block < size and nodes[block] == nodes[0]:
        block += 1
    if size % block != 0:
        return None
    seen = set()
    for start in range(0, size, block):
        if nodes[start] in seen or any(n != nodes[start] for n in nodes[start : start + block]):
            return None
        seen.add(nodes[start])
    return block


_COMM_METHODS = ("Get_rank", "Get_size", "allgather", "bcast")


def _check_comm(comm):
    """A usable mpi4py intracommunicator, else a clear error (before any collective)."""
    missing = [name for name in _COMM_METHODS if not callable(getattr(comm, name, None))]
    if missing:
        raise TypeError(
            "comm= must be an mpi4py communicator (e.g. mpi4py.MPI.COMM_WORLD) with "
            f"{', '.join(_COMM_METHODS)}; {type(comm).__name__} lacks {', '.join(missing)}"
        )
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and isinstance(comm, mpi.Comm):
        if comm == mpi.COMM_NULL:
            raise ValueError("comm= is MPI.COMM_NULL (this process is not in the communicator)")
        if comm.Is_inter():
            raise ValueError("comm= must be an intracommunicator, not an intercommunicator")


def _mpi_node_key(comm, rank):
    """This rank's node under ``comm=``: (host name, lowest comm rank of its shared-memory domain).

    Why not the environment: LOCAL_WORLD_SIZE and RANK are torchrun's (an MPI launcher does not
    set them, and a stale value would describe another job), and OMPI_COMM_WORLD_LOCAL_SIZE
    (Open MPI only; MPICH has MPI_LOCALNRANKS) counts COMM_WORLD's ranks on the host, which is
    wrong for a sub-communicator (comm.Split) that keeps only some of them. MPI-3's
    Split_type(COMM_TYPE_SHARED) asks the MPI library itself which ranks of *this* communicator
    share memory, on any implementation. A communicator without Split_type (an object with only
    the methods _check_comm asks for) falls back to the host name. ranks_per_node= overrides either (e.g. to
    emulate several nodes on one host)."""
    host = _host_id()
    split_type = getattr(comm, "Split_type", None)
    mpi = sys.modules.get("mpi4py.MPI")
    if split_type is None or mpi is None or not hasattr(mpi, "COMM_TYPE_SHARED"):
        return (host, 0)
    local = split_type(mpi.COMM_TYPE_SHARED, key=rank)
    try:
        leader = local.bcast(rank, root=0)  # key=rank: local rank 0 is the lowest comm rank
    finally:
        local.Free()
    return (host, leader)


def rendezvous(group=None, comm=None, ranks_per_node=None):
    """Collective over ``group`` (a torch.distributed group; None = the default group) or, with
    ``comm`` and no ``group``, an mpi4py intracommunicator (then torch.distributed is not used
    at all; as in DeepEP, ``group`` wins when both are given). Returns the native
    ``GroupRendezvous``."""
    if comm is not None and group is None:
        _check_comm(comm)
        rank, size = comm.Get_rank(), comm.Get_size()

        def gather(obj):
            return comm.allgather(obj)

        def from_root(obj):
            return comm.bcast(obj, root=0)

        def node_key():
            return _mpi_node_key(comm, rank)

    else:
        import torch.distributed as dist

        if not dist.is_initialized():
            raise RuntimeError("deep_ep.Buffer needs torch.distributed initialised (or comm=)")
        rank, size = dist.get_rank(group), dist.get_world_size(group)

        def gather(obj):
            out = [None] * size
            dist.all_gather_object(out, obj, group=group)
            return out

        def from_root(obj):
            return gather(obj)[0]

        node_key = _node_key

    # Two rounds: the first finds the nodes (rank 0 needs them to choose its address).
    nodes = gather(node_key())
    mine = {}
    if rank == 0:
        hosts = [n[0] for n in nodes]
        address = _address_for_peers(all(h == hosts[0] for h in hosts), hosts)
        mine = {
            "address": address,
            "port": _free_port(address),
            "job_id": "deep_ep-" + uuid.uuid4().hex[:16],
            "secret": secrets.token_bytes(32),
        }
    root = from_root(mine)
    if ranks_per_node is None:
        ranks_per_node = _ranks_per_node(nodes)
        if ranks_per_node is None:
            warnings.warn(
                "deep_ep.Buffer: the group's ranks are not in equal contiguous blocks per node; "
                "every rank is treated as its own node (all traffic through the fabric)"
            )
            ranks_per_node = 1
    elif ranks_per_node < 1 or size % ranks_per_node != 0:
        raise ValueError(f"ranks_per_node={ranks_per_node} must divide the group size {size}")
    g = GroupRendezvous()
    g.master_addr = root["address"]
    g.master_port = root["port"]
    g.rank = rank
    g.world_size = size
    g.ranks_per_node = ranks_per_node
    g.job_id = root["job_id"]
    g.secret = root["secret"]
    return g
