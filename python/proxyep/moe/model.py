"""A tiny decoder-only MoE language model (issue 14 item 3), expert parallel over a
torch.distributed group with the token exchange through ``deep_ep`` (layer.py), and the parts
its dense single-process reference (reference_model.py) shares with it.

Architecture (pre-norm): token embedding + learned position embedding; ``layers`` x (RMSNorm ->
causal multi-head self-attention with an optional KV cache -> residual; RMSNorm -> MoE ->
residual); final RMSNorm; LM head (separate, or tied to the embedding). float32 throughout; the
MoE exchange moves bf16 (layer.py).

Initialisation is deterministic: every dense parameter comes from a generator seeded with
``seed`` and the parameter's name (so every rank builds the same dense weights, with no
broadcast), and layer i's MoE from ``moe_seed(seed, i)`` (its router and each global expert from
functional.py), so the EP model's local experts are exactly the reference's rows for the same
global experts.

``forward(tokens [B, S], cache=None, low_latency=False)`` -> ``(logits [B, S, V], aux)``:
training (full sequences, no cache) or generation (a prompt, then one token per step, with a
:class:`KVCache`). ``low_latency=True`` sends the MoE exchange through the low-latency Buffer
given to :meth:`TinyMoELM.set_low_latency` (inference only; every rank calls it with the same
``num_max_dispatch_tokens_per_rank``).
"""

import math
import zlib

import torch
import torch.nn.functional as F

from .layer import MoELayer


def moe_seed(seed, layer):
    """The seed of layer ``layer``'s MoE (router and experts)."""
    return seed * 1000 + layer + 1


def dense_init(seed, name, shape, std):
    """A dense parameter's initial value: normal(0, std) from a generator seeded by ``seed`` and
    ``name`` (``std`` None: ones, the RMSNorm gains)."""
    if std is None:
        return torch.ones(shape)
    g = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    return torch.randn(shape, generator=g) * std


class KVCache:
    """Per-layer keys and values [B, heads, length, head_dim] of the positions seen so far."""

    def __init__(self, num_layers):
        self.keys = [None] * num_layers
        self.values = [None] * num_layers
        self.length = 0


