"""Rollout workers as real processes: ``proxyep launch -n 2 --ranks-per-node 1`` (two emulated
nodes, the EP exchange over the TCP fabric with the reorder shim) of ``python3 -m
proxyep.rl.rollout.worker``, against a MemoryCoordinator served from this process
(rollout_harness.py).

test_worker_completes_groups: the worker serves groups with lease_tokens 5 (so samples take
several leases, each continuing after the prefix the last one left) from weights v3 read from a
file; each sample is checked against the dense reference loaded with the same weights:

* behaviour log-probs = log_softmax(logits / T) at each token recomputed over the whole sequence
  (prompt + every token before it) by the reference with the LL exchange's roundings reproduced,
  within 2e-3. Why that bound: both sides compute the same float32/bf16 arithmetic, but the
  worker's rows are batched differently (incremental KV cache, other rows in each expert GEMM,
  on the other rank), which can move a float32 result by an ulp and so a bf16 rounding of an
  expert output by one bf16 ulp (2^-8 relative); through the remaining layers that is ~1e-3 in a
  log-prob at most. A wrong context, position, temperature or version gives errors of 0.1 and
  more (a token's log-prob under v0 instead of v3 differs by ~0.5 here);
* versions: every token tagged 3; lengths: max_new_tokens unless the stop token ended the sample
  (then it is the last token and only there); routed experts recorded for every token;
* continuation from a foreign prefix: one sample was first leased by the test itself, which
  reported three tokens and released it; the worker's lease carries them as its prefix and its
  output is prompt + prefix + new tokens, the new ones' log-probs taken after that prefix;
* the output of every sample is exactly the concatenation of what the store accepted for it.

test_coordinator_goes_away: the worker, serving, loses its coordinator (server closed): it exits
non-zero promptly with a message naming the coordinator's address; test_coordinator_unreachable:
one that cannot reach it at start exits 1 naming it. (One rank each: the EP side is not what
they test.)
"""

import os
import time

import pytest
import torch

from proxyep.rl.coordinator.protocol import GroupSpec, GroupState, Progress, ReleaseReason, SamplingParams
from rollout_harness import CONFIG, CoordinatorSide, Reference, WorkerJob, check_concatenation, wait_for

LOGPROB_ABS = 2e-3
VERSION = 3
START_S = 120  # a worker's start-up (torch import, fabric bootstrap) on a loaded 2-core box


@pytest.fixture
def side():
    s = CoordinatorSide(lease_timeout_s=30.0, lease_tokens=5)
    yield s
    s.close()


@pytest.fixture
def jobs():
    started = []
    yield started
    for job in started:
        job.stop()


def perturbed_state(seed=77):
    """Weights v3: the seeded initial weights plus seeded noise (so v0 would not match)."""
    g = torch.Generator().manual_seed(seed)
    return {name: (p.detach() + 0.05 * p.detach().abs().mean() * torch.randn(p.shape, generator=g))
            for name, p in Reference().model.named_parameters()}


def stop_group(ref):
    """A group whose stop token is the likeliest first token after its prompt, at a temperature
    that makes it nearly certain (so the stop path is exercised, not left to chance)."""
    prompt = [7, 8, 9]
    with torch.no_grad():
        logits, _ = ref.model(torch.tensor([prompt]), low_latency=True)
    last = logits[0, -1]
    stop = int(last.argmax())
    temperature = 1.0
    while float(torch.softmax(last / temperature, -1)[stop]) < 0.999:
        temperature /= 2
    return GroupSpec("stop", prompt, 3, SamplingParams(max_new_tokens=8, temperature=temperature, stop_token=stop))


