"""deep_ep.Buffer: DeepEP V1's Buffer (docs/DEEPEP_CONTRACT.md sections 1-2) over ProxyEP's native
Buffer, with DeepEP's argument names, order, defaults and return tuples.

Tensors: CUDA tensors where this ProxyEP was built with CUDA and torch sees a GPU (the Buffer then
has a device: the GPU current when it is made, ``torch.cuda.current_device()``, as DeepEP's), CPU
tensors always (a call's tensors are all on one side). ``device=`` (ProxyEP only) chooses
otherwise: "host", "cuda", or "simulated" (the host-simulated device that stands for a GPU in
tests: every tensor of a call is then its memory, made with ``proxyep.to_device``).

Streams, with CUDA tensors: the Buffer's device has its own stream (``get_comm_stream()``). A call
without ``previous_event`` makes it wait for torch's current stream (DeepEP's default), with one
for that event; outputs are complete when the call returns (or its event is waited for or its hook
called), so the current stream may use them at once. They are allocated on the Buffer's stream
(always: ``allocate_on_comm_stream`` is checked as DeepEP checks it), and released there once
torch frees them, after what the current stream had queued by then (a kernel still reading them
runs first).

Without a device, streams do not exist; the Buffer's communication thread stands for DeepEP's
comm stream: ``async_finish=True`` returns as soon as the outputs exist (a normal dispatch after
its notify phase, which sizes them; a combine and a low-latency call at once) with an
``EventOverlap`` whose event is set when the call finished on that thread, and every later call
of the Buffer first finishes it (stream order). ``previous_event`` is waited for before the call.
"""

import torch

import proxyep
from proxyep import _proxyep
from proxyep._tensors import FP8_DTYPE, tensor, view

from ..utils.event import EventHandle, EventOverlap, cuda_available


class _Handle(tuple):
    """A DeepEP handle tuple that also carries the native handle (``native``)."""

    def __new__(cls, items, native):
        obj = super().__new__(cls, items)
        obj.native = native
        return obj


class _NormalHandle(_Handle):
    """DeepEP's normal-mode handle: the intranode 6-tuple (rank_prefix_matrix,
    channel_prefix_matrix, recv_channel_prefix_matrix, recv_src_idx, is_token_in_rank,
    send_head) on one node, the internode 10-tuple (is_token_in_rank at [0],
    recv_gbl_rank_prefix_sum at [-4], send head at [-1]) across nodes. ProxyEP has no channels:
    those entries are None; what its forwarders keep (ep.internode=hierarchical) is in
    ``native``, which combine and cached dispatch use."""


class _LowLatencyHandle(_Handle):
    """DeepEP's LL 5-tuple (src_info, layout_range, num_max_dispatch_tokens_per_rank, hidden,
    num_experts); ``native`` is what combine uses."""


def _event(async_finish, native=None, extra_tensors=None, device=None):
    if not async_finish:
        return EventOverlap(None)
    return EventOverlap(EventHandle(native, device), extra_tensors)


def _open_device(device):
    """The native Device of ``device`` (None, "host", "simulated", "cuda" or a _proxyep.Device);
    None: host tensors only."""
    if isinstance(device, _proxyep.Device):
        return device
    if device is None:
        device = "cuda" if _proxyep.built_with_cuda() and cuda_available() else "host"
    if device == "host":
        return None
    if device == "cuda":
        # Without CUDA in this build or a GPU the native open refuses, with the reason.
        return _proxyep.Device.open("cuda", torch.cuda.current_device() if cuda_available() else 0)
    if device == "simulated":
        return _proxyep.Device.open("simulated")
    raise ValueError(f"device must be None, 'host', 'cuda', 'simulated' or a Device; got {device!r}")


def _small(t):
    """Routing metadata ([tokens, top-k]) in the contiguous form the runtime reads; autograd
    hands gradients of it in strided forms (an expanded sum). Row data is never copied. The
    caller must hold the result for the call: a view does not keep its tensor alive."""
    return t.contiguous() if isinstance(t, torch.Tensor) else t


