"""deep_ep with device tensors: the same calls on a Buffer with a device and on one without,
with the same inputs, must give the same outputs (the host path is checked against DeepEP's
invariants by test_intranode.py and test_low_latency.py). The device is the host-simulated one
(PROXYEP_TEST_DEVICE unset or "simulated": every tensor of a call is its memory, which torch sees
as host memory) or the GPU (PROXYEP_TEST_DEVICE=cuda, scripts/gpu-check.sh: CUDA tensors). The
device path must be the one that ran: the Buffer's device counters move (device arenas between
node peers, the device's writes to other nodes), and a host tensor given to a simulated device's
call is refused by the device's address check before anything is sent."""

import os

import pytest
import torch
import torch.distributed as dist

import deep_ep
import proxyep
from conftest import per_token_cast_to_fp8
from proxyep.fp8 import dequantise

KIND = os.environ.get("PROXYEP_TEST_DEVICE", "simulated")
T, H, K, E = 64, 512, 4, 16


def device_counters(buffer):
    s = buffer.stats()
    return s.sends_to_device_arenas + s.writes_from_device


class OnDevice:
    """Moves test tensors to a Buffer's device and back."""

    def __init__(self, buffer):
        self.buffer = buffer

    def __call__(self, t):
        if t is None:
            return None
        if isinstance(t, tuple):
            return tuple(self(u) for u in t)
        if KIND == "cuda":
            return t.cuda()
        return proxyep.to_device(self.buffer.device, t)

    def host(self, t):
        if t is None:
            return None
        if isinstance(t, tuple):
            return tuple(self.host(u) for u in t)
        if KIND == "cuda":
            assert t.is_cuda
            return t.cpu()
        return proxyep.to_host(self.buffer.device, t)


