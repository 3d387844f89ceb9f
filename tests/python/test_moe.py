"""proxyep.moe.MoELayer (expert parallel over the world group, exchange through deep_ep's
dispatch/combine as autograd functions) against the dense single-process reference DenseMoE at
the same seed.

Every rank builds the layer and the reference; the reference runs every rank's tokens (each
rank's batch regenerated from its seed, the router run on each rank's rows exactly as that rank
runs it) with loss = sum over ranks of (out_r * G_r).sum() + aux_r, the loss the layer's ranks
sum to. Compared on each rank:

* top-k ids and the aux loss: exactly (the same float32 ops on the same rows);
* forward output against DenseMoE.exchange_rounded (the layer's bf16 roundings reproduced: each
  rank's part rounded, summed in float32 in rank order, rounded): at most 1 bf16 ulp per
  element, and equal wherever the float32 GEMMs (run there on other row sets) give the same bits
  (every element, on the shapes here, when written);
* forward output against the plain float32 reference, per element: |layer - reference| <=
  2^-7 * (sum_r |p_r| + |out|) + 1e-6, p_r the part of the output from rank r's experts: each
  p_r and the combined sum are rounded to bf16 once (half an ulp, 2^-8 relative; up to one ulp,
  2^-7, next to a rounding boundary when the GEMMs' last bits differ); the experts see the same
  bf16-rounded tokens on both sides;
* gradients of the input, the router weight (summed over ranks, as data parallelism would) and
  this rank's experts' fc1/fc2 (the reference's rows for the same global experts): relative
  error in norm ||layer - ref|| / ||ref|| <= 2^-6. The layer rounds the gradient of the output to
  bf16 (cached dispatch), the gradient of each received row to bf16 (combine's input) and the
  combined sum again: three bf16 roundings, each <= 2^-8 relative, on every path; the weight
  gradients cross float32 only (combine's topk_weights).

Observed here: gradient errors 0.0014-0.0033 (bound 0.0156). A dropped weight gradient gives the
router an error of 1.0 (test_missing_weight_gradient_is_detected); gradients landing on the wrong
rows (combine's backward returning its cached dispatch's rows reversed) give errors ~1.5."""

import pytest
import torch
import torch.distributed as dist

import deep_ep
from proxyep.moe import DenseMoE, DispatchFunction, MoELayer
from proxyep.moe import exchange

T, H, F, K = 24, 64, 32, 2
SEED = 7
FORWARD_REL = 2.0**-7
GRAD_REL = 2.0**-6


def num_experts():
    return 2 * dist.get_world_size()  # two local experts per rank: rows can pick both


@pytest.fixture(scope="module")
def buffer():
    buf = deep_ep.Buffer(dist.group.WORLD, num_nvl_bytes=1 << 22, num_rdma_bytes=1 << 22,
                         explicitly_destroy=True)
    yield buf
    buf.destroy()


def inputs(rank):
    g = torch.Generator().manual_seed(SEED * 1000 + rank)
    return torch.randn(T, H, generator=g), torch.randn(T, H, generator=g)


def run_layer(buffer, score, aux_coef, exchange=None):
    """The layer over ``buffer`` (or ``exchange``, with buffer None) on this rank's inputs:
    (layer, output, aux loss, gradients with the router's summed over ranks)."""
    rank = dist.get_rank()
    layer = MoELayer(H, F, num_experts(), K, dist.group.WORLD, buffer, score=score,
                     aux_loss_coef=aux_coef, seed=SEED, exchange=exchange)
    x, g = inputs(rank)
    x.requires_grad_()
    out, aux = layer(x)
    ((out * g).sum() + aux).backward()
    router_grad = grad_or_zeros(layer.router_weight).clone()
    dist.all_reduce(router_grad)
    grads = dict(x=x.grad, router=router_grad, fc1=grad_or_zeros(layer.fc1), fc2=grad_or_zeros(layer.fc2))
    return layer, out.detach(), aux.detach(), grads


def grad_or_zeros(p):
    return p.grad if p.grad is not None else torch.zeros_like(p)


