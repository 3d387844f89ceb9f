"""The MoE exchange as autograd functions over DeepEP V2's ElasticBuffer
(proxyep/moe/elastic_exchange.py): MoELayer over it against the dense single-process reference
(values and gradients, as tests/python/test_moe.py checks the V1 pair), and the expanded layout's
pair against the non-expanded one on the same tokens and experts. CPU tensors, gloo; 2 ranks and
2 nodes of 2 (the reorder shim across nodes)."""

import pytest
import torch
import torch.distributed as dist

from proxyep.moe import ElasticCombineFunction, ElasticDispatchFunction, ElasticExchange
from conftest import elastic_buffer
from test_moe import GRAD_REL, H, K, T, check_against_reference, num_experts, rel_err, run_layer


@pytest.fixture(scope="module")
def buffer():
    with elastic_buffer(num_max_tokens_per_rank=T, hidden=H, num_topk=K) as buf:
        yield buf


@pytest.mark.parametrize("aux_coef", [0.0, 1.0])
@pytest.mark.parametrize("score", ["softmax", "sigmoid"])
def test_layer_over_v2_matches_dense_reference(buffer, score, aux_coef):
    layer, out, aux, grads = run_layer(None, score, aux_coef, exchange=ElasticExchange(buffer))
    errors = check_against_reference(layer, out, aux, grads, score, aux_coef)
    bad = {k: v for k, v in errors.items() if not v <= GRAD_REL}
    assert not bad, f"gradients off (relative error in norm, bound {GRAD_REL}): {errors}"
    # Not vacuous: the router's gradient comes only through the combined weights with aux 0.
    assert float(grads["router"].abs().sum()) > 0


def expert_scale(num_local):
    rank = dist.get_rank()
    return 1.0 + 0.25 * torch.arange(rank * num_local, (rank + 1) * num_local, dtype=torch.float32)


def moe_output(buffer, x, topk_idx, weights, do_expand):
    """Each local expert e scales its rows by expert_scale[e] and the routing weight: through the
    non-expanded layout (a row per token, its lanes summed) or the expanded one (a slot per
    (token, expert))."""
    E = num_experts()
    local = E // dist.get_world_size()
    scale = expert_scale(local)
    recv_x, recv_idx, recv_w, _, handle = ElasticDispatchFunction.apply(
        x.to(torch.bfloat16), topk_idx, weights, buffer, E, do_expand)
    if do_expand:
        # Slot s belongs to the expert whose [base, psum) range holds it (the handle's psums).
        psum = handle.psum_num_recv_tokens_per_expert.long()
        expert = torch.searchsorted(psum, torch.arange(recv_x.shape[0]), right=True).clamp(max=local - 1)
        y = recv_x.float() * (recv_w * scale[expert]).unsqueeze(1)
    else:
        lane_scale = torch.where(recv_idx >= 0, scale[recv_idx.clamp(min=0)], torch.zeros(()))
        y = recv_x.float() * (recv_w * lane_scale).sum(dim=1, keepdim=True)
    return ElasticCombineFunction.apply(y.to(torch.bfloat16), buffer, handle).float()


def test_expanded_pair_matches_non_expanded(buffer):
    """The same model over both layouts: outputs and the gradients of x and of the weights agree
    to bf16 rounding (the expanded one rounds each slot before summing a token's)."""
    rank = dist.get_rank()
    g = torch.Generator().manual_seed(31 + rank)
    x = torch.randn(T, H, generator=g)
    scores = torch.rand(T, num_experts(), generator=g)
    topk_idx = torch.topk(scores, K, dim=1).indices
    weights = torch.rand(T, K, generator=g)
    upstream = torch.randn(T, H, generator=g)
    results = []
    for do_expand in (False, True):
        xs, ws = x.clone().requires_grad_(), weights.clone().requires_grad_()
        out = moe_output(buffer, xs, topk_idx, ws, do_expand)
        (out * upstream).sum().backward()
        results.append((out.detach(), xs.grad, ws.grad))
    (out0, gx0, gw0), (out1, gx1, gw1) = results
    assert rel_err(out1, out0) <= 2.0**-7
    assert rel_err(gx1, gx0) <= 2.0**-7
    assert rel_err(gw1, gw0) <= 2.0**-6
    assert float(gw0.abs().sum()) > 0 and float(gx0.abs().sum()) > 0
