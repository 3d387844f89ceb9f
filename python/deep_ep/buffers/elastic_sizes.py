"""Sizes for ElasticBuffer: DeepEP 2.1's buffer size hints over ProxyEP's own hints, and how one
``num_bytes`` becomes the V1 Buffer's NVL and RDMA parts.

DeepEP's V2 buffer is one region of ``num_bytes`` (2 MiB aligned). ProxyEP's Buffer has an NVL
part (where node peers' rows land) and, across nodes, an RDMA part (rows staged for other
nodes). Calls stream through both in chunks, so any size works; these hints give sizes that hold
a whole call, as DeepEP's do.
"""

import math

import proxyep

from ..utils.math import align

#: DeepEP's V2 buffer alignment (its ``get_elastic_buffer_alignment()``).
BUFFER_ALIGNMENT = 2 << 20
#: DeepEP's top-k assumed when a size hint gets ``num_topk=0``.
DEFAULT_TOPK = 32
#: The least either part of a split gets (as the V1 Buffer's staging floor).
MIN_PART_BYTES = 1 << 20
#: Entries of Engram's storage and PP's tensors are padded to 32 bytes (DeepEP's LDG.256).
ENTRY_ALIGNMENT = 32


def buffer_size_hint(num_ranks, ranks_per_node, num_max_tokens_per_rank, hidden, num_topk=0,
                     use_fp8_dispatch=False):
    """Bytes that hold a whole dispatch of these settings (NVL part, plus the RDMA part when
    the ranks span nodes), rounded up to 2 MiB. Without a hidden size: the alignment alone."""
    if hidden <= 0:
        return BUFFER_ALIGNMENT
    hidden_bytes = hidden * (1 if use_fp8_dispatch else 2)  # the scales are counted by the hint
    topk = num_topk if num_topk > 0 else DEFAULT_TOPK
    tokens = max(num_max_tokens_per_rank, 1)
    total = proxyep.nvl_bytes_hint(tokens, hidden_bytes, topk, num_ranks)
    if num_ranks > ranks_per_node:
        total += proxyep.rdma_bytes_hint(tokens, hidden_bytes, topk, num_ranks, ranks_per_node)
    return align(total, BUFFER_ALIGNMENT)


def split_bytes(num_bytes, num_nodes):
    """(num_nvl_bytes, num_rdma_bytes) of a V1 Buffer for ``num_bytes``: all of it NVL on one
    node; half each across nodes, neither under 1 MiB."""
    if num_nodes <= 1:
        return max(num_bytes, MIN_PART_BYTES), 0
    half = max(num_bytes // 2, MIN_PART_BYTES)
    return half, half


def engram_storage_size_hint(num_entries, hidden, num_max_tokens_per_rank, element_size):
    """(GPU bytes for a fetch's received rows, CPU bytes for the storage), each 2 MiB aligned."""
    entry = align(hidden * element_size, ENTRY_ALIGNMENT)
    return (align(entry * num_max_tokens_per_rank, BUFFER_ALIGNMENT),
            align(entry * num_entries, BUFFER_ALIGNMENT))


def pp_buffer_size_hint(num_max_tensor_bytes, num_max_inflight_tensors):
    """A send and a receive area, each for the previous and the next rank of the ring."""
    tensor = align(num_max_tensor_bytes, ENTRY_ALIGNMENT)
    return align(tensor * num_max_inflight_tensors * 2 * 2, BUFFER_ALIGNMENT)


def agrs_num_max_session_bytes(num_ranks, shapes, element_size):
    """Bytes one AG-RS session gathers: every rank's copy of each tensor, each padded to 32."""
    if not isinstance(shapes[0], (tuple, list)):
        shapes = (shapes,)
    return sum(align(num_ranks * math.prod(shape) * element_size, ENTRY_ALIGNMENT) for shape in shapes)


def agrs_buffer_size_hint(num_max_session_bytes):
    return align(num_max_session_bytes, BUFFER_ALIGNMENT)