def test_worker_completes_groups(side, jobs, tmp_path):
    state = perturbed_state()
    ref = Reference(state=state)
    weights = tmp_path / "weights.pt"
    torch.save({"version": VERSION, "state": state}, weights)
    c = side.coordinator
    c.set_version(VERSION)
    groups = [
        GroupSpec("cont", [10, 11], 1, SamplingParams(max_new_tokens=9, temperature=0.9), priority=10),
        GroupSpec("g0", [1, 2, 3], 4, SamplingParams(max_new_tokens=10, temperature=1.0)),
        GroupSpec("g1", [4, 5, 6, 7, 8], 3, SamplingParams(max_new_tokens=12, temperature=0.7, stop_token=9)),
        stop_group(ref),
    ]
    for g in groups:
        c.submit(g)
    # A foreign prefix: the test leases "cont" itself, reports 3 tokens and releases it.
    (mine,) = c.lease("test-writer", 1)
    assert mine.group_id == "cont"
    prefix = Progress([20, 21, 22], [-1.0, -2.0, -3.0], [VERSION] * 3, [[[0, 1]] * CONFIG.layers] * 3)
    c.report_partial(mine.lease_id, "test-writer", prefix)
    c.release(mine.lease_id, "test-writer", ReleaseReason.interrupted)

    job = WorkerJob(side.env, side.url, "w-ep2", tmp_path / "w.log",
                    extra=["--capacity", "6", "--report-every", "3", "--weights", str(weights), "--seed", "4"])
    jobs.append(job)
    wait_for(lambda: all(c.group_state(g.group_id) is GroupState.complete for g in groups) or
             job.process.poll() is not None, START_S, "every group complete")
    assert job.process.poll() is None, job.output()
    done = {g.spec.group_id: g for g in c.take_completed()}
    assert sorted(done) == sorted(g.group_id for g in groups) and c.take_completed() == []

    worst, stopped, multi_lease = 0.0, 0, 0
    for spec in groups:
        group = done[spec.group_id]
        assert [s.sample_index for s in group.samples] == list(range(spec.num_samples))
        for sample in group.samples:
            out, sp = sample.output, spec.sampling
            check_concatenation(c, spec.group_id, sample)
            assert len(out.tokens) <= sp.max_new_tokens
            if sample.finish_reason == "stop":
                stopped += 1
                assert out.tokens[-1] == sp.stop_token
            else:
                assert sample.finish_reason == "length" and len(out.tokens) == sp.max_new_tokens
            if sp.stop_token is not None:
                assert sp.stop_token not in out.tokens[:-1]
            leases = c.leases_of(spec.group_id, sample.sample_index)
            multi_lease += len(leases) > 1
            for lease in leases:  # each lease continued after everything before it
                assert lease.prefix.tokens == out.tokens[:len(lease.prefix.tokens)]
            start = 3 if spec.group_id == "cont" else 0
            if start:
                worker_leases = [lease for lease in leases if lease.worker_id == "w-ep2"]
                assert worker_leases[0].prefix.tokens == [20, 21, 22] and out.tokens[:3] == [20, 21, 22]
            assert out.versions[start:] == [VERSION] * (len(out.tokens) - start)
            assert len(out.routed_experts) == len(out.tokens)
            assert all(len(layers) == CONFIG.layers and all(len(k) == CONFIG.topk for k in layers)
                       for layers in out.routed_experts[start:])
            expected = ref.logprobs(spec.prompt + out.tokens[:start], out.tokens[start:], sp.temperature)
            worst = max(worst, float((expected - torch.tensor(out.logprobs[start:])).abs().max()))
    print(f"max |behaviour logprob - reference| {worst:.2e}; {stopped} samples ended on the stop token; "
          f"{multi_lease} samples took several leases")
    assert worst <= LOGPROB_ABS
    assert stopped >= 1 and multi_lease >= 1
    # v0 (the initial weights) would not have produced these log-probs: the check has teeth.
    g0 = done["g0"].samples[0].output
    v0 = Reference().logprobs([1, 2, 3], g0.tokens, 1.0)
    assert float((v0 - torch.tensor(g0.logprobs)).abs().max()) > 50 * LOGPROB_ABS

    # A new version while serving: the file replaced (rename); every rank stages it, and all
    # apply it at the same turn; later tokens are tagged 4 and are v4's log-probs.
    state4 = perturbed_state(seed=78)
    staging = tmp_path / "weights.tmp"
    torch.save({"version": VERSION + 1, "state": state4}, staging)
    os.replace(staging, weights)
    wait_for(lambda: job.output().count(f"weights version {VERSION + 1} applied") == 2 or
             job.process.poll() is not None, 60, "both ranks applying v4")
    c.set_version(VERSION + 1)
    after = GroupSpec("after", [2, 3], 2, SamplingParams(max_new_tokens=6, temperature=1.0))
    c.submit(after)
    wait_for(lambda: c.group_state("after") is GroupState.complete or job.process.poll() is not None, 60,
             "group 'after' complete")
    (group,) = c.take_completed()
    ref4 = Reference(state=state4)
    for sample in group.samples:
        out = sample.output
        assert out.versions == [VERSION + 1] * len(out.tokens)
        expected = ref4.logprobs(after.prompt, out.tokens, 1.0)
        assert float((expected - torch.tensor(out.logprobs)).abs().max()) <= LOGPROB_ABS

    job.signal_rank(0, 15)
    assert job.wait(60) == 0, job.output()
    assert "stopped (rank 0: SIGTERM)" in job.output()


def test_coordinator_goes_away(side, jobs, tmp_path):
    c = side.coordinator
    c.hold_leases("w-lost")
    job = WorkerJob(side.env, side.url, "w-lost", tmp_path / "w.log", ranks=1,
                    extra=["--coordinator-timeout-s", "5"])
    jobs.append(job)
    wait_for(lambda: c.asked("w-lost") or job.process.poll() is not None, START_S, "the worker's first lease call")
    side.close()
    gone = time.monotonic()
    code = job.wait(60)
    print(f"worker exited {time.monotonic() - gone:.2f} s after its coordinator went away")
    out = job.output()
    assert code != 0, out
    assert f"coordinator {side.url} failed during lease" in out, out


def test_coordinator_unreachable(side, jobs, tmp_path):
    url = side.url
    side.close()
    job = WorkerJob(side.env, url, "w-none", tmp_path / "w.log", ranks=1, extra=["--coordinator-timeout-s", "5"])
    jobs.append(job)
    code = job.wait(START_S)
    out = job.output()
    assert code == 1, out
    assert f"cannot reach coordinator {url}" in out, out
