"""Batched temperature sampling on the tiny MoE policy (TinyMoELM) for rollout workers: many
sequences at once, KV caches, every MoE exchange through the low-latency Buffer.

One :meth:`BatchGenerator.step` is one forward of every sequence on this rank by one position
(or its whole context, for a sequence just added: the prefill), with **one** low-latency
dispatch/combine per layer for all of them. The model has no padding masks, so attention is run
per *cohort*: sequences prefilled in the same step with the same context length share a KV cache
([B, heads, L, d]) and advance together (the G samples of a group share their prompt, so they
form one cohort); a finished or dropped sequence's row is cut out of its cohort's cache
(exact: attention is row-wise). The MoE rows of all cohorts are concatenated into one exchange
(exact too: the router and the experts are row-wise).

The exchange is collective over the EP group: every rank must call ``step()`` the same number
of times; a rank with nothing to run still steps, exchanging 0 rows (the LL Buffer accepts
that). ``max_step_tokens`` is the Buffer's num_max_dispatch_tokens_per_rank: a step never sends
more rows; a prefill that does not fit waits for a later step.

Sampling convention. For each generated token: ``logits`` = the model's float32 logits at the
last position; ``logprob = log_softmax(logits / temperature)[token]`` (the behaviour log-prob
*at the sampling temperature*, what an importance ratio against the sampler needs); ``token``
drawn from ``softmax(logits / temperature)`` with the sequence's own seeded torch.Generator
(so a sequence's tokens do not depend on what it was batched with); ``version`` the policy
version of the weights that ran the forward; ``routed_experts`` [layers][k] the top-k expert
ids of the position whose output gave this token (the last input position of that forward),
i.e. the routing that produced its log-prob, for routing replay.

Weights change only between steps (:meth:`apply_weights`), so each step runs one version, and
every running sequence's KV cache is discarded then: its keys and values came from the old
weights, so it is prefilled again (context + tokens so far) under the new ones. Each token's
log-prob is thus exactly that of its version's policy given everything before it.
"""

import dataclasses
import hashlib
from typing import List, Optional

import torch

from proxyep.moe.functional import route
from proxyep.moe.layer import MoELayer
from proxyep.moe.model import causal_attention, rms_norm

from ..coordinator.protocol import RLError


