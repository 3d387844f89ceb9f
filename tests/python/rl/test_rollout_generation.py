"""proxyep.rl.rollout.generation.BatchGenerator on the dense reference (one process, no exchange:
the same code path as the EP model's, the MoE being the reference's LL-rounded one), plus
model_config and rollout.spot.StopNotice.

Checked against an independent computation: the model's own ``forward`` over the whole sequence
(no KV cache, no cohorts, one batch row), whose log-softmax at the sampling temperature must give
the behaviour log-probs the generator recorded. Tolerance 1e-4: both sides run the same float32
arithmetic on different row sets (cached incremental vs full-sequence GEMMs), which moves only
last bits (observed <= 1e-6); a wrong position, temperature or cache row gives errors of 0.1 or
more.
"""

import http.server
import os
import signal
import threading

import pytest
import torch

from proxyep.rl.coordinator.protocol import RLError
from proxyep.rl.model_config import (ModelConfig, build_dense_reference, expert_parameter_names,
                                     local_expert_state)
from proxyep.rl.rollout.generation import BatchGenerator, GenRequest, sample_seed
from proxyep.rl.rollout.spot import StopNotice

torch.set_num_threads(1)

CONFIG = ModelConfig(vocab=64, hidden=128, layers=2, heads=4, num_experts=4, topk=2, ffn_hidden=32, max_seq=32, seed=3)
TOL = 1e-4


@pytest.fixture(scope="module")
def model():
    return build_dense_reference(CONFIG)


def run_all(gen, limit=200):
    """Steps until every sequence finished; {key: [TokenEvent]}."""
    out = {}
    for _ in range(limit):
        if not len(gen):
            return out
        for ev in gen.step():
            out.setdefault(ev.key, []).append(ev)
    raise AssertionError("generation did not finish")


def reference_logprobs(model, context, tokens, temperature):
    seq = torch.tensor([context + tokens])
    with torch.no_grad():
        logits, _ = model(seq[:, :-1], low_latency=True)
    logp = torch.log_softmax(logits[0, len(context) - 1:] / temperature, dim=-1)
    return logp[torch.arange(len(tokens)), torch.tensor(tokens)]


def requests():
    """Six sequences: four sharing a prompt (one cohort), others of other lengths,
    temperatures, budgets and a stop token."""
    reqs = [GenRequest(f"g{i}", [1, 2, 3, 4], budget=8, remaining=8, temperature=1.0, seed=sample_seed(0, "g", i))
            for i in range(4)]
    reqs.append(GenRequest("short", [5, 6], budget=5, remaining=10, temperature=0.7, seed=11))
    reqs.append(GenRequest("long", list(range(12)), budget=10, remaining=10, temperature=1.3, seed=12))
    return reqs


def test_logprobs_match_full_forward(model):
    gen = BatchGenerator(model, version=7)
    for r in requests():
        gen.add(r)
    out = run_all(gen)
    assert gen.steps == 10  # the longest budget: one forward per token, prefill included
    worst = 0.0
    for r in requests():
        ev = out[r.key]
        assert len(ev) == r.budget
        assert all(e.version == 7 for e in ev)
        assert [e.finished for e in ev[:-1]] == [None] * (len(ev) - 1)
        assert ev[-1].finished == ("budget" if r.budget < r.remaining else "length")
        ref = reference_logprobs(model, r.context, [e.token for e in ev], r.temperature)
        worst = max(worst, float((ref - torch.tensor([e.logprob for e in ev])).abs().max()))
        assert all(len(e.routed_experts) == CONFIG.layers and len(e.routed_experts[0]) == CONFIG.topk for e in ev)
    print(f"max |logprob - full-forward logprob| {worst:.2e}")
    assert worst <= TOL
    # Not vacuous: the four samples of the shared prompt differ (their own seeds).
    assert len({tuple(e.token for e in out[f"g{i}"]) for i in range(4)}) > 1


def test_routing_is_the_reference_routing(model):
    """routed_experts of token j = the top-k of the position whose output gave it, as the
    reference's router computes them over the full sequence."""
    from proxyep.moe.functional import route

    gen = BatchGenerator(model)
    req = GenRequest("r", [7, 8, 9], budget=6, remaining=6, seed=5)
    gen.add(req)
    ev = run_all(gen)["r"]
    seq = torch.tensor([req.context + [e.token for e in ev]])[:, :-1]
    moe_inputs = []  # per layer: the rows the MoE saw
    original = type(model)._moe_low_latency

    def spy(self, moe, y):
        moe_inputs.append(y.clone())
        return original(self, moe, y)

    type(model)._moe_low_latency = spy
    try:
        with torch.no_grad():
            model(seq, low_latency=True)
    finally:
        type(model)._moe_low_latency = original
    routed = [route(y @ model.moe[i].router_weight.t(), CONFIG.topk, CONFIG.score)[2][len(req.context) - 1:]
              for i, y in enumerate(moe_inputs)]
    for j, e in enumerate(ev):
        assert e.routed_experts == [routed[layer][j].tolist() for layer in range(CONFIG.layers)]


