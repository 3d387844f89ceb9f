"""Megatron-LM's ``megatron/core/transformer/moe/fused_a2a.py`` (DeepEP backend of the flex token
dispatcher) on ProxyEP: the same names, signatures and returns, so that

    from megatron.core.transformer.moe.fused_a2a import (fused_combine, fused_dispatch, ...)

in ``megatron/core/transformer/moe/token_dispatcher.py`` becomes

    from proxyep.adapters.megatron import (fused_combine, fused_dispatch, ...)

(docs/ADAPTERS.md; docs/DEEPEP_CONTRACT.md 7.1 for the calls Megatron makes).

* ``fused_dispatch(x, token_indices, token_probs, num_experts, group, async_finish=False,
  allocate_on_comm_stream=False)`` -> ``(recv_x, recv_token_indices, recv_token_probs,
  tokens_per_expert, handle)``: layout + dispatch; ``recv_token_indices`` are local expert ids
  (-1 for slots whose expert lives on another rank), ``recv_token_probs`` float32 (zero at those
  slots), ``tokens_per_expert`` an int64 tensor (``torch.tensor(list)``, as Megatron), ``handle``
  the dispatch handle. Backward: combine of the gradients of ``recv_x`` and
  ``recv_token_probs`` (the combined weights are the gradient of ``token_probs``).
* ``fused_combine(x, group, handle, async_finish=False, allocate_on_comm_stream=False)`` ->
  ``(combined_x, None)`` (current Megatron's ``FusedCombine`` returns a pair; older releases
  returned the tensor alone); backward: cached dispatch of the gradient.
* ``set_deepep_num_sms(num_sms)`` -> ``deep_ep.Buffer.set_num_sms``.
* ``get_buffer(group, hidden_bytes)``: one ``deep_ep.Buffer`` cached for the process, sized from
  the dispatch and combine configs' NVL/RDMA size hints, re-created when the group differs or a
  larger size is needed (Megatron's rule; the old Buffer is dropped).
* ``get_hidden_bytes(x)`` = ``x.size(1) * max(x.element_size(), 2)``.
* ``hybrid_ep_dispatch`` / ``hybrid_ep_combine`` are None and ``HAVE_HYBRIDEP`` is False (as in
  Megatron without DeepEP's HybridEP): ``--moe-flex-dispatcher-backend hybridep`` is not served.

The autograd functions are ``proxyep.moe.DispatchFunction`` / ``CombineFunction`` (exchange.py).

Differences from Megatron over DeepEP:

* bf16 tokens only (what the exchange moves); ``token_probs`` are cast to float32 (DeepEP needs
  float32 probs; Megatron recommends ``--moe-router-dtype fp32``).
* Tested with CPU tensors (CUDA tensors go to deep_ep as given, never run); every call is
  synchronous. ``async_finish`` and
  ``allocate_on_comm_stream`` are accepted (Megatron-core 0.17 passes True for both) and the
  exchange is complete when the call returns, which is what Megatron's
  ``after_event.current_stream_wait()`` waits for; no overlap with compute.
* Backward uses the Buffer the forward used (Megatron looks it up again with ``get_buffer``: the
  same Buffer unless it was re-created in between, which would invalidate a DeepEP handle too).
* ``FusedDispatch`` / ``FusedCombine`` (the autograd classes themselves) are not exported; code
  that monkey-patches them must patch ``proxyep.moe.exchange`` instead.
"""

import deep_ep
import torch

from ..moe.exchange import CombineFunction, DispatchFunction

HAVE_DEEP_EP = True
HAVE_HYBRIDEP = False

_buffer = None


def get_hidden_bytes(x: torch.Tensor) -> int:
    """Bytes of one token row for the size hints: hidden size times max(element size, 2)."""
    return x.size(1) * max(x.element_size(), 2)


