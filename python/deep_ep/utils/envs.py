"""DeepEP 2.x's domain sizes of a group (``deep_ep.utils.envs``), without NCCL.

Physical: ``(num_rdma_ranks, num_nvlink_ranks)`` = (nodes, ranks per node). Logical:
``(num_scaleout_ranks, num_scaleup_ranks)``, the split ElasticBuffer's hybrid mode works in: the
physical one when hybrid mode is allowed and the group spans nodes, else one domain of all ranks.

Nodes follow the rule ``deep_ep.Buffer`` uses (``proxyep.rendezvous``): torchrun's layout, node =
global rank // LOCAL_WORLD_SIZE, and the group's ranks must form equal, contiguous blocks per node,
else every rank is its own node. Here that is read from the group's global ranks, with no
collective (DeepEP's functions may be called by one rank alone); a Buffer's methods answer from
the layout its ranks agreed on instead.
"""

import os

import torch
import torch.distributed as dist

from proxyep._group import _ranks_per_node


def _group_ranks(group):
    group = dist.group.WORLD if group is None else group
    return dist.get_process_group_ranks(group)


def ranks_per_node_of_group(group):
    """Ranks per node of ``group`` by the rule above (1 when its ranks are not in node blocks)."""
    ranks = _group_ranks(group)
    local = os.environ.get("LOCAL_WORLD_SIZE")
    if not local:
        return len(ranks)  # no layout given: one host, one node (as the rendezvous's host key)
    return _ranks_per_node([r // int(local) for r in ranks]) or 1


def physical_domain_size(num_ranks, ranks_per_node):
    return num_ranks // ranks_per_node, ranks_per_node


def logical_domain_size(num_ranks, ranks_per_node, allow_hybrid_mode):
    nodes = num_ranks // ranks_per_node
    if allow_hybrid_mode and nodes > 1:
        return nodes, ranks_per_node
    return 1, num_ranks


def get_physical_domain_size(group):
    """``(num_rdma_ranks, num_nvlink_ranks)`` of ``group``: (nodes, ranks per node)."""
    return physical_domain_size(len(_group_ranks(group)), ranks_per_node_of_group(group))


def get_logical_domain_size(group, allow_hybrid_mode=True):
    """``(num_scaleout_ranks, num_scaleup_ranks)`` of ``group``."""
    return logical_domain_size(len(_group_ranks(group)), ranks_per_node_of_group(group), allow_hybrid_mode)


def check_torch_deterministic():
    """DeepEP's check that torch's deterministic algorithms do not also fill uninitialised memory
    (a fill kernel could race its communication stream). Torch without the setting passes."""
    deterministic = getattr(torch.utils, "deterministic", None)
    fill = getattr(deterministic, "fill_uninitialized_memory", False)
    assert not (torch.are_deterministic_algorithms_enabled() and fill), (
        "torch deterministic algorithms with fill_uninitialized_memory are not supported")
