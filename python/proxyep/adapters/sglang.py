"""An SGLang-shaped DeepEP token dispatcher on ProxyEP (SGLang's
``python/sglang/srt/layers/moe/token_dispatcher/deepep.py``; docs/DEEPEP_CONTRACT.md 7.2,
docs/ADAPTERS.md).

* :class:`DeepEPDispatcher` (``group, router_topk, permute_fusion, num_experts,
  num_local_experts, hidden_size, params_dtype, deepep_mode, async_finish, return_recv_hook``)
  with SGLang's two-phase calls: ``dispatch_a(hidden_states, topk_output)`` then
  ``dispatch_b()`` -> :class:`DeepEPNormalDispatchOutput` or :class:`DeepEPLLDispatchOutput`;
  ``combine_a(combine_input)`` then ``combine_b()`` -> the combined ``[tokens, hidden]``
  tensor; ``dispatch`` / ``combine`` run both phases. The stage order is enforced as SGLang's
  ``_update_stage`` does.
* ``deepep_mode``: ``"normal"``, ``"low_latency"`` or ``"auto"`` (:class:`DeepEPMode`). Auto
  resolves per call, as SGLang's ``DeepEPMode.resolve(is_extend_in_batch)``: normal for
  extend/prefill batches, low-latency for decode. SGLang takes ``is_extend_in_batch`` from its
  global batch state; here it comes from :meth:`DeepEPDispatcher.set_is_extend_in_batch` when the
  caller sets it, and otherwise from the batch sizes: a ``MAX`` all-reduce of the token counts over
  the group, extend iff some rank has more than ``num_max_dispatch_tokens_per_rank`` tokens (so
  every rank resolves the same mode; a mode mismatch between ranks would deadlock).
* Normal mode: ``Buffer.capture()`` (when ``async_finish``) -> ``get_dispatch_layout`` ->
  ``dispatch(..., expert_alignment=1, config=normal_dispatch_config)`` -> the expert side
  returns one (already weighted) row per received row -> ``combine(x, handle, config=...)``.
* Low-latency mode: ``low_latency_dispatch(x, topk_ids, T, E, use_fp8=..., async_finish=not
  hook, return_recv_hook=hook)`` -> ``hook()`` or ``event.current_stream_wait()`` -> masked
  expert output ``[E_local, R*T, H]`` -> ``low_latency_combine(x=, topk_idx=, topk_weights=,
  handle=, ...)`` (weighted with the original top-k weights).
* :class:`DeepEPBuffer`: SGLang's single process-wide Buffer, sized from the configs' hints
  (normal) and ``get_low_latency_rdma_size_hint`` (low-latency), ``low_latency_mode`` on when
  LL is enabled, ``num_qps_per_rank`` by mode, ``allow_mnnvl=True``;
  ``clean_low_latency_buffer`` when switching from normal to low-latency.
  :class:`DeepEPConfig` holds the ``normal_dispatch`` / ``normal_combine`` ``Config(**dict)``
  from a ``--deepep-config``-style dict.

Not covered: FP8 normal dispatch (SGLang's per-token-group quantisation), NVFP4, DeepGEMM's
``expert_alignment=128`` (pass ``expert_alignment=128`` to get it), single-batch-overlap
arguments, the expert-distribution recorder, two-batch overlap scheduling. Tested with CPU tensors only.
"""

import os
from enum import Enum
from typing import List, NamedTuple, Optional

import deep_ep
import torch
import torch.distributed as dist


class DeepEPMode(Enum):
    NORMAL = "normal"
    LOW_LATENCY = "low_latency"
    AUTO = "auto"

    def enable_normal(self):
        return self in (DeepEPMode.NORMAL, DeepEPMode.AUTO)

    def enable_low_latency(self):
        return self in (DeepEPMode.LOW_LATENCY, DeepEPMode.AUTO)

    def resolve(self, is_extend_in_batch):
        if self != DeepEPMode.AUTO:
            return self
        return DeepEPMode.NORMAL if is_extend_in_batch else DeepEPMode.LOW_LATENCY