def run_reference(score, aux_coef):
    """The reference over every rank's tokens: (per-rank outputs, auxes, top-k ids, input
    grads, the reference module, the per-rank inputs)."""
    R = dist.get_world_size()
    ref = DenseMoE(H, F, num_experts(), K, score=score, aux_loss_coef=aux_coef, seed=SEED)
    outs, auxes, idxs, xs = [], [], [], []
    loss = 0
    for r in range(R):
        x, g = inputs(r)
        x.requires_grad_()
        out, aux = ref(x)
        loss = loss + (out * g).sum() + aux
        outs.append(out.detach())
        auxes.append(aux.detach())
        idxs.append(ref.last_topk_idx)
        xs.append(x)
    loss.backward()
    return ref, outs, auxes, idxs, xs


def rel_err(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm().clamp(min=1e-30))


def bf16_ulps(a, b):
    """How many bf16 values apart a and b (both bf16-exact) are."""
    def ordered(t):
        bits = t.to(torch.bfloat16).view(torch.int16).to(torch.int32)
        return torch.where(bits < 0, -(bits & 0x7FFF), bits)

    return (ordered(a) - ordered(b)).abs()


def check_against_reference(layer, out, aux, grads, score, aux_coef):
    rank, R = dist.get_rank(), dist.get_world_size()
    ref, outs, auxes, idxs, xs = run_reference(score, aux_coef)
    assert torch.equal(layer.last_topk_idx, idxs[rank])
    assert torch.equal(aux, auxes[rank])
    bound = FORWARD_REL * (ref.partial_magnitudes(xs[rank].detach(), R) + outs[rank].abs()) + 1e-6
    excess = (out - outs[rank]).abs() - bound
    assert float(excess.max()) <= 0, f"forward off by {float(excess.max())} over the bound"
    faithful = ref.exchange_rounded(xs[rank].detach(), R)
    ulps = bf16_ulps(out, faithful)
    assert int(ulps.max()) <= 1, f"{int((ulps > 1).sum())} outputs more than 1 bf16 ulp off"
    local = layer.num_local_experts
    experts = slice(rank * local, (rank + 1) * local)
    errors = dict(x=rel_err(grads["x"], xs[rank].grad),
                  router=rel_err(grads["router"], ref.router_weight.grad),
                  fc1=rel_err(grads["fc1"], ref.fc1.grad[experts]),
                  fc2=rel_err(grads["fc2"], ref.fc2.grad[experts]))
    return errors


@pytest.mark.parametrize("aux_coef", [0.0, 1.0])
@pytest.mark.parametrize("score", ["softmax", "sigmoid"])
def test_layer_matches_dense_reference(buffer, score, aux_coef):
    layer, out, aux, grads = run_layer(buffer, score, aux_coef)
    errors = check_against_reference(layer, out, aux, grads, score, aux_coef)
    bad = {k: v for k, v in errors.items() if not v <= GRAD_REL}
    assert not bad, f"gradients off (relative error in norm, bound {GRAD_REL}): {errors}"


def test_every_rank_exchanged_tokens(buffer):
    """The comparison is not vacuous: tokens crossed ranks and every rank's experts got rows."""
    layer, _, _, grads = run_layer(buffer, "softmax", 0.0)
    idx = layer.last_topk_idx
    remote = ((idx // layer.num_local_experts) != dist.get_rank()).any()
    flags = torch.tensor([int(bool(remote)), int(bool(grads["fc2"].abs().sum() > 0))])
    dist.all_reduce(flags, op=dist.ReduceOp.MIN)
    assert flags.tolist() == [1, 1]


def test_missing_weight_gradient_is_detected(buffer, monkeypatch):
    """A dispatch backward that drops the gradient of the top-k weights (the router's only path
    with aux_coef 0) fails the router-gradient check by far."""
    original = DispatchFunction.backward

    def dropping(ctx, *grads):
        grad_x, a, _, b, c = original(ctx, *grads)
        return grad_x, a, None, b, c

    monkeypatch.setattr(exchange.DispatchFunction, "backward", staticmethod(dropping))
    layer, out, aux, grads = run_layer(buffer, "softmax", 0.0)
    errors = check_against_reference(layer, out, aux, grads, "softmax", 0.0)
    assert errors["router"] > 0.5, errors
    assert errors["fc1"] <= GRAD_REL and errors["fc2"] <= GRAD_REL, errors