def test_tokens_do_not_depend_on_batch(model):
    """A sequence's tokens come from its own seeded generator: alone or batched, the same."""
    batched = BatchGenerator(model)
    for r in requests():
        batched.add(r)
    together = run_all(batched)
    for r in requests()[3:]:
        alone = BatchGenerator(model)
        alone.add(r)
        assert [e.token for e in run_all(alone)[r.key]] == [e.token for e in together[r.key]]


def test_stop_token_and_continuation(model):
    """Find a sampled token, make it the stop token: generation ends right after it. Then a
    continuation (context = prompt + first tokens) gives the log-probs of the whole sequence."""
    gen = BatchGenerator(model)
    gen.add(GenRequest("a", [3, 1], budget=8, remaining=8, seed=21))
    tokens = [e.token for e in run_all(gen)["a"]]
    stop = tokens[3]
    first = tokens.index(stop)
    gen.add(GenRequest("b", [3, 1], budget=8, remaining=8, stop_token=stop, seed=21))
    ev = run_all(gen)["b"]
    assert [e.token for e in ev] == tokens[:first + 1] and ev[-1].finished == "stop"
    # Continue after 3 tokens with 5 more (remaining = 8 - 3).
    gen.add(GenRequest("c", [3, 1] + tokens[:3], budget=5, remaining=5, temperature=0.8, seed=99))
    cont = run_all(gen)["c"]
    assert len(cont) == 5 and cont[-1].finished == "length"
    ref = reference_logprobs(model, [3, 1] + tokens[:3], [e.token for e in cont], 0.8)
    assert float((ref - torch.tensor([e.logprob for e in cont])).abs().max()) <= TOL


def test_drop_keeps_the_others_exact(model):
    gen = BatchGenerator(model)
    for r in requests():
        gen.add(r)
    out = {}
    for step in range(3):
        for ev in gen.step():
            out.setdefault(ev.key, []).append(ev)
    assert gen.drop("g1") and gen.drop("long") and not gen.drop("nope")
    assert gen.keys() == {"g0", "g2", "g3", "short"}
    for key, evs in run_all(gen).items():
        out[key] += evs
    for r in requests():
        if r.key in ("g1", "long"):
            continue
        ev = out[r.key]
        ref = reference_logprobs(model, r.context, [e.token for e in ev], r.temperature)
        assert float((ref - torch.tensor([e.logprob for e in ev])).abs().max()) <= TOL


def test_step_row_bound(model):
    """max_step_tokens bounds the rows of every exchange; a prefill that does not fit waits."""
    rows = []
    original = type(model)._moe_low_latency

    def spy(self, moe, y):
        rows.append(y.shape[0])
        return original(self, moe, y)

    gen = BatchGenerator(model, max_step_tokens=10)
    for i in range(3):
        gen.add(GenRequest(f"p{i}", list(range(6)), budget=3, remaining=3, seed=i))
    type(model)._moe_low_latency = spy
    try:
        out = run_all(gen)
    finally:
        type(model)._moe_low_latency = original
    assert max(rows) <= 10 and 6 in rows
    assert sorted(out) == ["p0", "p1", "p2"] and all(len(v) == 3 for v in out.values())
    with pytest.raises(RLError, match="row bound"):
        gen.add(GenRequest("big", list(range(9)), budget=3, remaining=3))


def test_empty_step_runs_the_exchange(model):
    """A rank with nothing to do still takes part in each layer's exchange, with zero rows."""
    rows = []
    original = type(model)._moe_low_latency

    def spy(self, moe, y):
        rows.append(y.shape[0])
        return original(self, moe, y)

    type(model)._moe_low_latency = spy
    try:
        assert BatchGenerator(model).step() == []
    finally:
        type(model)._moe_low_latency = original
    assert rows == [0] * CONFIG.layers


