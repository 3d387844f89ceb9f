"""deep_ep.ElasticBuffer: DeepEP 2.1's V2 Buffer, with its constructor, attributes, methods,
argument lists and return tuples, over ProxyEP's native Buffer (the one ``buffers/legacy.py``'s
V1 Buffer opens).

What runs, with CPU tensors, device tensors (CUDA) and the host-simulated device alike:
dispatch and combine in the non-expanded and the expanded layout (``do_expand``, with
``do_zero_padding``: the rows are copied into their slots and folded back by the Buffer's backend
for the memory they are in), fresh and cached (``topk_weights`` again included), BF16 or FP8 with
scales (row- or column-major received scales), worst-case outputs without CPU sync, cumulative
expert statistics, combine biases, async calls; the size hints, domain sizes, barrier, capture,
comm stream and destroy. A fresh dispatch is one native call (``Buffer.elastic_dispatch``: the
layout, the dispatch and the handle's fields in C++, integrations/elastic/; with device tensors
the fields are computed from host copies of what they read), a combine V1's native combine, so
V2 costs what V1 does (``python3 -m proxyep.bench ep --api v2``). Combine reduces in DeepEP V2's
order (biases first, then ranks' rows or nodes' partials by each token's last top-k lane; weight
lane k from its owner), from host tables the dispatch computes once.

Refused with ``ProxyEPError`` naming the argument or method, before anything is sent (the Buffer
stays usable): Engram (``num_cpu_bytes > 0`` and its methods), pipeline-parallel send/receive
and AG-RS. The expanded layout without multiple reduction combines each slot at home
(``_combine_slots``).

Stand-ins for DeepEP's hardware knobs (section 4 of the plan): SM and QP counts are computed as
DeepEP's interface promises and recorded, never used (ProxyEP's fabric has no per-call QPs);
``sl_idx`` is validated and stored; ``deterministic`` is accepted (rows already arrive sorted by
source); ``num_cpu_timeout_secs`` bounds this Buffer's host waits (``num_gpu_timeout_secs`` is
stored, device waits keeping ProxyEP's ``ep.timeout_ms``); ``allow_hybrid_mode`` picks hierarchical
internode (DeepEP's hybrid mode) or per_rank (its direct mode) for this Buffer.
"""

import contextlib
import os

import torch

import proxyep
from proxyep import _proxyep
from proxyep._tensors import FP8_DTYPE, tensor, view

from ..utils.envs import (
    check_torch_deterministic,
    logical_domain_size,
    physical_domain_size,
    ranks_per_node_of_group,
)
from ..utils.event import EventHandle, EventOverlap
from ..utils.math import align
from . import elastic_handle as fields
from . import elastic_sizes as sizes
from .elastic_handle import EPHandle
from .legacy import Buffer, _biases, _event, _small

__all__ = ["ElasticBuffer", "EPHandle"]

#: QPs DeepEP allocates when ``num_allocated_qps=0``: direct mode, and hybrid mode on NICs
#: without fast atomics (no NIC to probe here).
_DIRECT_QPS, _HYBRID_QPS = 17, 129
#: Received FP8 scales in DeepEP's TMA-aligned column-major layout: rows padded to 4 packs.
_TMA_ALIGNED_SF_ROWS = 4
#: DeepEP's SM floor when the caller does not prefer overlapping with compute.
_MIN_SMS_WITHOUT_OVERLAP = 64
#: Where the combine order tables live, whichever memory the calls' tensors are in.
_HOST = torch.device("cpu")


def _unsupported(what, why="not yet supported by ProxyEP"):
    return proxyep.ProxyEPError(f"{what} is {why}")


def _internode(ranks, ranks_per_node, allow_hybrid_mode):
    """How this Buffer's calls cross nodes: DeepEP's hybrid mode (a token once per node, forwarded
    and reduced inside the node) is our hierarchical internode; its direct mode our per_rank.
    Hybrid needs several nodes of several ranks each, all equal."""
    hybrid = (allow_hybrid_mode and 1 < ranks_per_node < ranks and ranks % ranks_per_node == 0)
    return "hierarchical" if hybrid else "per_rank"


def _event_handle(event, name):
    """V2 passes events as EventHandle (``capture()``); an EventOverlap is taken too."""
    if event is None or isinstance(event, EventHandle):
        return event
    if isinstance(event, EventOverlap):
        return event.event
    raise TypeError(f"{name} must be an EventHandle (ElasticBuffer.capture()) or None, "
                    f"got {type(event).__name__}")


def _wait_before_call(event):
    """``previous_event_before_epilogue``: our call has no epilogue of its own, so the event is
    waited for before the call, on the host (conservative)."""
    if event is None:
        return
    event.current_stream_wait()
    if event.torch_event is not None:
        event.torch_event.synchronize()


