"""The native argument classes (python/src: buffer_binding.cpp, normal_binding.cpp,
low_latency_binding.cpp) that deep_ep.Buffer builds for every call: keyword construction only,
the C++ structs' defaults, tensor attributes set from views (proxyep.view) and read back as the
same views, errors that name the tensor. No Buffer and no group: plain pytest."""

import pytest
import torch

from proxyep import Config, ProxyEPError, _proxyep, view

KEYWORD_ONLY = [
    _proxyep.GroupRendezvous,
    _proxyep.BufferOptions,
    _proxyep.DispatchArgs,
    _proxyep.CombineArgs,
    _proxyep.LowLatencyDispatchArgs,
    _proxyep.LowLatencyCombineArgs,
]


@pytest.mark.parametrize("cls", KEYWORD_ONLY, ids=lambda c: c.__name__)
def test_positional_arguments_are_refused(cls):
    # Their fields are too many (and too alike: runs of bools) to pass by position safely.
    with pytest.raises(TypeError):
        cls(None)
    cls()  # every field has a default


def test_defaults_are_the_cpp_structs():
    d = _proxyep.DispatchArgs()
    assert (d.x, d.x_scales, d.handle, d.topk_idx, d.config, d.previous_event) == (None,) * 6
    assert (d.expert_alignment, d.num_worst_tokens, d.async_finish) == (1, 0, False)
    c = _proxyep.CombineArgs()
    assert (c.x, c.handle, c.bias0, c.bias1, c.async_finish) == (None, None, None, None, False)
    ld = _proxyep.LowLatencyDispatchArgs()
    assert (ld.use_fp8, ld.round_scale, ld.use_ue8m0, ld.return_recv_hook) == (True, False, False, False)
    lc = _proxyep.LowLatencyCombineArgs()
    assert (lc.use_logfmt, lc.zero_copy, lc.out, lc.handle) == (False, False, None, None)
    o = _proxyep.BufferOptions()
    assert (o.num_nvl_bytes, o.num_rdma_bytes, o.num_qps_per_rank) == (0, 0, 24)
    assert (o.low_latency_mode, o.allow_nvlink_for_low_latency_mode, o.device) == (False, True, None)


def test_tensor_attributes_read_back_their_views():
    x = torch.randn(4, 16).to(torch.bfloat16)
    idx = torch.zeros(4, 2, dtype=torch.int64)
    per_rank = torch.zeros(3, dtype=torch.int32)
    strided = torch.zeros(4, 8, dtype=torch.float32)[:, ::2]  # strides honoured, not copied
    args = _proxyep.DispatchArgs(x=view(x, "x"), topk_idx=view(idx, "topk_idx"),
                                 num_tokens_per_rank=view(per_rank, "num_tokens_per_rank"),
                                 x_scales=view(strided, "x_scales"))
    assert args.x == view(x, "x")
    assert args.topk_idx == view(idx, "topk_idx")
    assert args.num_tokens_per_rank == view(per_rank, "num_tokens_per_rank")
    assert args.x_scales == (strided.data_ptr(), "f32", (4, 4), (8, 2), False)
    args.x = None
    assert args.x is None
    fp8 = torch.zeros(4, 16, dtype=torch.uint8)
    args.x = view(fp8, "x", fp8=True)
    assert args.x[1] == "fp8_e4m3"
    lc = _proxyep.LowLatencyCombineArgs(out=view(x, "out"))
    assert lc.out == view(x, "out")


def test_scalars_and_config_are_read_write():
    args = _proxyep.DispatchArgs(config=Config(num_sms=24), expert_alignment=4, async_finish=True)
    assert (args.config.num_sms, args.expert_alignment, args.async_finish) == (24, 4, True)
    args.config = None
    args.num_worst_tokens = 7
    assert (args.config, args.num_worst_tokens) == (None, 7)
    ll = _proxyep.LowLatencyDispatchArgs(num_max_dispatch_tokens_per_rank=128, num_experts=8,
                                         use_fp8=False)
    assert (ll.num_max_dispatch_tokens_per_rank, ll.num_experts, ll.use_fp8) == (128, 8, False)


def test_a_bad_view_names_its_tensor():
    with pytest.raises(ProxyEPError, match="x_scales: unsupported dtype c64"):
        _proxyep.DispatchArgs(x_scales=(0, "c64", (1,), (1,), False))
    args = _proxyep.CombineArgs()
    with pytest.raises(ProxyEPError, match=r"bias\[1\]"):
        args.bias1 = (0, "bf16", (2,), (2,), False)  # a strided 1-D tensor
    with pytest.raises(TypeError):
        _proxyep.CombineArgs(handle=object())  # a handle is a DispatchHandle or None


def test_group_rendezvous_by_keyword():
    g = _proxyep.GroupRendezvous(master_addr="127.0.0.1", master_port=29500, rank=1,
                                 world_size=2, ranks_per_node=1, job_id="j", secret=b"\x00\x01")
    assert (g.master_addr, g.master_port, g.rank, g.world_size) == ("127.0.0.1", 29500, 1, 2)
    assert (g.ranks_per_node, g.job_id, g.secret) == (1, "j", b"\x00\x01")