def sample_seed(*parts):
    """A 63-bit seed from any values (e.g. the worker's seed, group id, sample index, prefix
    length): the same parts give the same stream on every worker and rank."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


@dataclasses.dataclass
class GenRequest:
    """One sequence to extend: ``context`` (prompt + tokens generated before), at most
    ``budget`` new tokens here, ``remaining`` the tokens its sample may still have in total
    (max_new_tokens - generated so far; budget <= remaining)."""
    key: str
    context: List[int]
    budget: int
    remaining: int
    temperature: float = 1.0
    stop_token: Optional[int] = None
    seed: int = 0


@dataclasses.dataclass
class TokenEvent:
    """A generated token. ``finished``: None (more to come), "stop" (the stop token),
    "length" (the sample's max_new_tokens reached) or "budget" (this request's budget used up,
    the sample not finished: its remainder goes elsewhere)."""
    key: str
    token: int
    logprob: float
    version: int
    routed_experts: List[List[int]]
    finished: Optional[str] = None


class _Seq:
    def __init__(self, req):
        self.req = req
        self.tokens = []  # generated so far (the last one is the next step's input)
        self.rng = torch.Generator().manual_seed(req.seed)

    def context(self):
        """Everything before the next token: what a (re-)prefill runs."""
        return self.req.context + self.tokens


class _Cohort:
    """Sequences advancing together over one KV cache (row i = seqs[i])."""

    def __init__(self, model, seqs):
        self.seqs = seqs
        self.cache = model.new_cache()

    def keep_rows(self, keep):
        index = torch.tensor(keep, dtype=torch.long)
        for i, (k, v) in enumerate(zip(self.cache.keys, self.cache.values)):
            if k is not None:
                self.cache.keys[i], self.cache.values[i] = k.index_select(0, index), v.index_select(0, index)
        self.seqs = [self.seqs[i] for i in keep]


class BatchGenerator:
    """Sampling engine of one EP rank over ``model`` (a TinyMoELM with ``set_low_latency``
    done, or a DenseTinyMoELM: the same code then runs the reference's LL-rounded MoE, no
    communication). ``version``: the policy version of the model's current weights."""

    def __init__(self, model, version=0, max_step_tokens=None, record_routing=True):
        self.model = model
        self.version = version
        self.max_step_tokens = max_step_tokens
        self.record_routing = record_routing
        self._pending = []  # _Seq waiting for their prefill, in arrival order
        self._cohorts = []
        self._keys = set()
        self.steps = 0

    # ---- the set of sequences ----

    def add(self, req):
        """Queues a sequence (prefilled at the next step with room). Refuses (RLError, nothing
        changed) a duplicate key, an empty context, bad budgets or a sequence that could not fit
        the model's max_seq or one step's row bound."""
        if req.key in self._keys:
            raise RLError(f"sequence {req.key!r} is already being generated")
        if not req.context or not all(isinstance(t, int) and 0 <= t < self.model.vocab for t in req.context):
            raise RLError(f"sequence {req.key!r}: context must be a non-empty list of token ids < {self.model.vocab}")
        if not 1 <= req.budget <= req.remaining:
            raise RLError(f"sequence {req.key!r}: budget {req.budget} must be in [1, remaining {req.remaining}]")
        if not req.temperature > 0:
            raise RLError(f"sequence {req.key!r}: temperature must be positive, got {req.temperature}")
        # The last token is sampled, never fed back: positions used = context + budget - 1.
        if len(req.context) + req.budget - 1 > self.model.max_seq:
            raise RLError(f"sequence {req.key!r}: context {len(req.context)} + budget {req.budget} exceeds "
                          f"max_seq {self.model.max_seq}")
        # A weights update prefills it again with everything so far: that must fit one step.
        if self.max_step_tokens is not None and len(req.context) + req.budget - 1 > self.max_step_tokens:
            raise RLError(f"sequence {req.key!r}: context {len(req.context)} + budget {req.budget} exceeds the "
                          f"per-step row bound {self.max_step_tokens}")
        self._keys.add(req.key)
        self._pending.append(_Seq(req))

    def drop(self, key):
        """Forgets a sequence (e.g. its lease went stale); False if it is not here."""
        if key not in self._keys:
            return False
        self._keys.discard(key)
        self._pending = [s for s in self._pending if s.req.key != key]
        for cohort in self._cohorts:
            keep = [i for i, s in enumerate(cohort.seqs) if s.req.key != key]
            if len(keep) != len(cohort.seqs):
                cohort.keep_rows(keep)
        self._cohorts = [c for c in self._cohorts if c.seqs]
        return True

    def keys(self):
        return set(self._keys)

    def __len__(self):
        return len(self._keys)

    # ---- weights ----

    def check_weights(self, version, state):
        """Raises RLError unless ``apply_weights(version, state)`` would succeed: an unknown
        name, a shape mismatch, a non-floating tensor, or a version not above the current one."""
        if not isinstance(version, int) or version <= self.version:
            raise RLError(f"weights version {version!r} is not above the current version {self.version}")
        params = dict(self.model.named_parameters())
        for name, value in state.items():
            if name not in params:
                raise RLError(f"weights v{version}: unknown parameter {name!r}")
            if not torch.is_tensor(value) or tuple(value.shape) != tuple(params[name].shape):
                shape = tuple(value.shape) if torch.is_tensor(value) else type(value).__name__
                raise RLError(f"weights v{version}: {name} is {shape}, expected {tuple(params[name].shape)}")
            if not value.is_floating_point():
                raise RLError(f"weights v{version}: {name} has dtype {value.dtype}")

    @torch.no_grad()
    def apply_weights(self, version, state):
        """Replaces parameters by ``state`` {name: tensor} (this rank's: expert tensors hold
        its local expert rows; names not given keep their values) and sets the version. Call
        only between steps. Everything is checked first (check_weights): a refused update
        changes nothing."""
        self.check_weights(version, state)
        params = dict(self.model.named_parameters())
        for name, value in state.items():
            params[name].copy_(value)
        self.version = version
        # The caches hold the old weights' keys and values: prefill every running sequence again.
        running = [seq for cohort in self._cohorts for seq in cohort.seqs]
        self._cohorts = []
        self._pending = running + self._pending

    # ---- one step ----

    @torch.no_grad()
    def step(self):
        """Runs one forward of every sequence here (collective over the EP group: call it on
        every rank, as often). Returns a TokenEvent per sequence that ran; finished sequences
        are removed."""
        parts = []  # (cohort, input tokens [B, s])
        rows = 0
        for cohort in self._cohorts:
            parts.append((cohort, torch.tensor([[s.tokens[-1]] for s in cohort.seqs], dtype=torch.long)))
            rows += len(cohort.seqs)
        admitted, waiting = [], []
        for seq in self._pending:
            n = len(seq.context())
            if self.max_step_tokens is None or rows + n <= self.max_step_tokens:
                admitted.append(seq)
                rows += n
            else:
                waiting.append(seq)
        self._pending = waiting
        by_length = {}
        for seq in admitted:
            by_length.setdefault(len(seq.context()), []).append(seq)
        for length, seqs in by_length.items():
            cohort = _Cohort(self.model, seqs)
            self._cohorts.append(cohort)
            parts.append((cohort, torch.tensor([s.context() for s in seqs], dtype=torch.long)))
        logits, routing = self._forward(parts)
        self.steps += 1
        events = []
        for (cohort, _), last_logits, part_routing in zip(parts, logits, routing):
            keep = []
            for row, seq in enumerate(cohort.seqs):
                event = self._sample(seq, last_logits[row],
                                     [layer[row].tolist() for layer in part_routing] if part_routing else [])
                events.append(event)
                if event.finished is None:
                    keep.append(row)
                else:
                    self._keys.discard(seq.req.key)
            if len(keep) != len(cohort.seqs):
                cohort.keep_rows(keep)
        self._cohorts = [c for c in self._cohorts if c.seqs]
        return events

    def _sample(self, seq, logits, routed):
        req = seq.req
        logp = torch.log_softmax(logits.float() / req.temperature, dim=-1)
        token = int(torch.multinomial(logp.exp(), 1, generator=seq.rng))
        seq.tokens.append(token)
        finished = None
        if req.stop_token is not None and token == req.stop_token:
            finished = "stop"
        elif len(seq.tokens) >= req.remaining:
            finished = "length"
        elif len(seq.tokens) >= req.budget:
            finished = "budget"
        return TokenEvent(req.key, token, float(logp[token]), self.version, routed, finished)

    def _forward(self, parts):
        """TinyLMBase.forward for several cohorts at once, attention per cohort, each layer's
        MoE one low-latency exchange over all their rows (zero rows when ``parts`` is empty).
        Returns per part the logits of its last position [B, V] and, when recording, its
        routing [layers] of [B, k] at that position."""
        m = self.model
        xs = []
        for cohort, tokens in parts:
            start, s = cohort.cache.length, tokens.shape[1]
            if start + s > m.max_seq:
                raise RLError(f"positions up to {start + s} exceed max_seq {m.max_seq}")
            xs.append(m.embed[tokens] + m.pos[start:start + s])
        sizes = [x.shape[0] * x.shape[1] for x in xs]
        routing = [[] for _ in parts]
        for i in range(m.num_layers):
            for j, (cohort, _) in enumerate(parts):
                xs[j] = xs[j] + causal_attention(rms_norm(xs[j], m.norm1[i]), m.qkv[i], m.proj[i], m.heads,
                                                 cohort.cache, i)
            if xs:
                y = torch.cat([rms_norm(x, m.norm2[i]).reshape(-1, m.hidden) for x in xs])
            else:
                y = torch.zeros(0, m.hidden)
            out = m._moe_low_latency(m.moe[i], y)
            if self.record_routing and parts:
                moe = m.moe[i]
                if isinstance(moe, MoELayer):
                    idx = moe.last_topk_idx
                else:
                    idx = route(y.float() @ moe.router_weight.t(), moe.topk, moe.score)[2]
            offset = 0
            for j, x in enumerate(xs):
                b, s = x.shape[0], x.shape[1]
                xs[j] = x + out[offset:offset + sizes[j]].view(b, s, m.hidden)
                if self.record_routing:
                    routing[j].append(idx[offset:offset + sizes[j]].view(b, s, -1)[:, -1])
                offset += sizes[j]
        logits = []
        head = m.embed if m.head is None else m.head
        for j, (cohort, tokens) in enumerate(parts):
            cohort.cache.length += tokens.shape[1]
            logits.append(rms_norm(xs[j][:, -1], m.final_norm) @ head.t())
        return logits, routing


def make_ll_buffer(config, group, max_step_tokens):
    """A deep_ep Buffer in low_latency_mode over ``group`` sized for ``max_step_tokens`` rows
    per rank per exchange (collective). It also serves the model's normal-mode calls."""
    import deep_ep
    import torch.distributed as dist

    world = dist.get_world_size(group)
    if config.num_experts % world:
        raise RLError(f"num_experts {config.num_experts} is not a multiple of the EP size {world}")
    hint = deep_ep.Buffer.get_low_latency_rdma_size_hint(max_step_tokens, config.hidden, world, config.num_experts)
    return deep_ep.Buffer(group, num_nvl_bytes=1 << 20, num_rdma_bytes=hint, low_latency_mode=True,
                          num_qps_per_rank=max(1, config.num_experts // world), explicitly_destroy=True)
