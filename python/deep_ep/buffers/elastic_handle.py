"""EPHandle: DeepEP 2.1's dispatch handle (non-expanded layout). Its fields come with the native
dispatch (``Buffer.elastic_dispatch``, integrations/elastic/elastic_dispatch.hpp), computed in C++
from what the normal-mode dispatch knows; what each holds (docs/plans/ELASTIC_BUFFER.md, 1.7):

- ``psum_num_recv_tokens_per_scaleup_rank`` (i32 ``[num_scaleup_ranks]``): inclusive prefix sum
  of the tokens received from the source ranks congruent to each scale-up peer, a token once per
  rank. Our rows stay in source-rank order, not grouped by peer.
- ``num_unaligned_recv_tokens_per_expert`` (i32 ``[E_local]``) and
  ``psum_num_recv_tokens_per_expert`` (inclusive prefix sum of the counts aligned to
  ``expert_alignment``): from the notify phase's per-expert counts.
- ``recv_src_metadata`` (i32 ``[rows, K + 2]``): column 0 the row's global source id
  ``src_rank * num_max_tokens_per_rank + src_token``; column 1 ``src_rank * K + its first local
  lane`` (DeepEP's column is internal: a stable stand-in); columns 2.. the expanded slots, -1 in
  the non-expanded layout. Rows past the received ones (worst-case outputs) are -1.
- ``dst_buffer_slot_idx`` (i32 ``[N, K]``): the row lane k's token takes among those sent to the
  rank owning lane k's expert (the send head), -1 for -1 lanes and for a rank repeated by a later
  lane (DeepEP's is internal too).

``recv_src_metadata`` depends on rows that an ``async_with_compute_stream`` dispatch is still
receiving when it returns: it is computed when the event is waited for (a hook after the wait),
or when first read, whichever comes first (reading waits for the call). Either way it is complete
before any use that DeepEP allows (after the event's wait). Every field is computed on the host
(with device tensors, from host copies of what it reads) and moved to the tensors' device when
first read.
"""

from proxyep._tensors import tensor

from ..utils.math import align


#: Which field of the native call's ElasticFields (``ElasticFields.take``) each is.
PSUM_SCALEUP, PSUM_EXPERT, UNALIGNED, SLOTS, METADATA, ORDER, WEIGHT_OWNER = range(7)


class Native:
    """A field still in the native call's ElasticFields, made a torch tensor on ``device`` when
    first read: a dispatch then costs no conversion (nor capsule) of fields nobody reads."""

    __slots__ = ("source", "which", "device")

    def __init__(self, source, which, device):
        self.source, self.which, self.device = source, which, device

    def tensor(self):
        t = tensor(self.source.take(self.which))
        return t if t.device == self.device else t.to(self.device)


class EPHandle:
    """DeepEP's EPHandle: a dispatch's routing, for combine and cached dispatch. Plain, writable
    attributes, as DeepEP's (its test overwrites ``recv_src_metadata``)."""

    def __init__(self, do_expand, num_experts, expert_alignment, num_max_tokens_per_rank, num_sms,
                 topk_idx, num_recv_tokens, num_expanded_tokens, num_recv_tokens_per_expert_list,
                 psum_num_recv_tokens_per_scaleup_rank, psum_num_recv_tokens_per_expert,
                 num_unaligned_recv_tokens_per_expert, recv_src_metadata, dst_buffer_slot_idx,
                 token_metadata_at_forward, channel_linked_list):
        assert topk_idx is not None
        self.do_expand = do_expand
        self.num_experts = num_experts
        self.expert_alignment = expert_alignment
        self.num_max_tokens_per_rank = num_max_tokens_per_rank
        self.num_sms = num_sms
        self.topk_idx = topk_idx
        self.num_recv_tokens = num_recv_tokens
        self.num_expanded_tokens = num_expanded_tokens
        self.num_recv_tokens_per_expert_list = num_recv_tokens_per_expert_list
        self._pending = None  # set before the fields below, whose properties read it
        self.psum_num_recv_tokens_per_scaleup_rank = psum_num_recv_tokens_per_scaleup_rank
        self.psum_num_recv_tokens_per_expert = psum_num_recv_tokens_per_expert
        self.num_unaligned_recv_tokens_per_expert = num_unaligned_recv_tokens_per_expert
        self.recv_src_metadata = recv_src_metadata
        self.dst_buffer_slot_idx = dst_buffer_slot_idx
        self.token_metadata_at_forward = token_metadata_at_forward  # hybrid channels: none here
        self.channel_linked_list = channel_linked_list
        self.cached_recv_src_metadata_before_sort = None
        # ProxyEP's: the native normal-mode handle (combine and cached dispatch run on it), the
        # Buffer that made it, and the received top-k indices a cached dispatch returns again.
        self._native = None
        self._owner = None
        self._recv_topk_idx = None

    def deterministic_sort(self, do_cpu_sync, is_cached_dispatch, recv_x, recv_sf, recv_topk_idx,
                           recv_topk_weights, channel_linked_list):
        """DeepEP sorts received rows by source id here. ProxyEP receives them in that order
        already (source rank, then source token), so there is nothing to do."""

    def _complete(self):
        """Compute the row-dependent fields now, if a dispatch still owes them (idempotent)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending()

    def _combine_tables(self):
        """(order, weight_owner) of V2's combine (None, None: V1's order), as tensors."""
        self._order_tables = tuple(t.tensor() if isinstance(t, Native) else t for t in self._order_tables)
        return self._order_tables


def _field(name, row_dependent=False):
    """A field held as the native call returned it until read (Native); a row-dependent one
    (which an async dispatch fills once its rows are in) is completed first."""
    private = "_" + name

    def get(handle):
        if row_dependent:
            handle._complete()
        value = getattr(handle, private)
        if isinstance(value, Native):
            value = value.tensor()
            setattr(handle, private, value)
        return value

    def set_(handle, value):
        setattr(handle, private, value)

    return property(get, set_, doc=f"{name} (made a tensor when first read)")


for _name in ("psum_num_recv_tokens_per_scaleup_rank", "psum_num_recv_tokens_per_expert",
              "num_unaligned_recv_tokens_per_expert", "dst_buffer_slot_idx"):
    setattr(EPHandle, _name, _field(_name))
EPHandle.recv_src_metadata = _field("recv_src_metadata", row_dependent=True)


def worst_case_tokens(num_ranks, num_max_tokens_per_rank):
    """Rows of a dispatch's outputs without CPU sync: every rank's every token."""
    return num_ranks * num_max_tokens_per_rank


def worst_case_expanded_tokens(num_ranks, num_max_tokens_per_rank, num_topk, num_local_experts,
                               expert_alignment):
    """DeepEP's expanded-layout bound without CPU sync (each token in min(K, E_local) local
    slots, plus each expert's alignment gap), recorded in the handle."""
    slots = num_ranks * num_max_tokens_per_rank * min(num_topk, num_local_experts)
    return align(slots + (expert_alignment - 1) * num_local_experts, expert_alignment)
