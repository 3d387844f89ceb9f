"""The rendezvous of a Buffer's ranks, set up through their own process group (as DeepEP's
constructor exchanges its setup data with ``dist.all_gather_object``).

Rank 0 of the group picks where the native bootstrap listens and makes a job id and a secret for
this Buffer; one ``all_gather_object`` (or mpi4py's ``allgather`` with ``comm=``) gives every rank
those and every rank's node. The native bootstrap then connects over TCP, and only ranks that
got the secret through the group can join it.

Nodes: torchrun's layout, node = global rank // LOCAL_WORLD_SIZE on each host (``proxyep launch
--ranks-per-node`` emulates nodes on one host the same way). The group's ranks must come in
equal, contiguous blocks per node (ranks_per_node); otherwise every rank counts as its own node,
which works (everything goes through the fabric) but slower, and a warning says so.
"""

import os
import secrets
import socket
import uuid
import warnings

from ._proxyep import GroupRendezvous


def _local_world_size():
    value = os.environ.get("LOCAL_WORLD_SIZE")
    return int(value) if value else None


def _global_rank():
    value = os.environ.get("RANK")
    return int(value) if value else 0


def _node_key():
    lws = _local_world_size()
    return (socket.gethostname(), _global_rank() // lws if lws else 0)


def _address_for_peers(all_local):
    """An address of this host that the group's other ranks can reach."""
    if all_local:
        return "127.0.0.1"
    master = os.environ.get("MASTER_ADDR")
    if master:
        # The interface this host uses towards the master (a UDP connect sends nothing).
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((master, int(os.environ.get("MASTER_PORT", "1"))))
                return s.getsockname()[0]
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


def rendezvous(group=None, comm=None, ranks_per_node=None):
    """Collective over ``group`` (a torch.distributed group; None = the default group) or, with
    ``comm``, an mpi4py communicator. Returns the native ``GroupRendezvous``."""
    if comm is not None and group is None:
        rank, size = comm.Get_rank(), comm.Get_size()

        def gather(obj):
            return comm.allgather(obj)

    else:
        import torch.distributed as dist

        if not dist.is_initialized():
            raise RuntimeError("deep_ep.Buffer needs torch.distributed initialised (or comm=)")
        rank, size = dist.get_rank(group), dist.get_world_size(group)

        def gather(obj):
            out = [None] * size
            dist.all_gather_object(out, obj, group=group)
            return out

    # Two rounds: the first finds the nodes (rank 0 needs them to choose its address).
    nodes = gather(_node_key())
    mine = {}
    if rank == 0:
        address = _address_for_peers(all(n[0] == nodes[0][0] for n in nodes))
        mine = {
            "address": address,
            "port": _free_port(address),
            "job_id": "deep_ep-" + uuid.uuid4().hex[:16],
            "secret": secrets.token_bytes(32),
        }
    root = gather(mine)[0]
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