def make_buffers(low_latency):
    R = dist.get_world_size()
    if low_latency:
        rdma = deep_ep.Buffer.get_low_latency_rdma_size_hint(T, H, R, E)
        kwargs = dict(num_nvl_bytes=1 << 22, num_rdma_bytes=rdma, low_latency_mode=True, num_qps_per_rank=E // R)
    else:
        kwargs = dict(num_nvl_bytes=1 << 22, num_rdma_bytes=1 << 22)
    host = deep_ep.Buffer(dist.group.WORLD, device="host", **kwargs)
    device = deep_ep.Buffer(dist.group.WORLD, device=KIND, **kwargs)
    return host, device


@pytest.fixture(scope="module")
def normal():
    return make_buffers(False)


@pytest.fixture(scope="module")
def low_latency():
    return make_buffers(True)


def routing(rank, seed):
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    x = torch.randn(T, H, generator=g).to(torch.bfloat16)
    scores = torch.randn(T, E, generator=g).abs() + 1
    topk_idx = torch.topk(scores, K, dim=-1, sorted=False).indices
    topk_idx[torch.randint(0, T, (5,), generator=g), torch.randint(0, K, (5,), generator=g)] = -1
    weights = torch.rand(T, K, generator=g)
    return x, topk_idx, weights


def finish(event, hook):
    """Completes a call made with return_recv_hook (its hook) or async_finish (its event)."""
    if hook is not None:
        hook()
    elif event.event is not None:
        event.current_stream_wait()


def same(device_out, host_out, to):
    """Outputs of the device Buffer (moved back) equal the host Buffer's, bit for bit."""
    if host_out is None:
        assert device_out is None
        return
    if isinstance(host_out, tuple):
        assert len(device_out) == len(host_out)
        for d, h in zip(device_out, host_out):
            same(d, h, to)
        return
    d = to.host(device_out)
    assert d.dtype == host_out.dtype and d.shape == host_out.shape
    assert torch.equal(d.view(torch.uint8) if d.dtype == torch.bfloat16 else d,
                       host_out.view(torch.uint8) if d.dtype == torch.bfloat16 else host_out)


def test_the_device_is_the_one_asked_for(normal):
    host, device = normal
    assert host.device is None
    assert device.device is not None and device.device.kind == KIND
    if KIND == "cuda":
        assert isinstance(device.get_comm_stream(), torch.cuda.ExternalStream)
    else:
        assert device.get_comm_stream() is None


@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("async_finish", [False, True])
def test_normal_dispatch_and_combine_match_the_host_path(normal, fp8, async_finish):
    host, device = normal
    to = OnDevice(device)
    rank = dist.get_rank()
    x, topk_idx, weights = routing(rank, seed=1 + fp8)
    before = device_counters(device)

    layout_h = host.get_dispatch_layout(topk_idx, E)
    layout_d = device.get_dispatch_layout(to(topk_idx), E, previous_event=deep_ep.Buffer.capture())
    same(layout_d[:4], layout_h[:4], to)

    per_rank, _, per_expert, in_rank, _ = layout_h
    data = per_token_cast_to_fp8(x) if fp8 else x
    args = dict(num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert,
                topk_idx=topk_idx, topk_weights=weights)
    out_h = host.dispatch(data, **args)
    dev_args = {k: to(v) for k, v in args.items()}
    out_d = device.dispatch(to(data), async_finish=async_finish, **dev_args)
    if async_finish:
        assert out_d[5].event is not None
        # With ep.async_wait = device a device call's event has a device point (a CUDA stream
        # waits there, not the host; the simulated device has no streams of the caller's, so the
        # host waits for it); by default none: current_stream_wait() waits on the host.
        native = out_d[5].event._native
        if os.environ.get("PROXYEP_EP_ASYNC_WAIT", "host") == "device":
            assert native.device_point is not None
            assert device.device.stream_wait(native.device_point, 0) == (KIND == "cuda")
        else:
            assert native.device_point is None
        out_d[5].current_stream_wait()
    recv_h, recv_d = out_h[0], out_d[0]
    same(recv_d, recv_h, to)
    same(out_d[1], out_h[1], to)  # recv_topk_idx
    same(out_d[2], out_h[2], to)  # recv_topk_weights
    assert out_d[3] == out_h[3]  # the per-expert list

    # Combine the received rows (FP8: dequantised on the host, then moved).
    rows = dequantise(*recv_h).to(torch.bfloat16) if fp8 else recv_h
    comb_h = host.combine(rows, out_h[4], topk_weights=out_h[2])
    comb_d = device.combine(to(rows), out_d[4], topk_weights=out_d[2], async_finish=async_finish)
    if async_finish:
        comb_d[2].current_stream_wait()
    same(comb_d[0], comb_h[0], to)
    same(comb_d[1], comb_h[1], to)

    # Cached dispatch reuses the device handle.
    again = device.dispatch(to(x), handle=out_d[4])
    same(again[0], host.dispatch(x, handle=out_h[4])[0], to)

    moved = torch.tensor(device_counters(device) - before)
    dist.all_reduce(moved)
    assert int(moved) > 0, "no device arena or device write was used by any rank"


@pytest.mark.parametrize("use_fp8", [False, True])
@pytest.mark.parametrize("mode", ["plain", "hook", "async"])
def test_low_latency_matches_the_host_path(low_latency, use_fp8, mode):
    host, device = low_latency
    to = OnDevice(device)
    x, topk_idx, weights = routing(dist.get_rank(), seed=3)
    before = device_counters(device)

    def run(buffer, put, get):
        recv, count, handle, event, hook = buffer.low_latency_dispatch(
            put(x), put(topk_idx), T, E, use_fp8=use_fp8,
            async_finish=mode == "async", return_recv_hook=mode == "hook")
        finish(event, hook)
        # The experts' output, made on the host: the BF16 rows, or each FP8 row's first scale.
        received = get(recv)
        expert_out = received[1][:, :, :1].expand(-1, -1, H).to(torch.bfloat16) if use_fp8 else received
        combined, event, hook = buffer.low_latency_combine(
            put(expert_out.contiguous()), put(topk_idx), put(weights), handle,
            async_finish=mode == "async", return_recv_hook=mode == "hook")
        finish(event, hook)
        return recv, count, handle, combined

    recv_h, count_h, handle_h, comb_h = run(host, lambda t: t, lambda t: t)
    recv_d, count_d, handle_d, comb_d = run(device, to, to.host)
    same(count_d, count_h, to)
    local = E // dist.get_world_size()
    # Only the rows each expert received are defined (the rest of the slots are stale).
    data_h = recv_h[0] if use_fp8 else recv_h
    data_d = to.host(recv_d[0] if use_fp8 else recv_d)
    src_d = to.host(handle_d[0])
    for e in range(local):
        n = int(count_h[e])
        assert torch.equal(data_d[e, :n].view(torch.uint8), data_h[e, :n].view(torch.uint8))
        assert torch.equal(src_d[e, :n], handle_h[0][e, :n])  # src_info
        if use_fp8:
            assert torch.equal(to.host(recv_d[1])[e, :n], recv_h[1][e, :n])
    same(handle_d[1], handle_h[1], to)  # layout_range
    same(comb_d, comb_h, to)
    moved = torch.tensor(device_counters(device) - before)
    dist.all_reduce(moved)
    assert int(moved) > 0


@pytest.mark.skipif(KIND != "simulated", reason="the simulated device's address check")
def test_a_host_tensor_in_a_device_call_is_refused_and_the_buffer_stays_usable(normal):
    host, device = normal
    to = OnDevice(device)
    x, topk_idx, _ = routing(dist.get_rank(), seed=4)
    with pytest.raises(proxyep.ProxyEPError, match="topk_idx|device"):
        device.get_dispatch_layout(topk_idx, E)  # host memory flagged as the device's
    layout = device.get_dispatch_layout(to(topk_idx), E)
    same(layout[0], host.get_dispatch_layout(topk_idx, E)[0], to)


def test_copies_to_and_from_the_device_keep_shape_and_dtype(normal):
    _, device = normal
    to = OnDevice(device)
    for t in (torch.arange(24, dtype=torch.int64).view(2, 3, 4), torch.rand(5, 7).to(torch.bfloat16),
              torch.tensor([True, False, True]), torch.arange(6, dtype=torch.int32)):
        back = to.host(to(t))
        assert back.dtype == t.dtype and back.shape == t.shape and torch.equal(back, t)


def test_tensors_elsewhere_and_unknown_devices_are_refused():
    with pytest.raises(ValueError, match="CPU and CUDA"):
        proxyep.view(torch.empty(4, 4, device="meta"), "x")
    with pytest.raises(ValueError, match="device must be"):
        deep_ep.Buffer(dist.group.WORLD, num_nvl_bytes=1 << 20, device="tpu")
    with pytest.raises(proxyep.ProxyEPError, match="host"):
        proxyep._proxyep.Device.open("host")
    if not torch.cuda.is_available():
        with pytest.raises(proxyep.ProxyEPError, match="cuda|CUDA|GPU"):
            proxyep._proxyep.Device.open("cuda")
        # Refused before any collective: the other rank is not asked to join.
        with pytest.raises(proxyep.ProxyEPError, match="device cuda"):
            deep_ep.Buffer(dist.group.WORLD, num_nvl_bytes=1 << 20, device="cuda")


def test_a_rank_that_receives_nothing(normal):
    """Every token goes to rank 0's experts: the others receive no rows, and their combine input
    is empty (an empty device tensor is still device memory to the call)."""
    host, device = normal
    to = OnDevice(device)
    x, topk_idx, weights = routing(dist.get_rank(), seed=5)
    local = E // dist.get_world_size()
    topk_idx = torch.where(topk_idx >= 0, topk_idx % local, topk_idx)
    layout = host.get_dispatch_layout(topk_idx, E)
    args = dict(num_tokens_per_rank=layout[0], is_token_in_rank=layout[3], num_tokens_per_expert=layout[2],
                topk_idx=topk_idx, topk_weights=weights)
    out_h = host.dispatch(x, **args)
    out_d = device.dispatch(to(x), **{k: to(v) for k, v in args.items()})
    same(out_d[0], out_h[0], to)
    if dist.get_rank() != 0:
        assert out_h[0].shape[0] == 0
    comb_h = host.combine(out_h[0], out_h[4], topk_weights=out_h[2])
    comb_d = device.combine(to(out_h[0]), out_d[4], topk_weights=to(out_h[2]))
    same(comb_d[0], comb_h[0], to)
    same(comb_d[1], comb_h[1], to)


def test_a_call_in_cuda_graph_capture_is_refused_before_any_stream(normal, monkeypatch):
    """On a GPU the check is torch's own (is_current_stream_capturing); here it is made to say
    "capturing" on a Buffer taken for a CUDA one, and the call must raise naming graph capture
    before it asks torch for a stream (none exists without CUDA) or sends anything."""
    host, device = normal
    to = OnDevice(device)
    _, topk_idx, _ = routing(dist.get_rank(), seed=6)
    idx = to(topk_idx)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    monkeypatch.setattr(device, "_cuda", True)
    with pytest.raises(proxyep.ProxyEPError, match="CUDA graph capture"):
        device.get_dispatch_layout(idx, E)
    monkeypatch.undo()
    same(device.get_dispatch_layout(idx, E)[0], host.get_dispatch_layout(topk_idx, E)[0], to)


@pytest.mark.skipif(KIND != "cuda", reason="torch.cuda.graph needs a GPU (scripts/gpu-check.sh)")
@pytest.mark.parametrize("hooked", [False, True])
def test_low_latency_calls_captured_in_a_cuda_graph(low_latency, hooked):
    """DeepEP's decoding use: a dispatch and its combine (the experts' output being the received
    BF16 rows) captured in one torch.cuda.graph on every rank of the node, then replayed on new
    inputs copied into the captured tensors: each replay's outputs are the host path's for those
    inputs. The Buffer's stream joins torch's capture; nothing of the call runs on the host at a
    replay. ``hooked``: return_recv_hook, the hooks called inside the capture (two-batch
    overlap's way)."""
    host, device = low_latency
    rank = dist.get_rank()
    x, topk_idx, weights = routing(rank, seed=11)
    x_d, idx_d, w_d = x.cuda(), topk_idx.cuda(), weights.cuda()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        recv, count, handle, _, hook = device.low_latency_dispatch(
            x_d, idx_d, T, E, use_fp8=False, return_recv_hook=hooked)
        if hooked:
            hook()
        combined, _, hook = device.low_latency_combine(
            recv, idx_d, w_d, handle, return_recv_hook=hooked)
        if hooked:
            hook()
    for seed in (12, 13, 14):
        x, topk_idx, weights = routing(rank, seed=seed)
        x_d.copy_(x)
        idx_d.copy_(topk_idx)
        w_d.copy_(weights)
        dist.barrier()
        graph.replay()
        torch.cuda.synchronize()
        recv_h, count_h, handle_h, _, _ = host.low_latency_dispatch(x, topk_idx, T, E, use_fp8=False)
        comb_h, _, _ = host.low_latency_combine(recv_h, topk_idx, weights, handle_h)
        assert torch.equal(count.cpu(), count_h)
        for e in range(E // dist.get_world_size()):
            n = int(count_h[e])
            assert torch.equal(recv[e, :n].cpu().view(torch.uint8), recv_h[e, :n].view(torch.uint8))
        assert torch.equal(combined.cpu(), comb_h)


def test_low_latency_calls_pass_the_capture_gate_others_do_not(low_latency, monkeypatch):
    """While torch's stream captures, the low-latency calls go on to the native side (which joins
    the capture on CUDA) and the other calls raise. Here torch is made to say "capturing" on a
    Buffer taken for a CUDA one, with stream 0 standing for torch's: on the simulated device the
    LL call then runs as an eager one (it has no caller streams to join) and matches the host."""
    host, device = low_latency
    to = OnDevice(device)
    x, topk_idx, _ = routing(dist.get_rank(), seed=9)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: type("Stream", (), {"cuda_stream": 0})())
    monkeypatch.setattr(device, "_cuda", True)
    with pytest.raises(proxyep.ProxyEPError, match="only the low-latency calls"):
        device.get_dispatch_layout(to(topk_idx), E)
    _, count_d, _, _, _ = device.low_latency_dispatch(to(x), to(topk_idx), T, E, use_fp8=False)
    monkeypatch.undo()
    _, count_h, _, _, _ = host.low_latency_dispatch(x, topk_idx, T, E, use_fp8=False)
    same(count_d, count_h, to)