def _biases(bias):
    """(bias0, bias1) of a combine's ``bias``: None, a tensor, or a tuple of at most two."""
    if bias is None:
        return None, None
    if isinstance(bias, torch.Tensor):
        return bias, None
    biases = tuple(bias) + (None,) * (2 - len(bias))
    if len(biases) != 2:
        raise ValueError("bias must be None, a tensor or a tuple of at most two tensors")
    return biases


def _refuse(flag, what):
    if flag:
        raise proxyep.ProxyEPError(f"{what} is not supported by ProxyEP")


class Buffer:
    """The communication buffer of an expert-parallel group (DeepEP's deep_ep.Buffer)."""

    #: Class-wide SM count of the default configs (DeepEP's Buffer.num_sms).
    num_sms = 20

    def __init__(
        self,
        group=None,
        num_nvl_bytes=0,
        num_rdma_bytes=0,
        low_latency_mode=False,
        num_qps_per_rank=24,
        allow_nvlink_for_low_latency_mode=True,
        allow_mnnvl=False,
        use_fabric=False,
        explicitly_destroy=False,
        enable_shrink=False,
        comm=None,
        *,
        ranks_per_node=None,
        device=None,
        internode=None,
        timeout_ms=0,
    ):
        """Collective over ``group`` (any torch.distributed group, gloo included; None = the
        default group) or the mpi4py ``comm``. ProxyEP only: ``ranks_per_node`` overrides the node
        layout taken from LOCAL_WORLD_SIZE; ``device`` says where tensors live (the module's
        docstring); ``internode`` ('per_rank' or 'hierarchical') overrides ep.internode for this
        Buffer, and ``timeout_ms`` (> 0) ep.timeout_ms for its host waits (device waits keep
        ep.timeout_ms). ElasticBuffer sets both from its own arguments."""
        for name, value in (("num_nvl_bytes", num_nvl_bytes), ("num_rdma_bytes", num_rdma_bytes)):
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a non-negative int, got {value!r}")
        self.group = group
        self.comm = comm
        self.num_nvl_bytes = num_nvl_bytes
        self.num_rdma_bytes = num_rdma_bytes
        self.low_latency_mode = low_latency_mode
        self.explicitly_destroy = explicitly_destroy
        self.enable_shrink = enable_shrink
        self.allow_mnnvl = allow_mnnvl
        self.use_fabric = use_fabric
        self.runtime = None
        #: The native Device of this Buffer's device tensors, or None (host tensors only).
        self.device = _open_device(device)
        self._cuda = self.device is not None and self.device.kind == "cuda"
        # The simulated device's memory is host memory: its tensors are flagged device memory.
        self._simulated = self.device is not None and not self._cuda
        self._side_stream = None
        self._comm_stream = None
        rendezvous = proxyep.rendezvous(group, comm, ranks_per_node)
        staging = num_rdma_bytes
        if staging == 0 and not low_latency_mode and rendezvous.world_size > rendezvous.ranks_per_node:
            # DeepEP's hints give no RDMA bytes up to 8 ranks (its nodes have 8 GPUs); ProxyEP's
            # nodes are LOCAL_WORLD_SIZE ranks, and rows to other nodes need staging. Calls
            # stream through it in chunks, so the NVL size (at least 1 MiB) is enough.
            staging = max(num_nvl_bytes, 1 << 20)
        self.runtime = _proxyep.Buffer(rendezvous, _proxyep.BufferOptions(
            num_nvl_bytes=num_nvl_bytes,
            num_rdma_bytes=staging,
            low_latency_mode=low_latency_mode,
            num_qps_per_rank=num_qps_per_rank,
            allow_nvlink_for_low_latency_mode=allow_nvlink_for_low_latency_mode,
            enable_shrink=enable_shrink,
            explicitly_destroy=explicitly_destroy,
            device=self.device,
            internode=internode,
            timeout_ms=timeout_ms,
        ))
        self.rank = self.runtime.rank
        self.group_size = self.runtime.group_size
        self.ranks_per_node = self.runtime.ranks_per_node
        self.num_nodes = self.group_size // self.ranks_per_node
        self._destroyed = False
        self._inputs_in_flight = None

    # ---- lifecycle ----

    def destroy(self):
        """Collective; needs ``explicitly_destroy=True`` (as DeepEP). Every later call raises."""
        assert self.explicitly_destroy, "`explicitly_destroy` flag must be set"
        self.runtime.destroy()
        self.runtime.close()
        self._destroyed = True

    def __del__(self):
        runtime = getattr(self, "runtime", None)
        if runtime is not None:
            runtime.close()

    # ---- static helpers ----

    @staticmethod
    def set_num_sms(new_num_sms):
        assert new_num_sms % 2 == 0, "The SM count must be even"
        proxyep.set_num_sms(new_num_sms)
        Buffer.num_sms = new_num_sms

    @staticmethod
    def capture():
        """The current end of torch's current stream (with CUDA; else a complete event)."""
        return EventOverlap(EventHandle())

    @staticmethod
    def is_sm90_compiled():
        return True

    @staticmethod
    def get_low_latency_rdma_size_hint(num_max_dispatch_tokens_per_rank, hidden, num_ranks, num_experts):
        return proxyep.get_low_latency_rdma_size_hint(
            num_max_dispatch_tokens_per_rank, hidden, num_ranks, num_experts
        )

    @staticmethod
    def get_dispatch_config(num_ranks):
        return proxyep.get_dispatch_config(num_ranks)

    @staticmethod
    def get_combine_config(num_ranks):
        return proxyep.get_combine_config(num_ranks)

    def get_comm_stream(self):
        """The Buffer's stream as a torch stream (``torch.cuda.ExternalStream``) with CUDA;
        None otherwise (no streams on the CPU, none of torch's on the simulated device)."""
        if not self._cuda:
            return None
        if self._comm_stream is None:
            self._comm_stream = torch.cuda.ExternalStream(self.device.stream)
        return self._comm_stream

    # ---- streams and tensors of the calls ----

    def _streams(self):
        """The device whose streams are the caller's (CUDA), for events waited for on them."""
        return self.device if self._cuda else None

    def _view(self, t, name, fp8=False):
        return view(t, name, fp8, self._simulated)

    def _order(self, previous_event, async_finish, allocate_on_comm_stream, capturable=False):
        """What orders the call after the caller's work: the pair (previous_event, caller_stream),
        an event of this Buffer's device or None (the native argument classes' previous_event)
        and torch's current stream with CUDA, else 0 (the native calls' caller_stream).
        ``capturable`` (the low-latency calls): while torch's stream captures a CUDA graph the
        call joins the capture (the native side records the point inside it, the Buffer's stream
        waits for it, torch's stream waits for the call's end)."""
        if allocate_on_comm_stream:
            assert previous_event is not None and async_finish, (
                "allocate_on_comm_stream needs previous_event and async_finish (as in DeepEP)"
            )
        stream = 0
        if self._cuda:
            # Refused before any stream is touched (the native side refuses too, naming why).
            if torch.cuda.is_current_stream_capturing() and not capturable:
                raise proxyep.ProxyEPError(
                    "CUDA graph capture: only the low-latency calls can be captured; "
                    "this call waits on the host, so make it outside graph capture (SGLang: "
                    "--disable-cuda-graph; vLLM: enforce_eager=True)")
            stream = torch.cuda.current_stream().cuda_stream
        # An EventOverlap without an event orders nothing (DeepEP passes its .event, None here).
        event = previous_event.event if previous_event is not None else None
        if event is None:
            return None, stream
        if event.torch_event is None or not self._cuda:
            event.current_stream_wait()  # ProxyEP's work in the background: joined on the host
            if event.torch_event is not None:
                event.torch_event.synchronize()  # a host call reads what that stream made
            return None, stream
        # The Buffer's stream waits for the torch event: through a side stream of torch's that
        # waits for it, whose end the device records (no host wait).
        if self._side_stream is None:
            self._side_stream = torch.cuda.Stream()
        self._side_stream.wait_event(event.torch_event)
        return self.device.record_on(self._side_stream.cuda_stream), stream

    def get_local_buffer_tensor(self, dtype, size=None, offset=0, use_rdma_buffer=False):
        """A raw view of this rank's NVL buffer (where node peers' rows land, ``num_nvl_bytes``;
        with the landing region on, a dispatch's token bytes from node peers go straight into
        ``recv_x`` and only the rest of each row lands here) or RDMA buffer (rows staged for other nodes, ``num_rdma_bytes``; only when the group
        spans nodes), ``offset`` bytes in: ``size`` elements of ``dtype``, or as many as fit.
        Every call rewrites these bytes. The tensor keeps the Buffer alive; after ``destroy()``
        it must not be used (as in DeepEP)."""
        raw = tensor(self.runtime.local_buffer(use_rdma_buffer, self))  # uint8, the whole area
        element = torch.empty((), dtype=dtype).element_size()
        if not isinstance(offset, int) or offset < 0 or offset > raw.numel() or offset % element:
            raise ValueError(f"offset {offset!r} must be a multiple of {element} in [0, {raw.numel()}]")
        fits = (raw.numel() - offset) // element
        flat = raw[offset:offset + fits * element].view(dtype)
        if size is None:
            return flat
        numel = 1
        for n in size:
            numel *= n
        if numel > fits:
            raise ValueError(f"{numel} elements of {dtype} from offset {offset} exceed the buffer "
                             f"({raw.numel()} bytes)")
        return flat[:numel].view(size)

    def stats(self):
        """ProxyEP only: what this rank's calls moved (native BufferStats)."""
        return self.runtime.stats()

    @property
    def metrics_port(self):
        """ProxyEP only: the port of this rank's Prometheus endpoint (PROXYEP_METRICS_PORT), or -1."""
        return self.runtime.metrics_port

    # ---- normal mode ----

    def get_dispatch_layout(
        self, topk_idx, num_experts, previous_event=None, async_finish=False, allocate_on_comm_stream=False
    ):
        previous, stream = self._order(previous_event, async_finish, allocate_on_comm_stream)
        per_rank, per_rdma_rank, per_expert, in_rank = self.runtime.get_dispatch_layout(
            self._view(topk_idx, "topk_idx"), num_experts, previous_event=previous, caller_stream=stream
        )
        return (
            tensor(per_rank),
            tensor(per_rdma_rank),
            tensor(per_expert),
            tensor(in_rank, torch.bool),
            _event(async_finish),
        )

    def dispatch(
        self,
        x,
        handle=None,
        num_tokens_per_rank=None,
        num_tokens_per_rdma_rank=None,
        is_token_in_rank=None,
        num_tokens_per_expert=None,
        topk_idx=None,
        topk_weights=None,
        expert_alignment=1,
        num_worst_tokens=0,
        config=None,
        previous_event=None,
        async_finish=False,
        allocate_on_comm_stream=False,
    ):
        previous, stream = self._order(previous_event, async_finish, allocate_on_comm_stream)
        fp8 = isinstance(x, tuple)
        if fp8:
            if len(x) != 2:
                raise ValueError("an FP8 x must be the tuple (x_e4m3, x_scales)")
            x_data, x_scales = x
        else:
            x_data, x_scales = x, None
        if handle is not None and not isinstance(handle, _NormalHandle):
            raise TypeError("handle must be the one a dispatch of this Buffer returned")
        native_handle = handle.native if handle is not None else None
        topk_idx, topk_weights = _small(topk_idx), _small(topk_weights)
        inputs = (x_data, x_scales, topk_idx, topk_weights, handle)
        args = _proxyep.DispatchArgs(
            x=self._view(x_data, "x", fp8=fp8),
            x_scales=self._view(x_scales, "x_scales"),
            handle=native_handle,
            num_tokens_per_rank=self._view(num_tokens_per_rank, "num_tokens_per_rank"),
            num_tokens_per_rdma_rank=self._view(num_tokens_per_rdma_rank, "num_tokens_per_rdma_rank"),
            is_token_in_rank=self._view(is_token_in_rank, "is_token_in_rank"),
            num_tokens_per_expert=self._view(num_tokens_per_expert, "num_tokens_per_expert"),
            topk_idx=self._view(topk_idx, "topk_idx"),
            topk_weights=self._view(topk_weights, "topk_weights"),
            expert_alignment=expert_alignment,
            num_worst_tokens=num_worst_tokens,
            # An explicit Config's RDMA chunk sizes chunk the streams to other nodes; None leaves
            # chunking to the Buffer's slots (DeepEP's default tables suit its kernels' buffers).
            config=config,
            async_finish=async_finish,
            previous_event=previous,
        )
        recv_x, recv_scales, recv_idx, recv_weights, per_expert, new_handle, native_event = (
            self.runtime.dispatch(args, caller_stream=stream))
        self._hold_inputs(async_finish, inputs)
        recv = (tensor(recv_x, FP8_DTYPE), tensor(recv_scales)) if fp8 else tensor(recv_x)
        event = _event(async_finish, native_event, inputs, self._streams())
        if handle is not None:
            return recv, None, None, None, None, event
        return (
            recv,
            tensor(recv_idx),
            tensor(recv_weights),
            per_expert,
            self._normal_handle(new_handle, is_token_in_rank, stream),
            event,
        )

    def _normal_handle(self, native, is_token_in_rank, caller_stream):
        prefix, src_idx, runtime_in_rank, send_head = (
            self.runtime.normal_handle_tensors(native, caller_stream))
        prefix = tensor(prefix)  # [R, R]: inclusive prefix over source ranks
        # The routing the caller passed is the handle's (as in DeepEP); the runtime's copy of it
        # only when it came in another form.
        in_rank = is_token_in_rank
        if not (isinstance(in_rank, torch.Tensor) and in_rank.dtype == torch.bool and in_rank.dim() == 2):
            in_rank = tensor(runtime_in_rank, torch.bool)
        src_idx, send_head = tensor(src_idx), tensor(send_head)
        if self.num_nodes == 1:
            items = (prefix, None, None, src_idx, in_rank, send_head)
        else:  # [-4]: rows received from ranks 0..s, inclusive (recv_gbl_rank_prefix_sum)
            items = (in_rank, None, None, None, None, None, prefix[:, self.rank], None, None, send_head)
        return _NormalHandle(items, native)

    def internode_dispatch(self, x, handle=None, num_tokens_per_rank=None, num_tokens_per_rdma_rank=None,
                           is_token_in_rank=None, num_tokens_per_expert=None, topk_idx=None,
                           topk_weights=None, expert_alignment=1, config=None, previous_event=None,
                           async_finish=False, allocate_on_comm_stream=False):
        return self.dispatch(x, handle, num_tokens_per_rank, num_tokens_per_rdma_rank, is_token_in_rank,
                             num_tokens_per_expert, topk_idx, topk_weights, expert_alignment, 0, config,
                             previous_event, async_finish, allocate_on_comm_stream)

    def combine(
        self,
        x,
        handle,
        topk_weights=None,
        bias=None,
        config=None,
        previous_event=None,
        async_finish=False,
        allocate_on_comm_stream=False,
    ):
        previous, stream = self._order(previous_event, async_finish, allocate_on_comm_stream)
        if not isinstance(handle, _NormalHandle):
            raise TypeError("handle must be the one a dispatch of this Buffer returned")
        biases = _biases(bias)
        topk_weights = _small(topk_weights)
        inputs = (x, topk_weights, biases, handle)
        args = _proxyep.CombineArgs(
            x=self._view(x, "x"),
            handle=handle.native,
            topk_weights=self._view(topk_weights, "topk_weights"),
            bias0=self._view(biases[0], "bias[0]"),
            bias1=self._view(biases[1], "bias[1]"),
            config=config,
            async_finish=async_finish,
            previous_event=previous,
        )
        combined, combined_weights, native_event = self.runtime.combine(args, caller_stream=stream)
        self._hold_inputs(async_finish, inputs)
        return (tensor(combined), tensor(combined_weights),
                _event(async_finish, native_event, inputs, self._streams()))

    def _hold_inputs(self, async_finish, inputs):
        """The runtime reads an async_finish call's inputs (views: they do not keep their tensors
        alive) until the call ends, at the latest when the next call starts (it finishes the
        calls before it first): held here until then, whatever the caller drops."""
        self._inputs_in_flight = inputs if async_finish else None

    def internode_combine(self, x, handle, topk_weights=None, bias=None, config=None, previous_event=None,
                          async_finish=False, allocate_on_comm_stream=False):
        return self.combine(x, handle, topk_weights, bias, config, previous_event, async_finish,
                            allocate_on_comm_stream)

    # ---- low-latency mode ----

    def clean_low_latency_buffer(self, num_max_dispatch_tokens_per_rank, hidden, num_experts):
        self.runtime.clean_low_latency_buffer(num_max_dispatch_tokens_per_rank, hidden, num_experts)

    def low_latency_dispatch(
        self,
        x,
        topk_idx,
        num_max_dispatch_tokens_per_rank,
        num_experts,
        cumulative_local_expert_recv_stats=None,
        dispatch_wait_recv_cost_stats=None,
        use_fp8=True,
        round_scale=False,
        use_ue8m0=False,
        async_finish=False,
        return_recv_hook=False,
        topk_weights=None,
        x_global_scale=None,
        use_nvfp4=False,
        use_ue8m0_for_sf=False,
    ):
        """The last four are DeepEP branch arguments that SGLang and vLLM forward: accepted;
        NVFP4 is refused."""
        _refuse(use_nvfp4, "use_nvfp4 (NVFP4 dispatch)")
        _refuse(x_global_scale is not None, "x_global_scale (NVFP4 dispatch)")
        _refuse(use_ue8m0_for_sf, "use_ue8m0_for_sf (NVFP4 dispatch)")
        previous, stream = self._order(None, async_finish, False, capturable=True)
        args = _proxyep.LowLatencyDispatchArgs(
            x=self._view(x, "x"),
            topk_idx=self._view(topk_idx, "topk_idx"),
            num_max_dispatch_tokens_per_rank=num_max_dispatch_tokens_per_rank,
            num_experts=num_experts,
            cumulative_local_expert_recv_stats=self._view(
                cumulative_local_expert_recv_stats, "cumulative_local_expert_recv_stats"),
            dispatch_wait_recv_cost_stats=self._view(
                dispatch_wait_recv_cost_stats, "dispatch_wait_recv_cost_stats"),
            use_fp8=use_fp8,
            round_scale=round_scale,
            use_ue8m0=use_ue8m0,
            async_finish=async_finish,
            return_recv_hook=return_recv_hook,
            previous_event=previous,
        )
        recv_x, recv_scales, recv_count, native, event, hook = self.runtime.low_latency_dispatch(
            args, caller_stream=stream)
        local = num_experts // self.group_size
        rows = self.group_size * num_max_dispatch_tokens_per_rank
        packed = tensor(recv_x, FP8_DTYPE if use_fp8 else None).view(local, rows, -1)
        if use_fp8:
            scales = tensor(recv_scales)
            words = scales.shape[0] // local
            # [E_local, R*T, S], column-major in the last two dimensions (DeepEP's TMA layout).
            scales = scales.as_strided((local, rows, words), (words * rows, 1, rows))
            packed = (packed, scales)
        src_info, layout_range = map(tensor, self.runtime.low_latency_handle_tensors(
            native, stream))
        handle = _LowLatencyHandle(
            (src_info, layout_range, native.num_max_dispatch_tokens_per_rank, native.hidden, native.num_experts),
            native,
        )
        return (
            packed,
            tensor(recv_count),
            handle,
            _event(async_finish, event, (x, topk_idx), self._streams()),
            self._hook(hook, (x, topk_idx)),
        )

    def _hook(self, native_hook, keep_alive):
        if native_hook is None:
            return None

        held = list(keep_alive)  # the inputs the background work reads, alive until it is done

        def hook():
            native_hook()
            # A captured call's hook queued its receive into torch's capture, on the Buffer's
            # stream: torch's stream joins it back there.
            point = native_hook.device_point
            if point is not None and self._cuda:
                self.device.stream_wait(point, torch.cuda.current_stream().cuda_stream)
            held.clear()

        return hook

    def low_latency_combine(
        self,
        x,
        topk_idx,
        topk_weights,
        handle,
        use_logfmt=False,
        zero_copy=False,
        async_finish=False,
        return_recv_hook=False,
        out=None,
        combine_wait_recv_cost_stats=None,
        overlap=False,
        src_signals=None,
        src_signal_expect_value=0,
        packed_recv_count=None,
        comp_signal=None,
        block_m=64,
        threshold=0,
        num_sms=3,
    ):
        """The arguments after combine_wait_recv_cost_stats are DeepEP branch arguments (single-
        batch overlap) that SGLang forwards: accepted; overlap=True is refused (it needs GPU
        signals)."""
        _refuse(overlap, "overlap=True (single-batch overlap)")
        if not isinstance(handle, _LowLatencyHandle):
            raise TypeError("handle must be the one a low_latency_dispatch of this Buffer returned")
        topk_idx, topk_weights = _small(topk_idx), _small(topk_weights)
        previous, stream = self._order(None, async_finish, False, capturable=True)
        args = _proxyep.LowLatencyCombineArgs(
            x=None if zero_copy else self._view(x, "x"),
            topk_idx=self._view(topk_idx, "topk_idx"),
            topk_weights=self._view(topk_weights, "topk_weights"),
            handle=handle.native,
            use_logfmt=use_logfmt,
            zero_copy=zero_copy,
            async_finish=async_finish,
            return_recv_hook=return_recv_hook,
            out=self._view(out, "out"),
            combine_wait_recv_cost_stats=self._view(
                combine_wait_recv_cost_stats, "combine_wait_recv_cost_stats"),
            previous_event=previous,
        )
        combined, event, hook = self.runtime.low_latency_combine(args, caller_stream=stream)
        keep = (x, topk_idx, topk_weights, out)
        combined_x = out if out is not None else tensor(combined)
        return combined_x, _event(async_finish, event, keep, self._streams()), self._hook(hook, keep)

    def get_next_low_latency_combine_buffer(self, handle):
        if not isinstance(handle, _LowLatencyHandle):
            raise TypeError("handle must be the one a low_latency_dispatch of this Buffer returned")
        native = handle.native
        local = native.num_experts // self.group_size
        buffer = tensor(self.runtime.get_next_low_latency_combine_buffer(native))
        return buffer.view(local, self.group_size * native.num_max_dispatch_tokens_per_rank, native.hidden)

    def low_latency_update_mask_buffer(self, rank_to_mask, mask=False):
        self.runtime.low_latency_update_mask_buffer(rank_to_mask, mask)

    def low_latency_query_mask_buffer(self, mask_status):
        self.runtime.low_latency_query_mask_buffer(self._view(mask_status, "mask_status"))

    def low_latency_clean_mask_buffer(self):
        self.runtime.low_latency_clean_mask_buffer()