class TopKOutput(NamedTuple):
    """What SGLang's top-k step hands the dispatcher."""

    topk_weights: torch.Tensor
    topk_ids: torch.Tensor
    router_logits: Optional[torch.Tensor] = None


class DeepEPNormalDispatchOutput(NamedTuple):
    hidden_states: torch.Tensor  # [received rows, H]
    hidden_states_scale: Optional[torch.Tensor]
    topk_ids: torch.Tensor  # local expert ids, -1 elsewhere
    topk_weights: torch.Tensor  # float32, 0 at -1 slots
    num_recv_tokens_per_expert: List[int]


class DeepEPLLDispatchOutput(NamedTuple):
    hidden_states: torch.Tensor  # [E_local, R*T, H]
    hidden_states_scale: Optional[torch.Tensor]
    topk_ids: torch.Tensor  # this rank's own (global) top-k ids, for the combine
    topk_weights: torch.Tensor
    masked_m: torch.Tensor  # rows received per local expert
    expected_m: int


class DeepEPNormalCombineInput(NamedTuple):
    hidden_states: torch.Tensor  # one weighted row per received row
    topk_ids: torch.Tensor
    topk_weights: torch.Tensor


class DeepEPLLCombineInput(NamedTuple):
    hidden_states: torch.Tensor  # [E_local, R*T, H]
    topk_ids: torch.Tensor
    topk_weights: torch.Tensor


class DeepEPConfig:
    """``normal_dispatch`` / ``normal_combine`` configs and the SM count, from a dict shaped as
    SGLang's ``--deepep-config`` JSON (or None: the default tables, ``Buffer.num_sms``)."""

    _instance = None

    def __init__(self, parsed=None):
        if parsed:
            self.normal_dispatch_config = deep_ep.Config(**parsed["normal_dispatch"])
            self.normal_combine_config = deep_ep.Config(**parsed["normal_combine"])
            assert parsed["normal_dispatch"]["num_sms"] == parsed["normal_combine"]["num_sms"]
            self.num_sms = parsed["normal_dispatch"]["num_sms"]
        else:
            self.normal_dispatch_config = None
            self.normal_combine_config = None
            self.num_sms = deep_ep.Buffer.num_sms

    @classmethod
    def get_instance(cls):
        if cls._instance is None:
            cls._instance = DeepEPConfig()
        return cls._instance

    @classmethod
    def set_instance(cls, parsed):
        cls._instance = DeepEPConfig(parsed)