@pytest.mark.parametrize("req, match", [
    (GenRequest("x", [], 1, 1), "context"),
    (GenRequest("x", [64], 1, 1), "context"),
    (GenRequest("x", [1], 0, 1), "budget"),
    (GenRequest("x", [1], 3, 2), "budget"),
    (GenRequest("x", [1], 1, 1, temperature=0.0), "temperature"),
    (GenRequest("x", [1] * 30, 4, 4), "max_seq"),
])
def test_bad_requests_change_nothing(model, req, match):
    gen = BatchGenerator(model)
    gen.add(GenRequest("ok", [1, 2], 2, 2))
    with pytest.raises(RLError, match=match):
        gen.add(req)
    with pytest.raises(RLError, match="already"):
        gen.add(GenRequest("ok", [1, 2], 2, 2))
    assert gen.keys() == {"ok"}
    assert len(run_all(gen)["ok"]) == 2


def test_apply_weights(model):
    gen = BatchGenerator(build_dense_reference(CONFIG))
    params = dict(gen.model.named_parameters())
    before = {k: v.detach().clone() for k, v in params.items()}
    with pytest.raises(RLError, match="unknown"):
        gen.apply_weights(1, {"embed": before["embed"], "nope": torch.zeros(1)})
    with pytest.raises(RLError, match="expected"):
        gen.apply_weights(1, {"embed": before["embed"] + 1, "head": torch.zeros(3)})
    with pytest.raises(RLError, match="not above"):
        gen.apply_weights(0, {"embed": before["embed"]})
    assert all(torch.equal(before[k], params[k]) for k in before) and gen.version == 0
    new = {k: v + 0.01 * torch.randn(v.shape, generator=torch.Generator().manual_seed(1)) for k, v in before.items()}
    gen.apply_weights(2, new)
    assert gen.version == 2 and all(torch.equal(params[k], new[k]) for k in new)
    gen.add(GenRequest("w", [1, 2, 3], 4, 4, seed=3))
    ev = run_all(gen)["w"]
    assert all(e.version == 2 for e in ev)
    ref = reference_logprobs(gen.model, [1, 2, 3], [e.token for e in ev], 1.0)
    assert float((ref - torch.tensor([e.logprob for e in ev])).abs().max()) <= TOL
    old = reference_logprobs(model, [1, 2, 3], [e.token for e in ev], 1.0)
    assert float((old - torch.tensor([e.logprob for e in ev])).abs().max()) > 10 * TOL


def test_weights_swap_mid_sequence():
    """Tokens after an update are the new version's, given everything before them: the running
    sequences' caches (old keys and values) are rebuilt under the new weights."""
    gen = BatchGenerator(build_dense_reference(CONFIG))
    old = build_dense_reference(CONFIG)
    reqs = [GenRequest(f"s{i}", [1, 2, 3], 8, 8, seed=i) for i in range(2)] + [GenRequest("t", [4, 5], 8, 8, seed=9)]
    for r in reqs:
        gen.add(r)
    out = {}
    for _ in range(3):
        for ev in gen.step():
            out.setdefault(ev.key, []).append(ev)
    g = torch.Generator().manual_seed(2)
    new = {k: v.detach() + 0.05 * torch.randn(v.shape, generator=g) for k, v in gen.model.named_parameters()}
    gen.apply_weights(1, new)
    for key, evs in run_all(gen).items():
        out[key] += evs
    for r in reqs:
        ev = out[r.key]
        assert [e.version for e in ev] == [0] * 3 + [1] * 5
        tokens = [e.token for e in ev]
        got = torch.tensor([e.logprob for e in ev])
        before = reference_logprobs(old, r.context, tokens, 1.0)[:3]
        after = reference_logprobs(gen.model, r.context, tokens, 1.0)[3:]
        assert float((before - got[:3]).abs().max()) <= TOL
        assert float((after - got[3:]).abs().max()) <= TOL


def test_model_config_round_trip(tmp_path):
    assert ModelConfig.from_json(CONFIG.to_json()) == CONFIG
    path = tmp_path / "m.json"
    path.write_text(CONFIG.to_json())
    assert ModelConfig.load(str(path)) == CONFIG and ModelConfig.load(CONFIG.to_json()) == CONFIG
    for bad, match in [('{"hidden": 64}', "multiple of 128"), ('{"nope": 1}', "unknown"), ("[1]", "object"),
                       ('{"topk": 9}', "exceeds"), ("{", "JSON"), ('{"layers": 0}', "positive")]:
        with pytest.raises(RLError, match=match):
            ModelConfig.from_json(bad)
    with pytest.raises(RLError, match="neither"):
        ModelConfig.load(str(tmp_path / "missing.json"))
    # Two builds are the same model (seeded init), and a rank's share has its expert rows.
    a, b = build_dense_reference(CONFIG), build_dense_reference(CONFIG)
    state = dict(a.named_parameters())
    assert all(torch.equal(v, dict(b.named_parameters())[k]) for k, v in state.items())
    local = local_expert_state(CONFIG, state, 1, 2)
    for name in expert_parameter_names(CONFIG):
        assert torch.equal(local[name], state[name][2:4])
    assert torch.equal(local["embed"], state["embed"])