def get_buffer(group, hidden_bytes: int):
    """The process's ``deep_ep.Buffer`` for ``group``, large enough for rows of ``hidden_bytes``
    (the max of the dispatch and combine configs' size hints); created on first use and
    re-created when the group differs or the sizes grow."""
    global _buffer
    size = group.size()
    num_nvl_bytes, num_rdma_bytes = 0, 0
    for config in (deep_ep.Buffer.get_dispatch_config(size), deep_ep.Buffer.get_combine_config(size)):
        num_nvl_bytes = max(config.get_nvl_buffer_size_hint(hidden_bytes, size), num_nvl_bytes)
        num_rdma_bytes = max(config.get_rdma_buffer_size_hint(hidden_bytes, size), num_rdma_bytes)
    if (_buffer is None or _buffer.group != group or _buffer.num_nvl_bytes < num_nvl_bytes
            or _buffer.num_rdma_bytes < num_rdma_bytes):
        _buffer = None  # drop the old one first: one Buffer per process at a time, as Megatron
        _buffer = deep_ep.Buffer(group, num_nvl_bytes, num_rdma_bytes)
    return _buffer


def reset_buffer():
    """ProxyEP only: drop the cached Buffer (tests; a group being torn down)."""
    global _buffer
    _buffer = None


def fused_dispatch(x, token_indices, token_probs, num_experts, group, async_finish=False,
                   allocate_on_comm_stream=False):
    """Dispatch ``x`` [tokens, hidden] (bf16) to the ranks of the experts in ``token_indices``
    [tokens, topk] (int64, -1 = dropped) with ``token_probs`` [tokens, topk]. Returns
    ``(recv_x, recv_token_indices, recv_token_probs, tokens_per_expert, handle)``; differentiable
    in ``x`` and ``token_probs``. ``async_finish`` / ``allocate_on_comm_stream``: accepted, the
    call is synchronous (see the module docstring)."""
    _check_flags(async_finish, allocate_on_comm_stream)
    x = x.contiguous()
    buffer = get_buffer(group, get_hidden_bytes(x))
    return DispatchFunction.apply(x, token_indices.to(torch.int64), token_probs.float(), buffer, num_experts)


def fused_combine(x, group, handle, async_finish=False, allocate_on_comm_stream=False):
    """Sum the expert outputs ``x`` [received rows, hidden] (bf16, already weighted by the
    expert side) back to the ranks and tokens they came from with the dispatch ``handle``.
    Returns ``(combined_x, None)`` as Megatron's ``FusedCombine``; differentiable in ``x``."""
    _check_flags(async_finish, allocate_on_comm_stream)
    buffer = get_buffer(group, get_hidden_bytes(x))
    return CombineFunction.apply(x, buffer, handle), None


def set_deepep_num_sms(num_sms):
    """Sets the SM count of the default dispatch/combine configs (``Buffer.set_num_sms``)."""
    deep_ep.Buffer.set_num_sms(num_sms)


def _check_flags(async_finish, allocate_on_comm_stream):
    # Megatron passes allocate_on_comm_stream with async_finish (and its own previous event);
    # the synchronous exchange here needs neither. Only a nonsensical combination is refused.
    if allocate_on_comm_stream and not async_finish:
        raise ValueError("allocate_on_comm_stream needs async_finish (as in DeepEP)")


hybrid_ep_dispatch = None
hybrid_ep_combine = None


def init_hybrid_ep_buffer(*args, **kwargs):
    raise NotImplementedError("HybridEP (--moe-flex-dispatcher-backend hybridep) is not provided by ProxyEP")


def reset_hybrid_ep_buffer():
    """Nothing to reset: HybridEP is not provided."""


__all__ = [
    "HAVE_DEEP_EP",
    "HAVE_HYBRIDEP",
    "fused_combine",
    "fused_dispatch",
    "get_buffer",
    "get_hidden_bytes",
    "hybrid_ep_combine",
    "hybrid_ep_dispatch",
    "init_hybrid_ep_buffer",
    "reset_buffer",
    "reset_hybrid_ep_buffer",
    "set_deepep_num_sms",
]