class ElasticBuffer:
    """DeepEP 2.1's ElasticBuffer: expert-parallel dispatch and combine over ``group``."""

    def __init__(self, group, num_bytes=None, num_cpu_bytes=0, num_max_tokens_per_rank=0, hidden=0,
                 num_topk=0, use_fp8_dispatch=False, deterministic=False, allow_hybrid_mode=True,
                 allow_multiple_reduction=True, prefer_overlap_with_compute=True, sl_idx=3,
                 num_allocated_qps=0, num_cpu_timeout_secs=300, num_gpu_timeout_secs=100,
                 explicitly_destroy=False, *, ranks_per_node=None, device=None):
        """Collective over ``group`` (any torch.distributed group, gloo included). ProxyEP only:
        ``ranks_per_node`` and ``device`` as ``deep_ep.Buffer``'s. Refusals come before any
        collective, on every rank alike."""
        self.runtime = None  # for __del__ and destroy() if the checks below refuse
        if num_cpu_bytes:
            raise _unsupported("num_cpu_bytes > 0 (Engram's CPU storage)", "not supported by ProxyEP")
        if "EP_OVERRIDE_RDMA_SL" in os.environ:
            sl_idx = int(os.environ["EP_OVERRIDE_RDMA_SL"])
        if not 0 <= sl_idx <= 15:
            raise ValueError(f"sl_idx must be an RDMA service level in 0..15, got {sl_idx}")
        if num_bytes is not None and (not isinstance(num_bytes, int) or num_bytes < 0):
            raise ValueError(f"num_bytes must be None or a non-negative int, got {num_bytes!r}")
        if num_max_tokens_per_rank < 0:
            raise ValueError(f"num_max_tokens_per_rank must be >= 0, got {num_max_tokens_per_rank}")

        group_size = (group.size() if group is not None else torch.distributed.get_world_size())
        layout_rpn = ranks_per_node if ranks_per_node is not None else ranks_per_node_of_group(group)
        if num_bytes is None:
            num_bytes = sizes.buffer_size_hint(group_size, layout_rpn, num_max_tokens_per_rank,
                                               hidden, num_topk, use_fp8_dispatch)
        num_bytes = align(max(num_bytes, 1), sizes.BUFFER_ALIGNMENT)
        nvl_bytes, rdma_bytes = sizes.split_bytes(num_bytes, group_size // layout_rpn)

        if num_allocated_qps == 0:
            num_allocated_qps = _HYBRID_QPS if allow_hybrid_mode else _DIRECT_QPS

        # Without multiple reduction a token's rows are reduced once, at home: no node stage.
        internode = _internode(group_size, layout_rpn, allow_hybrid_mode and allow_multiple_reduction)
        self._reduces_by_node = internode == "hierarchical"
        if num_cpu_timeout_secs <= 0:
            raise ValueError(f"num_cpu_timeout_secs must be positive, got {num_cpu_timeout_secs}")
        self._legacy = Buffer(group, num_nvl_bytes=nvl_bytes, num_rdma_bytes=rdma_bytes,
                              explicitly_destroy=explicitly_destroy, ranks_per_node=ranks_per_node,
                              device=device,
                              internode=internode,
                              timeout_ms=int(num_cpu_timeout_secs * 1000))
        self.runtime = self._legacy.runtime
        self.nccl_comm_handle = None  # no NCCL underneath
        self.group = group
        self.rank_idx = self._legacy.rank
        self.num_ranks = self._legacy.group_size
        self.allow_hybrid_mode = allow_hybrid_mode
        self.allow_multiple_reduction = allow_multiple_reduction
        self.prefer_overlap_with_compute = prefer_overlap_with_compute
        self.deterministic = deterministic
        self.num_bytes = num_bytes
        self.num_max_tokens_per_rank = num_max_tokens_per_rank
        self.num_allocated_qps = num_allocated_qps
        self.sl_idx = sl_idx
        self.num_cpu_timeout_secs = num_cpu_timeout_secs
        self.num_gpu_timeout_secs = num_gpu_timeout_secs
        self.explicitly_destroy = explicitly_destroy

        rpn = self._legacy.ranks_per_node  # what the ranks agreed on
        self.num_rdma_ranks, self.num_nvlink_ranks = physical_domain_size(self.num_ranks, rpn)
        self.num_scaleout_ranks, self.num_scaleup_ranks = logical_domain_size(
            self.num_ranks, rpn, allow_hybrid_mode)
        self.scaleout_rank_idx = self.rank_idx // self.num_scaleup_ranks
        self.scaleup_rank_idx = self.rank_idx % self.num_scaleup_ranks
        self._num_sms_cache = {}

    # ---- lifecycle ----

    def destroy(self):
        """Collective; needs ``explicitly_destroy=True`` (as DeepEP). Every later call raises."""
        assert self.explicitly_destroy, "`explicitly_destroy` flag must be set"
        if self.runtime is not None:
            self._legacy.destroy()
            self.runtime = None

    def _usable(self, call):
        if self.runtime is None:
            raise proxyep.ProxyEPError(f"{call}: this ElasticBuffer was destroyed")

    # ---- sizes and domains ----

    @staticmethod
    def get_buffer_size_hint(group, num_max_tokens_per_rank, hidden, num_topk=0,
                             use_fp8_dispatch=False, allow_hybrid_mode=True,
                             allow_multiple_reduction=True):
        """Bytes (2 MiB aligned) that hold a whole dispatch of these settings. The two modes
        do not change ProxyEP's sizes."""
        group_size = group.size() if group is not None else torch.distributed.get_world_size()
        return sizes.buffer_size_hint(group_size, ranks_per_node_of_group(group),
                                      num_max_tokens_per_rank, hidden, num_topk, use_fp8_dispatch)

    @staticmethod
    def get_engram_storage_size_hint(num_entries, hidden, num_max_tokens_per_rank,
                                     dtype=torch.bfloat16):
        element_size = torch.empty((), dtype=dtype).element_size()
        return sizes.engram_storage_size_hint(num_entries, hidden, num_max_tokens_per_rank, element_size)

    @staticmethod
    def get_pp_buffer_size_hint(num_max_tensor_bytes, num_max_inflight_tensors):
        return sizes.pp_buffer_size_hint(num_max_tensor_bytes, num_max_inflight_tensors)

    @staticmethod
    def get_agrs_num_max_session_bytes(group, shapes, dtype):
        element_size = torch.empty((), dtype=dtype).element_size()
        return sizes.agrs_num_max_session_bytes(group.size(), shapes, element_size)

    @staticmethod
    def get_agrs_buffer_size_hint(group, num_max_session_bytes):
        return sizes.agrs_buffer_size_hint(num_max_session_bytes)

    def get_physical_domain_size(self):
        """``(num_rdma_ranks, num_nvlink_ranks)``: (nodes, ranks per node)."""
        return self.num_rdma_ranks, self.num_nvlink_ranks

    def get_logical_domain_size(self):
        """``(num_scaleout_ranks, num_scaleup_ranks)``: the physical domains with hybrid mode
        across nodes, else one domain of every rank."""
        return self.num_scaleout_ranks, self.num_scaleup_ranks

    def get_theoretical_num_sms(self, num_experts, num_topk, num_scaleout_topk=0, rdma_gbs=0,
                                nvlink_gbs=0, sm_read_gbs=200, sm_write_gbs=50):
        """DeepEP models SMs from NVLink and NIC bandwidth; ProxyEP has neither to model, so this
        is ``deep_ep.Buffer.num_sms`` (``set_num_sms``), at least 64 without the overlap
        preference, even, and at most the GPU's SMs with CUDA. Cached per arguments, as DeepEP's."""
        assert num_scaleout_topk == 0, "num_scaleout_topk is reserved (must be 0)"
        key = (num_experts, num_topk, num_scaleout_topk, rdma_gbs, nvlink_gbs, sm_read_gbs, sm_write_gbs)
        cached = self._num_sms_cache.get(key)
        if cached is not None:
            return cached
        num_sms = Buffer.num_sms
        if not self.prefer_overlap_with_compute:
            num_sms = max(num_sms, _MIN_SMS_WITHOUT_OVERLAP)
        num_sms = align(max(4, num_sms), 2)
        if self._legacy._cuda:
            num_sms = min(num_sms, torch.cuda.get_device_properties(
                torch.cuda.current_device()).multi_processor_count)
        self._num_sms_cache[key] = num_sms
        return num_sms

    def get_theoretical_num_qps(self, num_sms):
        """DeepEP's arithmetic (direct: at most 9; hybrid: a QP per channel plus one), capped by
        ``num_allocated_qps``. Recorded only: the fabric has no per-call QP count."""
        num_qps = num_sms * 16 + 1 if self.allow_hybrid_mode else min(num_sms, 8 + 1)
        return min(num_qps, self.num_allocated_qps)

    def _resolve_sms_qps(self, num_sms, num_qps, num_experts, num_topk):
        if num_sms == 0:
            num_sms = self.get_theoretical_num_sms(num_experts, num_topk)
        if num_qps == 0:
            num_qps = self.get_theoretical_num_qps(num_sms)
        if num_qps > self.num_allocated_qps:
            raise ValueError(f"num_qps={num_qps} exceeds num_allocated_qps={self.num_allocated_qps}")
        return num_sms, num_qps

    # ---- streams and barriers ----

    def barrier(self, use_comm_stream=True, with_cpu_sync=False, sequential=True):
        """Every rank of the group reaches it (the native bootstrap's barrier, on the host). With
        CUDA and ``with_cpu_sync``, the device is synchronised before and after, as DeepEP's."""
        self._usable("barrier")
        sync = with_cpu_sync and self._legacy._cuda
        if sync:
            torch.cuda.synchronize()
        self.runtime.barrier()
        if sync:
            torch.cuda.synchronize()

    @staticmethod
    def capture():
        """An EventHandle at the current end of torch's current stream (complete on the CPU)."""
        return EventHandle()

    def get_comm_stream(self):
        """The Buffer's stream as a torch stream with CUDA; None on the CPU (no streams)."""
        return self._legacy.get_comm_stream()

    # ---- refused: Engram, pipeline parallelism, AG-RS ----

    def engram_write(self, storage, sf=None):
        raise _unsupported("engram_write (Engram)", "not supported by ProxyEP")

    def engram_fetch(self, indices, num_qps=0, use_tma_aligned_col_major_sf=False):
        raise _unsupported("engram_fetch (Engram)", "not supported by ProxyEP")

    def pp_set_config(self, num_max_tensor_bytes, num_max_inflight_tensors):
        raise _unsupported("pp_set_config (pipeline-parallel send/recv)", "not supported by ProxyEP")

    def pp_send(self, t, dst_rank_idx, num_sms=0):
        raise _unsupported("pp_send (pipeline-parallel send/recv)", "not supported by ProxyEP")

    def pp_recv(self, t, src_rank_idx, num_sms=0):
        raise _unsupported("pp_recv (pipeline-parallel send/recv)", "not supported by ProxyEP")

    def create_agrs_session(self):
        raise _unsupported("create_agrs_session (AG-RS)", "not supported by ProxyEP")

    def destroy_agrs_session(self):
        raise _unsupported("destroy_agrs_session (AG-RS)", "not supported by ProxyEP")

    def agrs_new_session(self, enabled=True):
        """A context manager; ``enabled=False`` is a no-op, as in DeepEP. Raised at the call,
        not at ``with``, so the refusal is where the session is asked for."""
        if enabled:
            raise _unsupported("agrs_new_session (AG-RS)", "not supported by ProxyEP")
        return contextlib.nullcontext()

    def agrs_set_config(self, num_max_session_bytes, num_max_all_gathers_per_session):
        raise _unsupported("agrs_set_config (AG-RS)", "not supported by ProxyEP")

    def agrs_get_inplace_tensor(self, shapes, dtype):
        raise _unsupported("agrs_get_inplace_tensor (AG-RS)", "not supported by ProxyEP")

    def all_gather(self, t):
        raise _unsupported("all_gather (AG-RS)", "not supported by ProxyEP")

    # ---- dispatch ----

    def _check_order(self, previous_event, previous_event_before_epilogue, allocate_on_comm_stream):
        previous = _event_handle(previous_event, "previous_event")
        before_epilogue = _event_handle(previous_event_before_epilogue, "previous_event_before_epilogue")
        if previous is not None and not allocate_on_comm_stream:
            raise ValueError("previous_event needs allocate_on_comm_stream=True (as in DeepEP V2)")
        return previous, before_epilogue

    def dispatch(self, x, topk_idx=None, topk_weights=None, cumulative_local_expert_recv_stats=None,
                 num_experts=None, num_max_tokens_per_rank=None, expert_alignment=None, num_sms=0,
                 num_qps=0, previous_event=None, previous_event_before_epilogue=None,
                 async_with_compute_stream=False, allocate_on_comm_stream=False, handle=None,
                 do_handle_copy=True, do_cpu_sync=None, do_expand=False, do_zero_padding=False,
                 use_tma_aligned_col_major_sf=False):
        """DeepEP V2's dispatch, non-expanded layout. Returns ``(recv_x, recv_topk_idx,
        recv_topk_weights, handle, event)``; ``recv_x`` is ``(data, scales)`` for FP8 input."""
        self._usable("dispatch")
        check_torch_deterministic()
        if do_zero_padding and not do_expand:
            raise ValueError("do_zero_padding needs do_expand=True (it zeroes the expanded layout's gaps)")
        previous, before_epilogue = self._check_order(
            previous_event, previous_event_before_epilogue, allocate_on_comm_stream)
        fp8 = isinstance(x, tuple)
        if fp8 and len(x) != 2:
            raise ValueError("an FP8 x must be the tuple (x_e4m3, x_scales)")
        x_data = x[0] if fp8 else x
        if not isinstance(x_data, torch.Tensor) or x_data.dim() != 2:
            raise ValueError("x must be a 2-D tensor [num_tokens, hidden] (or an FP8 tuple of one)")
        if handle is not None:
            args = self._cached_args(handle, topk_idx, topk_weights, cumulative_local_expert_recv_stats,
                                     num_experts, num_max_tokens_per_rank, expert_alignment, do_cpu_sync)
        else:
            args = self._fresh_args(x_data, topk_idx, topk_weights, cumulative_local_expert_recv_stats,
                                    num_experts, num_max_tokens_per_rank, expert_alignment, do_cpu_sync)
        num_experts, num_max_tokens_per_rank, expert_alignment, do_cpu_sync = args
        if x_data.shape[0] > num_max_tokens_per_rank:
            raise ValueError(f"x has {x_data.shape[0]} tokens, more than num_max_tokens_per_rank="
                             f"{num_max_tokens_per_rank}")
        num_topk = (handle.topk_idx if handle is not None else topk_idx).shape[1]
        num_sms, num_qps = self._resolve_sms_qps(num_sms, num_qps, num_experts, num_topk)
        _wait_before_call(before_epilogue)
        order = dict(previous_event=EventOverlap(previous) if previous is not None else None,
                     async_finish=async_with_compute_stream)
        if handle is not None:
            if do_expand != handle.do_expand:
                raise ValueError(f"do_expand={do_expand} differs from the handle's {handle.do_expand}")
            return self._cached_dispatch(x, fp8, handle, topk_weights, order,
                                         use_tma_aligned_col_major_sf, do_zero_padding)
        return self._fresh_dispatch(
            x, fp8, topk_idx, topk_weights, cumulative_local_expert_recv_stats, num_experts,
            num_max_tokens_per_rank, expert_alignment, num_sms, do_cpu_sync, do_handle_copy, order,
            use_tma_aligned_col_major_sf, do_expand, do_zero_padding)

    def _fresh_args(self, x_data, topk_idx, topk_weights, stats, num_experts,
                    num_max_tokens_per_rank, expert_alignment, do_cpu_sync):
        if topk_idx is None:
            raise ValueError("a dispatch without a handle needs topk_idx")
        if num_experts is None:
            raise ValueError("a dispatch without a handle needs num_experts")
        if num_experts % self.num_ranks:
            raise ValueError(f"num_experts={num_experts} must be a multiple of the {self.num_ranks} ranks")
        if not isinstance(topk_idx, torch.Tensor) or topk_idx.dim() != 2 or topk_idx.shape[0] != x_data.shape[0]:
            raise ValueError(f"topk_idx must be [num_tokens = {x_data.shape[0]}, num_topk]")
        if stats is not None:
            local = num_experts // self.num_ranks
            if (not isinstance(stats, torch.Tensor) or stats.dtype != torch.int32
                    or tuple(stats.shape) != (local,)):
                raise ValueError(f"cumulative_local_expert_recv_stats must be int32 [{local}] "
                                 "(one count per local expert)")
        if num_max_tokens_per_rank is None:
            num_max_tokens_per_rank = self.num_max_tokens_per_rank
        if num_max_tokens_per_rank <= 0:
            raise ValueError("num_max_tokens_per_rank must be given (here or to the constructor)")
        expert_alignment = 1 if expert_alignment is None else expert_alignment
        if expert_alignment < 1:
            raise ValueError(f"expert_alignment must be >= 1, got {expert_alignment}")
        return num_experts, num_max_tokens_per_rank, expert_alignment, (
            True if do_cpu_sync is None else bool(do_cpu_sync))

    def _cached_args(self, handle, topk_idx, topk_weights, stats, num_experts,
                     num_max_tokens_per_rank, expert_alignment, do_cpu_sync):
        if not isinstance(handle, EPHandle) or handle._owner is not self:
            raise TypeError("handle must be an EPHandle a dispatch of this ElasticBuffer returned")
        if topk_idx is not None:
            raise ValueError("a cached dispatch (handle given) takes no topk_idx: the handle's routing is used")
        if stats is not None:
            raise ValueError("cumulative_local_expert_recv_stats is not taken with a handle (as in DeepEP)")
        if do_cpu_sync:
            raise ValueError("do_cpu_sync=True cannot be used with a handle (as in DeepEP)")
        given = (num_experts, num_max_tokens_per_rank, expert_alignment)
        recorded = (handle.num_experts, handle.num_max_tokens_per_rank, handle.expert_alignment)
        for name, value, theirs in zip(("num_experts", "num_max_tokens_per_rank", "expert_alignment"),
                                       given, recorded):
            if value is not None and value != theirs:
                raise ValueError(f"{name}={value} differs from the handle's {theirs}")
        return recorded + (False,)  # the order _fresh_args returns, without CPU sync

    def _native_args(self, x, fp8, topk_idx=None, topk_weights=None, stats=None, handle=None,
                     expert_alignment=1, num_worst_tokens=0, order=None):
        """(DispatchArgs, caller_stream, inputs to hold) of one native dispatch."""
        legacy = self._legacy
        previous, stream = legacy._order(order["previous_event"], order["async_finish"], False)
        x_data, x_scales = x if fp8 else (x, None)
        topk_idx, topk_weights = _small(topk_idx), _small(topk_weights)
        args = _proxyep.DispatchArgs(
            x=legacy._view(x_data, "x", fp8=fp8), x_scales=legacy._view(x_scales, "x_scales"),
            handle=handle, topk_idx=legacy._view(topk_idx, "topk_idx"),
            topk_weights=legacy._view(topk_weights, "topk_weights"),
            recv_stats=legacy._view(stats, "cumulative_local_expert_recv_stats"),
            expert_alignment=expert_alignment, num_worst_tokens=num_worst_tokens,
            async_finish=order["async_finish"], previous_event=previous)
        return args, stream, (x_data, x_scales, topk_idx, topk_weights, stats)

    def _fresh_dispatch(self, x, fp8, topk_idx, topk_weights, stats, num_experts,
                        num_max_tokens_per_rank, expert_alignment, num_sms, do_cpu_sync,
                        do_handle_copy, order, col_major_sf, do_expand, do_zero_padding):
        """One native call: layout, dispatch and the handle's fields (computed on the host; with
        device tensors from host copies of what they read); with ``do_expand`` the rows are
        copied into their expanded slots in it too, where they are."""
        legacy = self._legacy
        local = num_experts // self.num_ranks
        worst = fields.worst_case_tokens(self.num_ranks, num_max_tokens_per_rank)
        args, stream, inputs = self._native_args(
            x, fp8, topk_idx, topk_weights, stats, expert_alignment=expert_alignment,
            num_worst_tokens=0 if do_cpu_sync else worst, order=order)
        (recv_x, recv_scales, recv_idx, recv_weights, per_expert_list, native, native_event,
         native_fields, has_metadata, expanded, layout) = self.runtime.elastic_dispatch(
            args, num_experts, num_max_tokens_per_rank, self.num_scaleup_ranks, expand=do_expand,
            zero_padding=do_zero_padding, caller_stream=stream)
        legacy._hold_inputs(order["async_finish"], inputs + (layout,))
        event = _event(order["async_finish"], native_event, inputs + (layout,), legacy._streams())
        recv = (tensor(recv_x, FP8_DTYPE), tensor(recv_scales)) if fp8 else tensor(recv_x)
        recv_idx, recv_weights = tensor(recv_idx), tensor(recv_weights)
        device = recv_idx.device
        topk_in_handle = self._clone(topk_idx) if do_handle_copy else topk_idx
        num_recv = native.num_recv_tokens
        rows = num_recv if do_cpu_sync else worst
        if do_expand:
            num_expanded = expanded[3]
        elif do_cpu_sync:
            num_expanded = sum(per_expert_list)
        else:
            num_expanded = fields.worst_case_expanded_tokens(
                self.num_ranks, num_max_tokens_per_rank, topk_idx.shape[1], local, expert_alignment)
        handle = EPHandle(
            do_expand=do_expand, num_experts=num_experts, expert_alignment=expert_alignment,
            num_max_tokens_per_rank=num_max_tokens_per_rank, num_sms=num_sms,
            topk_idx=topk_in_handle, num_recv_tokens=rows, num_expanded_tokens=num_expanded,
            num_recv_tokens_per_expert_list=list(per_expert_list) if do_cpu_sync else [],
            psum_num_recv_tokens_per_scaleup_rank=fields.Native(native_fields, fields.PSUM_SCALEUP, device),
            psum_num_recv_tokens_per_expert=fields.Native(native_fields, fields.PSUM_EXPERT, device),
            num_unaligned_recv_tokens_per_expert=fields.Native(native_fields, fields.UNALIGNED, device),
            recv_src_metadata=(fields.Native(native_fields, fields.METADATA, device)
                               if has_metadata else None),
            dst_buffer_slot_idx=fields.Native(native_fields, fields.SLOTS, device),
            token_metadata_at_forward=None, channel_linked_list=None)
        handle._native = native
        # Host tables, whichever memory the tensors are in (CombineArgs::order).
        handle._order_tables = (fields.Native(native_fields, fields.ORDER, _HOST),
                                fields.Native(native_fields, fields.WEIGHT_OWNER, _HOST))
        handle._owner = self
        handle._recv_topk_idx = recv_idx
        if not has_metadata:
            handle._pending = self._metadata_later(handle, event, native, recv_idx, num_experts,
                                                   num_max_tokens_per_rank)
            # A column-major copy of the scales needs the rows at once: such calls finish before
            # returning even with async_with_compute_stream.
            if event.event is None or (fp8 and col_major_sf):
                handle._complete()
            else:
                event.register_hook_after_wait(handle._complete)
        if do_expand:  # the rows in their slots; the call waited for them (its event is set)
            recv, recv_idx, recv_weights = self._expanded(expanded, fp8), None, tensor(expanded[2])
        if fp8 and col_major_sf:
            if event.event is not None:
                event.current_stream_wait()
            recv = (recv[0], self._column_major(recv[1]))
        return recv, recv_idx, recv_weights, handle, event

    @staticmethod
    def _expanded(expanded, fp8):
        """recv_x of the expanded layout from the native (x, scales, weights, slots)."""
        return (tensor(expanded[0], FP8_DTYPE), tensor(expanded[1])) if fp8 else tensor(expanded[0])

    def _metadata_later(self, handle, event, native, recv_idx, num_experts, num_max_tokens_per_rank):
        """recv_src_metadata, which needs the received rows: computed once the call's event is
        waited for (a hook after the wait) or when first read, whichever comes first."""

        def complete():
            if event.event is not None:
                event.event.current_stream_wait()
            metadata = tensor(self.runtime.elastic_source_metadata(
                native, self._legacy._view(recv_idx, "recv_topk_idx"), num_experts,
                num_max_tokens_per_rank))
            handle.recv_src_metadata = metadata.to(recv_idx.device)

        return complete

    def _cached_dispatch(self, x, fp8, handle, topk_weights, order, col_major_sf, do_zero_padding):
        """The handle's routing again: the same rows in the same places (the expanded layout's
        slots by the handle's ``recv_src_metadata``, as DeepEP's); ``topk_weights`` travel with
        the handle's ``topk_idx`` again (zeroed where a lane's expert is elsewhere, as fresh)."""
        legacy = self._legacy
        args, stream, inputs = self._native_args(
            x, fp8, topk_idx=handle.topk_idx if topk_weights is not None else None,
            topk_weights=topk_weights, handle=handle._native, order=order)
        metadata = _small(handle.recv_src_metadata) if handle.do_expand else None
        out = self.runtime.elastic_dispatch(
            args, handle.num_experts, handle.num_max_tokens_per_rank, self.num_scaleup_ranks,
            expand=handle.do_expand, zero_padding=do_zero_padding,
            cached_metadata=view(metadata, "recv_src_metadata"),
            cached_slots=handle.num_expanded_tokens, caller_stream=stream)
        # (recv_x, scales, ..., event at 6, fields, has_metadata, expanded at 9, layout): a cached
        # call's fields are undefined.
        recv_x, recv_scales, recv_w, native_event, expanded = out[0], out[1], out[3], out[6], out[9]
        legacy._hold_inputs(order["async_finish"], inputs)
        event = _event(order["async_finish"], native_event, inputs, legacy._streams())
        if handle.do_expand:
            recv = self._expanded(expanded, fp8)
            if fp8 and col_major_sf:
                recv = (recv[0], self._column_major(recv[1]))
            return recv, None, tensor(expanded[2]), handle, event
        recv_w = tensor(recv_w)
        recv = (tensor(recv_x, FP8_DTYPE), tensor(recv_scales)) if fp8 else tensor(recv_x)
        recv_idx = self._clone(handle._recv_topk_idx)
        pad = handle.num_recv_tokens - handle._native.num_recv_tokens
        if pad > 0 or (fp8 and col_major_sf):
            # Rows past the received ones (a handle of a dispatch without CPU sync) and
            # column-major scales are made here from the complete rows.
            if event.event is not None:
                event.current_stream_wait()
            if pad > 0:
                recv = tuple(self._pad_rows(t, pad) for t in recv) if fp8 else self._pad_rows(recv, pad)
                recv_w = self._pad_rows(recv_w, pad) if recv_w is not None else None
            if fp8 and col_major_sf:
                recv = (recv[0], self._column_major(recv[1]))
        return recv, recv_idx, recv_w, handle, event

    def _pad_rows(self, t, pad):
        """``t`` with ``pad`` zero rows after it (worst-case outputs, as V1's padding), in
        ``t``'s memory."""
        host = self._host_copy(t)
        out = torch.zeros((t.shape[0] + pad,) + tuple(t.shape[1:]), dtype=t.dtype, device=host.device)
        out[:t.shape[0]] = host
        return self._device_copy(out)

    def _column_major(self, scales):
        """DeepEP's TMA-aligned column-major scales: strides ``(1, align(rows, 4))``, in the
        memory ``scales`` is in."""
        rows, packs = scales.shape
        padded = align(rows, _TMA_ALIGNED_SF_ROWS)
        host = self._host_copy(scales)
        # Row-major [packs, padded] is column-major [rows, packs] with those strides.
        transposed = torch.empty((packs, padded), dtype=scales.dtype, device=host.device)
        transposed[:, :rows] = host.t()
        return self._device_copy(transposed)[:, :rows].t()

    def _host_copy(self, t):
        """``t`` where torch may compute on it: itself (CPU or CUDA tensors), or a host copy of
        the simulated device's memory, which only the device may touch."""
        return proxyep.to_host(self._legacy.device, t) if self._legacy._simulated else t

    def _clone(self, t):
        """A copy of ``t`` in its memory."""
        return self._device_copy(self._host_copy(t)) if self._legacy._simulated else t.clone()

    def _device_copy(self, t):
        """``t`` (as ``_host_copy`` gave, contiguous) in the calls' memory again."""
        return proxyep.to_device(self._legacy.device, t) if self._legacy._simulated else t

    # ---- combine ----

    def _combine_slots(self, x, handle, topk_weights, biases, async_finish, stream):
        """The expanded layout without multiple reduction: every slot goes home alone and the
        home adds the biases, then the token's slots in lane order, rounded once
        (integrations/elastic/slot_combine.hpp). Complete at return: an async call's event is
        already set."""
        legacy = self._legacy
        x, metadata, topk_idx = _small(x), _small(handle.recv_src_metadata), _small(handle.topk_idx)
        combined, combined_weights = map(tensor, self.runtime.elastic_combine_slots(
            legacy._view(x, "x"), legacy._view(topk_weights, "topk_weights"),
            legacy._view(biases[0], "bias[0]"), legacy._view(biases[1], "bias[1]"), handle._native,
            view(metadata, "recv_src_metadata"), legacy._view(topk_idx, "topk_idx"),
            handle.num_experts, caller_stream=stream))
        return combined, combined_weights, _event(async_finish, None, None, legacy._streams())

    def combine(self, x, handle, topk_weights=None, bias=None, num_sms=0, num_qps=0,
                previous_event=None, previous_event_before_epilogue=None,
                async_with_compute_stream=False, allocate_on_comm_stream=False):
        """DeepEP V2's combine, non-expanded layout: ``x`` has the dispatch's received rows
        (only the first ``psum_num_recv_tokens_per_scaleup_rank[-1]`` are read). Returns
        ``(combined_x, combined_topk_weights, event)``. V2's reduce order (biases first, then
        the ranks' rows, or nodes' partials, by each token's last top-k lane) and V2's weights
        (lane k as its expert's rank returned it), host and device tensors alike."""
        self._usable("combine")
        check_torch_deterministic()
        if not isinstance(handle, EPHandle) or handle._owner is not self:
            raise TypeError("handle must be an EPHandle a dispatch of this ElasticBuffer returned")
        order, weight_owner = handle._combine_tables()
        biases = _biases(bias)
        if isinstance(topk_weights, torch.Tensor) and (topk_weights.dim() == 1) != handle.do_expand:
            raise ValueError("topk_weights must be 1-D [num_expanded_tokens] for a handle of the "
                             "expanded layout, 2-D [rows, num_topk] otherwise")
        if not self.allow_multiple_reduction:
            if self._reduces_by_node:
                raise _unsupported("allow_multiple_reduction=False on an ElasticBuffer made with it "
                                   "across nodes (its combine reduces inside each node first)")
        previous, before_epilogue = self._check_order(
            previous_event, previous_event_before_epilogue, allocate_on_comm_stream)
        self._resolve_sms_qps(num_sms or handle.num_sms, num_qps, handle.num_experts,
                              handle.topk_idx.shape[1])
        _wait_before_call(before_epilogue)
        legacy = self._legacy
        previous, stream = legacy._order(
            EventOverlap(previous) if previous is not None else None, async_with_compute_stream, False)
        topk_weights = _small(topk_weights)
        if handle.do_expand and not self.allow_multiple_reduction:
            return self._combine_slots(x, handle, topk_weights, biases, async_with_compute_stream, stream)
        expanded = None
        if handle.do_expand:
            # Each token's slots summed (lane order) into one row, where the rows are: work the
            # device queues before the combine's, reading the expanded inputs, held until then.
            x = _small(x)
            expanded = (x, topk_weights)
            metadata = _small(handle.recv_src_metadata)  # held: views don't hold
            x, topk_weights = map(tensor, self.runtime.elastic_fold(
                legacy._view(x, "x"), legacy._view(topk_weights, "topk_weights"),
                view(metadata, "recv_src_metadata"), handle._native.num_recv_tokens,
                caller_stream=stream))
        inputs = (x, topk_weights, biases, handle, expanded)
        args = _proxyep.CombineArgs(
            x=legacy._view(x, "x"), handle=handle._native,
            topk_weights=legacy._view(topk_weights, "topk_weights"),
            bias0=legacy._view(biases[0], "bias[0]"), bias1=legacy._view(biases[1], "bias[1]"),
            order=view(order, "order") if order is not None else None,
            weight_owner=(view(weight_owner, "weight_owner")
                          if weight_owner is not None and topk_weights is not None else None),
            async_finish=async_with_compute_stream, previous_event=previous)
        combined, combined_weights, native_event = self.runtime.combine(args, caller_stream=stream)
        legacy._hold_inputs(async_with_compute_stream, inputs)
        event = _event(async_with_compute_stream, native_event, inputs, legacy._streams())
        combined, combined_weights = tensor(combined), tensor(combined_weights)
        return combined, combined_weights, event