class DeepEPBuffer:
    """SGLang's process-wide Buffer: created by the first dispatcher that needs it, with the sizes
    and mode that dispatcher's ``deepep_mode`` asks for."""

    _buffer = None
    _dispatch_mode = None
    _hidden_size = None
    _num_max_dispatch_tokens_per_rank = None
    _num_experts = None

    @classmethod
    def get_deepep_buffer(cls, group, hidden_size, param_bytes, deepep_mode,
                          num_max_dispatch_tokens_per_rank=-1, num_experts=-1):
        if cls._buffer is not None:
            return cls._buffer
        cls._hidden_size = hidden_size
        cls._num_max_dispatch_tokens_per_rank = num_max_dispatch_tokens_per_rank
        cls._num_experts = num_experts
        size = group.size()
        config = DeepEPConfig.get_instance()
        num_nvl_bytes, num_rdma_bytes = 0, 0
        if deepep_mode.enable_normal():
            hidden_bytes = hidden_size * param_bytes
            for c in (config.normal_dispatch_config or deep_ep.Buffer.get_dispatch_config(size),
                      config.normal_combine_config or deep_ep.Buffer.get_combine_config(size)):
                num_nvl_bytes = max(c.get_nvl_buffer_size_hint(hidden_bytes, size), num_nvl_bytes)
                num_rdma_bytes = max(c.get_rdma_buffer_size_hint(hidden_bytes, size), num_rdma_bytes)
        if deepep_mode.enable_low_latency():
            assert num_max_dispatch_tokens_per_rank != -1
            assert num_experts != -1 and num_experts % size == 0
            num_rdma_bytes = max(deep_ep.Buffer.get_low_latency_rdma_size_hint(
                num_max_dispatch_tokens_per_rank, hidden_size, size, num_experts), num_rdma_bytes)
        if deepep_mode == DeepEPMode.NORMAL:
            num_qps_per_rank = config.num_sms
        elif deepep_mode == DeepEPMode.LOW_LATENCY:
            num_qps_per_rank = num_experts // size
        else:
            num_qps_per_rank = max(config.num_sms, num_experts // size)
        cls._buffer = deep_ep.Buffer(group, num_nvl_bytes, num_rdma_bytes,
                                     low_latency_mode=deepep_mode.enable_low_latency(),
                                     num_qps_per_rank=num_qps_per_rank, allow_mnnvl=True)
        return cls._buffer

    @classmethod
    def clean_buffer(cls):
        if not cls._buffer.low_latency_mode:
            return
        cls._buffer.clean_low_latency_buffer(cls._num_max_dispatch_tokens_per_rank, cls._hidden_size,
                                             cls._num_experts)

    @classmethod
    def set_dispatch_mode_as_normal(cls):
        cls._dispatch_mode = DeepEPMode.NORMAL

    @classmethod
    def set_dispatch_mode_as_low_latency(cls):
        if cls._dispatch_mode == DeepEPMode.NORMAL:
            cls.clean_buffer()
        cls._dispatch_mode = DeepEPMode.LOW_LATENCY

    @classmethod
    def reset(cls):
        """ProxyEP only: drop the Buffer (tests; SGLang keeps one for the process's life)."""
        cls._buffer = None
        cls._dispatch_mode = None


class _ImplBase:
    def __init__(self, group, router_topk, num_experts, num_local_experts, hidden_size, params_dtype,
                 deepep_mode, num_max_dispatch_tokens_per_rank):
        self.group, self.router_topk = group, router_topk
        self.num_experts, self.num_local_experts = num_experts, num_local_experts
        self.hidden_size, self.params_dtype, self.deepep_mode = hidden_size, params_dtype, deepep_mode
        self.num_max_dispatch_tokens_per_rank = num_max_dispatch_tokens_per_rank
        self.params_bytes = 2  # bf16 dispatch
        self.handle = None

    def _buffer(self):
        return DeepEPBuffer.get_deepep_buffer(self.group, self.hidden_size, self.params_bytes,
                                              self.deepep_mode, self.num_max_dispatch_tokens_per_rank,
                                              self.num_experts)


class _NormalImpl(_ImplBase):
    def __init__(self, async_finish, expert_alignment=1, **kwargs):
        super().__init__(**kwargs)
        self.async_finish = async_finish
        self.expert_alignment = expert_alignment

    def _get_buffer(self):
        DeepEPBuffer.set_dispatch_mode_as_normal()
        return self._buffer()

    def dispatch_a(self, hidden_states, topk_output):
        topk_ids = topk_output.topk_ids.to(torch.int64)
        previous_event = deep_ep.Buffer.capture() if self.async_finish else None
        return hidden_states, topk_ids, topk_output.topk_weights, previous_event

    def dispatch_b(self, hidden_states, topk_ids, topk_weights, previous_event):
        buffer = self._get_buffer()
        per_rank, per_rdma_rank, per_expert, in_rank, previous_event = buffer.get_dispatch_layout(
            topk_ids, self.num_experts, previous_event=previous_event, async_finish=self.async_finish,
            allocate_on_comm_stream=previous_event is not None)
        recv_x, recv_ids, recv_weights, per_expert_list, self.handle, event = buffer.dispatch(
            hidden_states, topk_idx=topk_ids, topk_weights=topk_weights.float(),
            num_tokens_per_rank=per_rank, num_tokens_per_rdma_rank=per_rdma_rank,
            is_token_in_rank=in_rank, num_tokens_per_expert=per_expert, previous_event=previous_event,
            async_finish=self.async_finish,
            allocate_on_comm_stream=(previous_event is not None) and self.async_finish,
            expert_alignment=self.expert_alignment,
            config=DeepEPConfig.get_instance().normal_dispatch_config)
        if self.async_finish:
            event.current_stream_wait()
        if isinstance(recv_x, tuple):
            recv_x, scale = recv_x
        else:
            scale = None
        return DeepEPNormalDispatchOutput(recv_x, scale, recv_ids, recv_weights, per_expert_list)

    def combine_a(self, hidden_states, topk_ids, topk_weights):
        previous_event = deep_ep.Buffer.capture() if self.async_finish else None
        return hidden_states, previous_event

    def combine_b(self, hidden_states, previous_event):
        buffer = self._get_buffer()
        combined, _, event = buffer.combine(
            hidden_states, self.handle, async_finish=self.async_finish, previous_event=previous_event,
            allocate_on_comm_stream=previous_event is not None,
            config=DeepEPConfig.get_instance().normal_combine_config)
        if self.async_finish:
            event.current_stream_wait()
        self.handle = None
        return combined


class _LowLatencyImpl(_ImplBase):
    def __init__(self, return_recv_hook, use_fp8=False, **kwargs):
        super().__init__(**kwargs)
        self.return_recv_hook = return_recv_hook
        self.use_fp8 = use_fp8
        self.packed_recv_count = None

    def _get_buffer(self):
        DeepEPBuffer.set_dispatch_mode_as_low_latency()
        return self._buffer()

    def dispatch_a(self, hidden_states, topk_output):
        buffer = self._get_buffer()
        topk_ids = topk_output.topk_ids.to(torch.int64)
        if hidden_states.shape[0] > self.num_max_dispatch_tokens_per_rank:
            raise ValueError(f"low-latency dispatch of {hidden_states.shape[0]} tokens: at most "
                             f"num_max_dispatch_tokens_per_rank={self.num_max_dispatch_tokens_per_rank}")
        expected_m = (hidden_states.shape[0] * buffer.group_size * topk_ids.shape[1]
                      + self.num_experts) // self.num_experts
        packed, self.packed_recv_count, self.handle, event, hook = buffer.low_latency_dispatch(
            hidden_states, topk_ids, self.num_max_dispatch_tokens_per_rank, self.num_experts,
            use_fp8=self.use_fp8, async_finish=not self.return_recv_hook,
            return_recv_hook=self.return_recv_hook)
        return packed, topk_ids, topk_output.topk_weights, self.packed_recv_count, expected_m, event, hook

    def dispatch_b(self, hidden_states, topk_ids, topk_weights, masked_m, expected_m, event, hook):
        hook() if self.return_recv_hook else event.current_stream_wait()
        if isinstance(hidden_states, tuple):
            hidden_states, scale = hidden_states
        else:
            scale = None
        return DeepEPLLDispatchOutput(hidden_states, scale, topk_ids, topk_weights, masked_m, expected_m)

    def combine_a(self, hidden_states, topk_ids, topk_weights):
        buffer = self._get_buffer()
        combined, event, hook = buffer.low_latency_combine(
            x=hidden_states, topk_idx=topk_ids, topk_weights=topk_weights.float(), handle=self.handle,
            async_finish=not self.return_recv_hook, return_recv_hook=self.return_recv_hook)
        self.packed_recv_count = self.handle = None
        return combined, event, hook

    def combine_b(self, hidden_states, event, hook):
        hook() if self.return_recv_hook else event.current_stream_wait()
        return hidden_states


_INITIAL, _AFTER_DISPATCH_A, _AFTER_DISPATCH_B, _AFTER_COMBINE_A = range(4)


class DeepEPDispatcher:
    """SGLang's ``DeepEPDispatcher``. ``deepep_mode``: a :class:`DeepEPMode` or its value string.
    ``num_max_dispatch_tokens_per_rank``: default ``SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK``
    or 128 (at most 1024, as SGLang asserts). ``use_fp8``: low-latency FP8 dispatch (the expert
    side then gets ``(e4m3 data, scales)``; off by default here). ``expert_alignment``: normal
    mode's per-expert count alignment (SGLang: 128 with DeepGEMM, else 1)."""

    def __init__(self, group, router_topk, permute_fusion=False, num_experts=None, num_local_experts=None,
                 hidden_size=None, params_dtype=torch.bfloat16, deepep_mode=DeepEPMode.AUTO,
                 async_finish=False, return_recv_hook=False, *, num_max_dispatch_tokens_per_rank=None,
                 use_fp8=False, expert_alignment=1):
        self.group = group
        self.deepep_mode = DeepEPMode(deepep_mode)
        if num_max_dispatch_tokens_per_rank is None:
            num_max_dispatch_tokens_per_rank = int(
                os.environ.get("SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK", "128"))
        assert num_max_dispatch_tokens_per_rank <= 1024
        self.num_max_dispatch_tokens_per_rank = num_max_dispatch_tokens_per_rank
        if num_local_experts is None:
            num_local_experts = num_experts // group.size()
        common = dict(group=group, router_topk=router_topk, num_experts=num_experts,
                      num_local_experts=num_local_experts, hidden_size=hidden_size, params_dtype=params_dtype,
                      deepep_mode=self.deepep_mode,
                      num_max_dispatch_tokens_per_rank=num_max_dispatch_tokens_per_rank)
        if self.deepep_mode.enable_low_latency():
            self._low_latency_dispatcher = _LowLatencyImpl(return_recv_hook=return_recv_hook, use_fp8=use_fp8,
                                                           **common)
        if self.deepep_mode.enable_normal():
            self._normal_dispatcher = _NormalImpl(async_finish=async_finish, expert_alignment=expert_alignment,
                                                  **common)
        self._stage = _INITIAL
        self._is_extend_in_batch = None
        self._impl = None
        self.resolved_mode = None

    def set_is_extend_in_batch(self, flag):
        """Fix auto mode's choice for the next calls (SGLang's global ``is_extend_in_batch``,
        which must be the same on every rank); None: decide from the batch sizes."""
        self._is_extend_in_batch = flag

    def dispatch(self, hidden_states, topk_output):
        self.dispatch_a(hidden_states, topk_output)
        return self.dispatch_b()

    def dispatch_a(self, hidden_states, topk_output):
        self._update_stage(_INITIAL, _AFTER_DISPATCH_A)
        self._impl = self._resolve(hidden_states.shape[0])
        self._dispatch_state = self._impl.dispatch_a(hidden_states=hidden_states, topk_output=topk_output)

    def dispatch_b(self):
        self._update_stage(_AFTER_DISPATCH_A, _AFTER_DISPATCH_B)
        state, self._dispatch_state = self._dispatch_state, None
        return self._impl.dispatch_b(*state)

    def combine(self, combine_input):
        self.combine_a(combine_input)
        return self.combine_b()

    def combine_a(self, combine_input):
        hidden_states, topk_ids, topk_weights = combine_input
        self._update_stage(_AFTER_DISPATCH_B, _AFTER_COMBINE_A)
        self._combine_state = self._impl.combine_a(hidden_states=hidden_states, topk_ids=topk_ids,
                                                   topk_weights=topk_weights)

    def combine_b(self):
        self._update_stage(_AFTER_COMBINE_A, _INITIAL)
        state, self._combine_state = self._combine_state, None
        return self._impl.combine_b(*state)

    def _resolve(self, num_tokens):
        if self.deepep_mode == DeepEPMode.AUTO:
            extend = self._is_extend_in_batch
            if extend is None:
                largest = torch.tensor([num_tokens], dtype=torch.int64)
                dist.all_reduce(largest, op=dist.ReduceOp.MAX, group=self.group)
                extend = int(largest) > self.num_max_dispatch_tokens_per_rank
            mode = self.deepep_mode.resolve(extend)
        else:
            mode = self.deepep_mode
        self.resolved_mode = mode
        return self._normal_dispatcher if mode == DeepEPMode.NORMAL else self._low_latency_dispatcher

    def _update_stage(self, old, new):
        assert self._stage == old, f"DeepEPDispatcher: call out of order (stage {self._stage}, expected {old})"
        self._stage = new


__all__ = [
    "DeepEPBuffer",
    "DeepEPConfig",
    "DeepEPDispatcher",
    "DeepEPLLCombineInput",
    "DeepEPLLDispatchOutput",
    "DeepEPMode",
    "DeepEPNormalCombineInput",
    "DeepEPNormalDispatchOutput",
    "TopKOutput",
]