def rms_norm(x, gain, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * gain


def causal_attention(x, qkv_weight, proj_weight, heads, cache=None, layer=0):
    """Multi-head causal self-attention of x [B, S, H]; with a cache, x holds the positions after
    ``cache.length`` and its keys/values are appended to the cache's (attending to them all)."""
    b, s, h = x.shape
    d = h // heads
    q, k, v = (x @ qkv_weight.t()).split(h, dim=-1)
    q, k, v = (t.view(b, s, heads, d).transpose(1, 2) for t in (q, k, v))
    start = 0
    if cache is not None:
        start = cache.length
        if cache.keys[layer] is not None:
            k = torch.cat([cache.keys[layer], k], dim=2)
            v = torch.cat([cache.values[layer], v], dim=2)
        cache.keys[layer], cache.values[layer] = k, v
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(d)  # [B, heads, S, start + S]
    query_pos = torch.arange(start, start + s).view(-1, 1)
    key_pos = torch.arange(start + s).view(1, -1)
    scores = scores.masked_fill(key_pos > query_pos, float("-inf"))
    out = torch.softmax(scores, dim=-1) @ v  # [B, heads, S, d]
    return out.transpose(1, 2).reshape(b, s, h) @ proj_weight.t()


class TinyLMBase(torch.nn.Module):
    """The model without a choice of MoE: ``make_moe(layer)`` builds layer ``layer``'s MoE module
    (``forward(x [T, H]) -> (out, aux)``); subclasses say how the low-latency path runs
    (``_moe_low_latency``)."""

    def __init__(self, vocab, hidden, layers, heads, num_experts, topk, ffn_hidden, max_seq, seed,
                 tie_embeddings, make_moe):
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden {hidden} is not a multiple of heads {heads}")
        self.vocab, self.hidden, self.num_layers, self.heads = vocab, hidden, layers, heads
        self.num_experts, self.topk, self.ffn_hidden, self.max_seq = num_experts, topk, ffn_hidden, max_seq
        self.seed, self.tie_embeddings = seed, tie_embeddings
        p = lambda name, shape, std: torch.nn.Parameter(dense_init(seed, name, shape, std))  # noqa: E731
        self.embed = p("embed", (vocab, hidden), 1.0)
        self.pos = p("pos", (max_seq, hidden), 0.1)
        self.norm1 = torch.nn.ParameterList([p(f"norm1.{i}", (hidden,), None) for i in range(layers)])
        self.qkv = torch.nn.ParameterList([p(f"qkv.{i}", (3 * hidden, hidden), hidden**-0.5) for i in range(layers)])
        self.proj = torch.nn.ParameterList([p(f"proj.{i}", (hidden, hidden), (2 * layers * hidden) ** -0.5)
                                            for i in range(layers)])
        self.norm2 = torch.nn.ParameterList([p(f"norm2.{i}", (hidden,), None) for i in range(layers)])
        self.moe = torch.nn.ModuleList([make_moe(i) for i in range(layers)])
        self.final_norm = p("final_norm", (hidden,), None)
        self.head = None if tie_embeddings else p("head", (vocab, hidden), hidden**-0.5)

    def expert_parameters(self):
        """The parameters that live on one rank only in the EP model (the MoE fc1/fc2)."""
        return [t for m in self.moe for t in (m.fc1, m.fc2)]

    def dense_parameters(self):
        """Every other parameter: replicated, the same on every rank (router included)."""
        experts = {id(t) for t in self.expert_parameters()}
        return [t for t in self.parameters() if id(t) not in experts]

    def forward(self, tokens, cache=None, low_latency=False):
        """(logits [B, S, vocab] float32, summed aux loss of the MoE layers) for tokens [B, S]
        int64 (after ``cache.length`` positions when a cache is given; the cache is extended)."""
        b, s = tokens.shape
        start = cache.length if cache is not None else 0
        if start + s > self.max_seq:
            raise ValueError(f"positions up to {start + s} exceed max_seq {self.max_seq}")
        x = self.embed[tokens] + self.pos[start:start + s]
        aux = torch.zeros(())
        for i in range(self.num_layers):
            x = x + causal_attention(rms_norm(x, self.norm1[i]), self.qkv[i], self.proj[i], self.heads, cache, i)
            y = rms_norm(x, self.norm2[i]).reshape(b * s, self.hidden)
            if low_latency:
                out = self._moe_low_latency(self.moe[i], y)
            else:
                out, layer_aux = self.moe[i](y)
                aux = aux + layer_aux
            x = x + out.view(b, s, self.hidden)
        if cache is not None:
            cache.length = start + s
        x = rms_norm(x, self.final_norm)
        logits = x @ (self.embed if self.head is None else self.head).t()
        return logits, aux

    def _moe_low_latency(self, moe, y):
        raise NotImplementedError

    def new_cache(self):
        return KVCache(self.num_layers)


class TinyMoELM(TinyLMBase):
    """The expert-parallel model: each MoE is a :class:`MoELayer` over ``group``/``buffer`` (a
    normal-mode deep_ep Buffer, or one in low_latency_mode, which also serves normal calls), with
    num_experts / group size experts on this rank (``exchange``: another token exchange for the
    MoE layers' forward, e.g. a2a_exchange.AllToAllExchange; layer.py). Dense parameters are
    replicated; keep their gradients in sync (training.sync_gradients) and they stay equal on every rank."""

    def __init__(self, vocab, hidden, layers, heads, num_experts, topk=2, ffn_hidden=None, group=None,
                 buffer=None, seed=0, max_seq=64, tie_embeddings=False, score="softmax", aux_loss_coef=0.0,
                 exchange=None):
        ffn_hidden = ffn_hidden or 2 * hidden
        super().__init__(vocab, hidden, layers, heads, num_experts, topk, ffn_hidden, max_seq, seed, tie_embeddings,
                         lambda i: MoELayer(hidden, ffn_hidden, num_experts, topk, group, buffer, score=score,
                                            aux_loss_coef=aux_loss_coef, seed=moe_seed(seed, i),
                                            exchange=exchange))
        self.group, self.buffer = group, buffer
        self.ll_buffer, self.ll_max_tokens = None, None

    def set_low_latency(self, ll_buffer, num_max_dispatch_tokens_per_rank):
        """The Buffer (low_latency_mode=True, same group; hidden a multiple of 128) and the
        per-rank token bound that ``forward(..., low_latency=True)`` uses."""
        self.ll_buffer, self.ll_max_tokens = ll_buffer, num_max_dispatch_tokens_per_rank

    def _moe_low_latency(self, moe, y):
        if self.ll_buffer is None:
            raise RuntimeError("low_latency=True needs set_low_latency(ll_buffer, num_max_dispatch_tokens_per_rank)")
        return moe.forward_low_latency(y, self.ll_buffer, self.ll_max_tokens)


@torch.no_grad()
def greedy_generate(model, prompts, steps, low_latency=False):
    """Greedy decode with the KV cache: the prompts [B, P] in one forward, then ``steps`` tokens
    one at a time. Returns (tokens [B, steps], logits of each chosen step [B, steps, vocab]).
    For the EP model this is collective (every rank runs the same number of forwards)."""
    cache = model.new_cache()
    logits, _ = model(prompts, cache=cache, low_latency=low_latency)
    tokens, chosen_logits = [], []
    last = logits[:, -1]
    for step in range(steps):
        nxt = last.argmax(dim=-1)
        tokens.append(nxt)
        chosen_logits.append(last)
        if step + 1 < steps:
            logits, _ = model(nxt.view(-1, 1), cache=cache, low_latency=low_latency)
            last = logits[:, -1]
    return torch.stack(tokens, dim=1), torch.stack(chosen_logits, dim=1)


def cross_entropy(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
