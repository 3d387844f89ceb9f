"""What a role takes from its surroundings rather than its command line: the rank variables of
torch's env:// rendezvous (set by torchrun / ``proxyep launch``, or derived from a Kubernetes
indexed Job's JOB_COMPLETION_INDEX), a default worker id, and the shared key.
"""

import os
import socket

from ..coordinator.protocol import RLError


def trainer_rank_environment(environ, world_size):
    """The rank variables to add to ``environ`` (a dict; nothing is changed in place) so that
    ``dist.init_process_group`` finds them. An indexed Job runs one rank per pod and only sets
    JOB_COMPLETION_INDEX: that is the rank, the world size is the config's, and the pod is its own
    node (LOCAL_RANK 0 of LOCAL_WORLD_SIZE 1). MASTER_ADDR and MASTER_PORT must come from the
    deployment (the index-0 pod's stable name); without them the rendezvous would wait forever
    on nothing, so their absence is an error here."""
    added = {}
    if "RANK" not in environ:
        index = environ.get("JOB_COMPLETION_INDEX")
        if index is None and world_size == 1:
            index = "0"  # a single rank needs no launcher
        if index is None:
            raise RLError("trainer: RANK is not set (run it under torchrun, `proxyep launch` or an indexed Job, "
                          "which sets JOB_COMPLETION_INDEX)")
        added.update(RANK=index, LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    added.setdefault("WORLD_SIZE", environ.get("WORLD_SIZE", str(world_size)))
    if int(added["WORLD_SIZE"]) != world_size:
        raise RLError(f"trainer: WORLD_SIZE is {added['WORLD_SIZE']}, the config says trainer.ranks = {world_size}")
    rank = int(added.get("RANK", environ.get("RANK")))
    if not 0 <= rank < world_size:
        raise RLError(f"trainer: rank {rank} is outside the world of {world_size} ranks")
    if world_size == 1:
        added.setdefault("MASTER_ADDR", environ.get("MASTER_ADDR", "127.0.0.1"))
        added.setdefault("MASTER_PORT", environ.get("MASTER_PORT", "29500"))
    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if name not in environ and name not in added]
    if missing:
        raise RLError(f"trainer rank {rank}: {' and '.join(missing)} not set (the rendezvous peer: rank 0's "
                      "address and port)")
    return {k: v for k, v in added.items() if environ.get(k) != v}


def default_worker_id(environ=None):
    """The pod's (or host's) name and the id of the process group of this worker's ranks: under
    ``proxyep launch`` that is the launcher's pid (the ranks' parent), the same on every rank, so
    the ranks agree without talking; a lone process uses its own pid."""
    environ = os.environ if environ is None else environ
    host = environ.get("HOSTNAME") or socket.gethostname()
    pid = os.getppid() if int(environ.get("WORLD_SIZE", "1")) > 1 else os.getpid()
    return f"{host}-{pid}"


def require_authkey(role, environ=None):
    """The trainer's publisher and its subscribers authenticate with PROXYEP_RL_AUTHKEY (hex, the
    same on every machine: a Kubernetes Secret); checked first so a missing key is named, not a
    KeyError deep in start-up."""
    environ = os.environ if environ is None else environ
    key = environ.get("PROXYEP_RL_AUTHKEY", "")
    try:
        if len(bytes.fromhex(key)) < 16:
            raise ValueError("shorter than 16 bytes")
    except ValueError as e:
        raise RLError(f"{role}: PROXYEP_RL_AUTHKEY must hold the run's shared key in hex, at least 16 bytes "
                      f"(e.g. `openssl rand -hex 32`): {e if key else 'not set'}") from None
    return key