# ---- spot.StopNotice ----

def test_notice_file(tmp_path):
    path = tmp_path / "spot-notice"
    notice = StopNotice(notice_file=str(path), poll_s=0.02).start()
    try:
        assert not notice.wait(0.1)
        path.write_text("terminate")
        assert notice.wait(30)
        assert str(path) in notice.reason
    finally:
        notice.close()


class _Notice(http.server.BaseHTTPRequestHandler):
    answer = 404

    def do_GET(self):  # noqa: N802 - http.server's name
        self.send_response(type(self).answer)
        self.end_headers()
        self.wfile.write(b'{"action": "terminate"}')

    def log_message(self, *args):
        pass


def test_notice_url():
    server = http.server.HTTPServer(("127.0.0.1", 0), _Notice)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/latest/meta-data/spot/instance-action"
    notice = StopNotice(notice_url=url, poll_s=0.02)
    try:
        assert not notice.check_now()  # 404: no notice
        notice.start()
        assert not notice.wait(0.1)
        _Notice.answer = 200
        assert notice.wait(30) and url in notice.reason
    finally:
        notice.close()
        server.shutdown()
        server.server_close()
        thread.join()
    # Nothing listening any more: not a notice, and no exception.
    assert not StopNotice(notice_url=url).check_now()


def test_sigterm_sets_notice_and_restores_handler():
    previous = signal.getsignal(signal.SIGTERM)
    notice = StopNotice().install_signals()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        assert notice.wait(30) and notice.reason == "SIGTERM"
        notice.set("later")
        assert notice.reason == "SIGTERM"
    finally:
        notice.close()
    assert signal.getsignal(signal.SIGTERM) == previous


# ---- a worker's first weights (rollout.worker._initial_published), its ranks as two processes ----

class _Committed:
    def __init__(self, version):
        self.version, self.tensors = version, {"w": torch.full((2,), float(version))}


class _Subscriber:
    """What the publisher committed on one rank: ``on_join`` when it joined, then ``later``
    (None: nothing) right after, before the ranks agreed."""

    def __init__(self, on_join, later):
        self.on_join, self.later, self.committed = on_join, later, on_join

    def wait_committed(self, version, timeout_s):
        if self.committed < version:
            self.committed = max(version, self.later or version)
        return _Committed(self.committed)

    def latest(self):
        return _Committed(self.committed)

    def poll(self):
        return None


class _Source:
    timeout_s = 10.0

    def __init__(self, on_join, later):
        self.subscriber = _Subscriber(on_join, later)

    def poll(self):
        return self.subscriber.poll()

    def first(self):
        update = _Committed(self.subscriber.committed)
        if self.subscriber.later is not None:  # lands on this rank after the join
            self.subscriber.committed = self.subscriber.later
        return update


class _Generator:
    version = 0

    def apply_weights(self, version, tensors):
        assert int(tensors["w"][0]) == version
        self.version = version


def _initial_rank(rank, init_file, joined, later, results):
    import torch.distributed as dist

    from proxyep.rl.rollout.worker import _initial_published
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        generator = _Generator()
        _initial_published(_Source(joined[rank], later[rank]), generator)
        results.put((rank, generator.version))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("joined, later, agreed", [
    ((3, 3), (4, None), 3),     # v4 reached rank 0 before the ranks agreed: both serve v3
    ((3, 4), (None, None), 4),  # rank 1 joined after v4: rank 0 waits for it, both serve v4
])
def test_ranks_of_a_late_worker_start_from_one_version(tmp_path, joined, later, agreed):
    """Every rank applies the version the ranks agreed on, not what landed on it since: ranks on
    different weights would run one EP model with two policies and tag tokens with versions the
    others did not use (seen as staleness 1 at eta = 0 in the seeded run)."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_initial_rank, args=(r, str(tmp_path / "init"), joined, later, results))
             for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0, p.exitcode
    got = dict(results.get(timeout=10) for _ in range(2))
    assert got == {0: agreed, 1: agreed}, got
