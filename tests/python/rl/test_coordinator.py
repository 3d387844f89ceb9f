"""The coordinator's semantics (coordinator.py's docstring), each test run against every store:
in this process (memory), on a real redis-server (redis), and from another process through the
RPC service (service). Time is the fixture's clock, advanced by the tests."""

import copy
import threading

import pytest

from coordinator_fixtures import redis_server, stores  # noqa: F401 (fixtures)
from proxyep.rl import (GroupSpec, GroupState, Progress, ReleaseReason, RLError, SamplingParams, StaleLease,
                        UnknownLease)

TIMEOUT = 30.0


def group(gid, n=1, prompt=(1, 2, 3), max_new=8, priority=0, stop=None, **kw):
    return GroupSpec(gid, list(prompt), n, SamplingParams(max_new_tokens=max_new, stop_token=stop),
                     priority=priority, **kw)


def prog(tokens, version=0, first=0):
    """Progress for ``tokens`` with log-probs that say where they came from."""
    return Progress(list(tokens), [-(first + i) / 8 for i in range(len(tokens))], [version] * len(tokens))


def order(leases):
    return [(l.group_id, l.sample_index) for l in leases]


def test_queue_order_is_priority_then_admission(stores):
    c = stores.make()
    c.submit(group("low-a", n=2))
    c.submit(group("high", priority=5))
    c.submit(group("low-b"))
    c.submit(group("last", priority=-3))
    c.submit(group("mid", priority=1))
    assert order(c.lease("w", 2)) == [("high", 0), ("mid", 0)]
    assert order(c.lease("w", 10)) == [("low-a", 0), ("low-a", 1), ("low-b", 0), ("last", 0)]
    assert c.lease("w", 1) == []
    assert c.stats()["running"] == 6 and c.stats()["queued"] == 0


def test_lease_fields(stores):
    c = stores.make(lease_timeout_s=TIMEOUT, lease_tokens=5)
    c.set_version(3)
    c.submit(group("g", n=1, prompt=[7, 8], max_new=12, metadata={"answer": "42"}))
    [lease] = c.lease("w1", 4)
    assert (lease.group_id, lease.sample_index, lease.worker_id, lease.prompt) == ("g", 0, "w1", [7, 8])
    assert lease.prefix == Progress() and lease.attempt == 1 and lease.version_started == 3
    assert lease.token_budget == 5 and lease.deadline == stores.clock() + TIMEOUT
    assert lease.sampling == SamplingParams(max_new_tokens=12)


def test_expiry_requeues_the_remainder_in_its_place(stores):
    c = stores.make(lease_timeout_s=TIMEOUT)
    c.submit(group("first", n=2, max_new=8))
    [a, b] = c.lease("w1", 2)
    c.report_partial(a.lease_id, "w1", Progress([5, 6], [-0.5, -0.25], [0, 0]))
    c.set_version(1)
    c.report_partial(a.lease_id, "w1", Progress([7], [-0.125], [1], ))
    c.submit(group("later", n=1))
    c.complete(b.lease_id, "w1", prog([9, 9]), "stop")
    stores.clock.advance(TIMEOUT + 1)  # w1 died: a's deadline passes
    [again, nxt] = c.lease("w2", 2)
    # The remainder comes before the group admitted after it, with its prefix as reported.
    assert (again.group_id, again.sample_index, nxt.group_id) == ("first", 0, "later")
    assert again.prefix == Progress([5, 6, 7], [-0.5, -0.25, -0.125], [0, 0, 1])
    assert again.attempt == 2 and again.token_budget == 5 and again.version_started == 1
    s = c.stats()
    assert (s["expired"], s["requeued"], s["running"], s["tokens_reported"]) == (1, 1, 2, 5)
    c.complete(again.lease_id, "w2", prog([1]), "stop")
    [done] = c.take_completed()
    assert done.samples[0].output.tokens == [5, 6, 7, 1] and done.samples[0].attempts == 2
    assert done.samples[0].output.versions == [0, 0, 1, 0]


def test_reap_and_any_call_find_expiry(stores):
    c = stores.make(lease_timeout_s=TIMEOUT)
    c.submit(group("g", n=3))
    leases = c.lease("w", 3)
    stores.clock.advance(TIMEOUT)  # exactly at the deadline: still held
    assert c.reap() == 0
    stores.clock.advance(0.5)
    assert c.stats()["running"] == 0  # found by stats(), not only by reap()
    assert c.reap() == 0
    assert c.heartbeat("w", [l.lease_id for l in leases]) == []


def test_heartbeat_keeps_a_lease(stores):
    c = stores.make(lease_timeout_s=TIMEOUT)
    c.submit(group("g", n=2))
    [a, b] = c.lease("w", 2)
    for _ in range(4):  # 80 s in all, never 30 without a heartbeat
        stores.clock.advance(20)
        assert c.heartbeat("w", [a.lease_id, "L999", b.lease_id]) == [a.lease_id, b.lease_id]
    assert c.heartbeat("other", [a.lease_id]) == []  # not the other worker's to extend
    stores.clock.advance(20)
    c.report_partial(a.lease_id, "w", prog([1]))  # a report extends it too
    stores.clock.advance(20)
    assert c.heartbeat("w", [a.lease_id, b.lease_id]) == [a.lease_id]
    assert c.stats()["expired"] == 1


def test_stale_and_unknown_leases_change_nothing(stores):
    c = stores.make(lease_timeout_s=TIMEOUT)
    c.submit(group("g", n=2))
    [a, b] = c.lease("w1", 2)
    c.report_partial(a.lease_id, "w1", prog([1, 2]))
    stores.clock.advance(TIMEOUT + 1)
    [a2] = c.lease("w2", 1)
    assert a2.sample_index == 0
    before = c.snapshot()
    calls = [lambda: c.report_partial(a.lease_id, "w1", prog([3])),
             lambda: c.complete(a.lease_id, "w1", prog([3]), "stop"),
             lambda: c.release(a.lease_id, "w1", ReleaseReason.interrupted, prog([3])),
             lambda: c.report_partial(a2.lease_id, "w1", prog([3])),  # held by w2, not w1
             lambda: c.complete(a2.lease_id, "w1", prog([3]), "stop")]
    for call in calls:
        with pytest.raises(StaleLease):
            call()
    for lease_id in ("L999", "bogus", "L0"):
        with pytest.raises(UnknownLease):
            c.report_partial(lease_id, "w2", prog([3]))
        with pytest.raises(UnknownLease):
            c.complete(lease_id, "w2", prog([3]), "stop")
    assert c.snapshot() == before
    c.complete(a2.lease_id, "w2", prog([3]), "stop")
    assert c.stats()["samples_completed"] == 1


def test_release_reasons(stores):
    c = stores.make(max_attempts=2)
    c.submit(group("g", n=1, max_new=8))
    for reason in (ReleaseReason.interrupted, ReleaseReason.draining, "interrupted"):
        [lease] = c.lease("w", 1)
        assert lease.attempt == 1  # interruptions are not the sample's fault
        c.release(lease.lease_id, "w", reason, prog([4]))
    [lease] = c.lease("w", 1)
    assert lease.prefix.tokens == [4, 4, 4] and lease.token_budget == 5
    c.release(lease.lease_id, "w", ReleaseReason.error)
    [lease] = c.lease("w", 1)
    assert lease.attempt == 2
    c.release(lease.lease_id, "w", ReleaseReason.error, prog([5]))
    assert c.group_state("g") is GroupState.failed  # two errors: attempts exhausted
    assert c.lease("w", 1) == []
    s = c.stats()
    assert (s["interrupted"], s["drained"], s["errors"], s["requeued"], s["failed_groups"]) == (2, 1, 2, 4, 1)
    assert (s["running"], s["queued"]) == (0, 0)


def test_expiries_count_as_attempts_and_fail_the_group(stores):
    c = stores.make(lease_timeout_s=TIMEOUT, max_attempts=2)
    c.submit(group("g", n=2))
    c.submit(group("h", n=1))
    [a, b] = c.lease("w1", 2)
    c.complete(b.lease_id, "w1", prog([1]), "stop")
    stores.clock.advance(TIMEOUT + 1)
    [a2, h] = c.lease("w2", 2)
    assert (a2.group_id, a2.attempt, h.group_id) == ("g", 2, "h")
    stores.clock.advance(TIMEOUT - 1)
    assert c.heartbeat("w2", [h.lease_id]) == [h.lease_id]
    stores.clock.advance(2)
    assert c.group_state("g") is GroupState.failed and c.group_state("h") is GroupState.pending
    with pytest.raises(StaleLease):
        c.complete(a2.lease_id, "w2", prog([1]), "stop")
    c.complete(h.lease_id, "w2", prog([1]), "stop")
    assert [g.spec.group_id for g in c.take_completed()] == ["h"]
    s = c.stats()
    assert (s["expired"], s["failed_groups"], s["completed_groups"], s["queued"]) == (2, 1, 1, 0)


def test_aborted_release_drops_the_group(stores):
    c = stores.make()
    c.submit(group("g", n=3))
    [a, b] = c.lease("w", 2)
    c.release(a.lease_id, "w", ReleaseReason.aborted, prog([1]))
    assert c.group_state("g") is GroupState.aborted
    with pytest.raises(StaleLease):
        c.report_partial(b.lease_id, "w", prog([1]))
    assert c.lease("w", 5) == []
    s = c.stats()
    assert (s["aborted_groups"], s["requeued"], s["running"], s["queued"], s["tokens_reported"]) == (1, 0, 0, 0, 0)


def test_abort_one_and_all(stores):
    c = stores.make()
    for gid in ("a", "b", "c", "done"):
        c.submit(group(gid, n=2))
    leases = c.lease("w", 8)
    for l in leases:
        if l.group_id == "done":
            c.complete(l.lease_id, "w", prog([1]), "stop")
    assert c.abort("a") == 1
    assert c.abort("a") == 0  # no longer pending
    held = [l.lease_id for l in leases if l.group_id in ("b", "c")]
    assert c.heartbeat("w", [l.lease_id for l in leases]) == held
    with pytest.raises(RLError, match="unknown group"):
        c.abort("nope")
    assert c.abort(None) == 2
    assert c.heartbeat("w", held) == []
    assert [c.group_state(g) for g in ("a", "b", "c", "done")] == [GroupState.aborted] * 3 + [GroupState.complete]
    assert [g.spec.group_id for g in c.take_completed()] == ["done"]  # abort leaves complete groups
    c.submit(group("new"))
    assert order(c.lease("w", 5)) == [("new", 0)]
    assert c.stats()["aborted_groups"] == 3


def test_take_completed_once_oldest_first_in_index_order(stores):
    c = stores.make()
    specs = [group(f"g{i}", n=3, prompt=[i + 1], max_new=6, metadata={"i": i}) for i in range(4)]
    for spec in specs:
        c.submit(spec)
    leases = c.lease("w", 12)
    # Finish them newest group first, samples in reverse: the hand-out order is admission's.
    for l in reversed(leases):
        c.report_partial(l.lease_id, "w", prog([l.sample_index, 0], first=0))
        c.complete(l.lease_id, "w", prog([10 + l.sample_index], first=2), "length" if l.sample_index else "stop")
    first = c.take_completed(max_groups=3)
    assert [g.spec for g in first] == specs[:3]
    rest = c.take_completed()
    assert [g.spec for g in rest] == specs[3:]
    assert c.take_completed() == []
    for g in first + rest:
        assert [s.sample_index for s in g.samples] == [0, 1, 2]
        for s in g.samples:
            assert s.group_id == g.spec.group_id and s.prompt == g.spec.prompt and s.attempts == 1
            assert s.output == Progress([s.sample_index, 0, 10 + s.sample_index], [0, -1 / 8, -2 / 8], [0, 0, 0])
            assert s.finish_reason == ("length" if s.sample_index else "stop")
        assert g.admitted_at == stores.clock()
    assert [c.group_state(s.group_id) for s in specs] == [GroupState.complete] * 4


def test_nothing_left_to_generate_finishes_at_requeue(stores):
    c = stores.make(lease_timeout_s=TIMEOUT)
    c.submit(group("len", n=1, max_new=3))
    c.submit(group("stop", n=1, max_new=8, stop=2))
    [a, b] = c.lease("w", 2)
    c.report_partial(a.lease_id, "w", prog([1, 1, 1]))
    c.release(b.lease_id, "w", ReleaseReason.interrupted, prog([1, 2]))
    stores.clock.advance(TIMEOUT + 1)
    assert c.lease("w", 2) == []
    done = {g.spec.group_id: g.samples[0] for g in c.take_completed()}
    assert (done["len"].finish_reason, done["len"].output.tokens) == ("length", [1, 1, 1])
    assert (done["stop"].finish_reason, done["stop"].output.tokens) == ("stop", [1, 2])
    s = c.stats()
    assert (s["samples_completed"], s["completed_groups"], s["requeued"], s["expired"]) == (2, 2, 0, 1)


def test_token_budget_bounds_a_lease(stores):
    c = stores.make(lease_tokens=3)
    c.submit(group("g", max_new=7))
    [a] = c.lease("w", 1)
    assert a.token_budget == 3
    with pytest.raises(RLError, match="token_budget"):
        c.report_partial(a.lease_id, "w", prog([1, 2, 3, 4]))
    c.report_partial(a.lease_id, "w", prog([1, 2]))
    with pytest.raises(RLError, match="token_budget"):
        c.complete(a.lease_id, "w", prog([3, 4]), "stop")
    c.report_partial(a.lease_id, "w", prog([3]))
    c.release(a.lease_id, "w", ReleaseReason.draining)  # this stretch is done, the sample is not
    [b] = c.lease("w", 1)
    assert (b.prefix.tokens, b.token_budget, b.attempt) == ([1, 2, 3], 3, 1)
    c.release(b.lease_id, "w", ReleaseReason.draining, prog([4, 5, 6]))
    [d] = c.lease("w", 1)
    assert d.token_budget == 1
    with pytest.raises(RLError, match="max_new_tokens"):
        c.complete(d.lease_id, "w", prog([7, 8]), "length")
    c.complete(d.lease_id, "w", prog([7]), "length")
    [g] = c.take_completed()
    assert g.samples[0].output.tokens == [1, 2, 3, 4, 5, 6, 7]


def test_policy_lag_holds_back_stale_groups(stores):
    c = stores.make()
    c.submit(group("old", n=1, max_policy_lag=1, min_version=0))
    c.submit(group("new", n=1, max_policy_lag=1, min_version=2))
    c.set_version(2)
    assert order(c.lease("w", 5)) == [("new", 0)]
    assert c.stats()["queued"] == 1  # held back, not dropped
    assert c.abort("old") == 1 and c.stats()["queued"] == 0


def test_versions(stores):
    c = stores.make()
    assert c.version() == 0
    c.set_version(2)
    c.set_version(2)
    with pytest.raises(RLError, match="lower"):
        c.set_version(1)
    assert c.version() == 2
    c.submit(group("g"))
    assert c.lease("w", 1)[0].version_started == 2


def test_routed_experts_travel_with_the_tokens(stores):
    c = stores.make(lease_timeout_s=TIMEOUT)
    c.submit(group("g", max_new=4))
    [a] = c.lease("w", 1)
    first = Progress([1, 2], [-0.5, -0.5], [0, 0], [[[0, 3]], [[1, 2]]])
    c.report_partial(a.lease_id, "w", first)
    with pytest.raises(RLError, match="routed"):
        c.report_partial(a.lease_id, "w", prog([3]))
    stores.clock.advance(TIMEOUT + 1)
    [b] = c.lease("w", 1)
    assert b.prefix == first
    c.complete(b.lease_id, "w", Progress([3], [-1.0], [0], [[[2, 0]]]), "stop")
    [g] = c.take_completed()
    assert g.samples[0].output.routed_experts == [[[0, 3]], [[1, 2]], [[2, 0]]]


def test_bad_input_is_refused_and_the_state_still_works(stores):
    c = stores.make(lease_tokens=4)
    c.submit(group("g", n=2, max_new=4))
    [a] = c.lease("w", 1)
    before = c.snapshot()
    bad = [
        lambda: c.submit(group("e", prompt=[])),
        lambda: c.submit(group("e", n=0)),
        lambda: c.submit(group("e", prompt=[1, -2])),
        lambda: c.submit(group("e", max_new=0)),
        lambda: c.submit(group("g")),  # duplicate id
        lambda: c.submit(group("")),
        lambda: c.lease("w", 0),
        lambda: c.lease("w", -1),
        lambda: c.lease("", 1),
        lambda: c.report_partial(a.lease_id, "w", prog([1, 2, 3, 4, 5])),  # beyond max_new_tokens
        lambda: c.report_partial(a.lease_id, "w", Progress([1, 2], [0.0], [0, 0])),  # mismatched lengths
        lambda: c.report_partial(a.lease_id, "w", Progress([1], [0.0], [0], [[[1]], [[2]]])),
        lambda: c.complete(a.lease_id, "w", prog([1]), "eos"),
        lambda: c.release(a.lease_id, "w", "vanished"),
        lambda: c.set_version(-1),
        lambda: c.take_completed(0),
        lambda: c.group_state("nope"),
        lambda: c.abort(""),
        lambda: c.heartbeat("w", "L1"),
        lambda: c.restore({"format": "something else"}),
    ]
    c.set_version(5)
    before["version"] = 5
    for call in bad + [lambda: c.set_version(4)]:
        with pytest.raises(RLError):
            call()
        assert c.snapshot() == before
    c.report_partial(a.lease_id, "w", prog([1, 2]))
    c.complete(a.lease_id, "w", prog([3]), "stop")
    [b] = c.lease("w", 1)
    c.complete(b.lease_id, "w", prog([1, 2, 3, 4]), "length")
    [g] = c.take_completed()
    assert [s.output.tokens for s in g.samples] == [[1, 2, 3], [1, 2, 3, 4]]


@pytest.mark.parametrize("target", ["memory", "redis"])
def test_snapshot_restores_into_either_store(stores, target):
    if stores.kind == "service" and target != "memory":
        pytest.skip("service -> redis is memory -> redis through the RPC: covered")
    c = stores.make(lease_timeout_s=TIMEOUT)
    c.set_version(4)
    c.submit(group("done", n=1))
    c.submit(group("taken", n=1))
    c.submit(group("busy", n=3, priority=2))
    c.submit(group("gone", n=1))
    leases = {(l.group_id, l.sample_index): l for l in c.lease("w", 10)}
    c.complete(leases["taken", 0].lease_id, "w", prog([1]), "stop")
    assert [g.spec.group_id for g in c.take_completed()] == ["taken"]
    c.complete(leases["done", 0].lease_id, "w", prog([2]), "stop")
    c.report_partial(leases["busy", 0].lease_id, "w", prog([7, 7]))
    c.complete(leases["busy", 1].lease_id, "w", prog([8]), "stop")
    c.release(leases["busy", 2].lease_id, "w", ReleaseReason.error, prog([9]))
    c.abort("gone")
    state = c.snapshot()

    r = stores.make(target, lease_timeout_s=TIMEOUT) if stores.kind != "service" else stores.make()
    r.restore(state)
    # The same state, in either store, but for the outstanding lease: requeued with its progress.
    expected = copy.deepcopy(state)
    assert [s["leased"] for s in expected["groups"][2]["samples"]] == [True, False, False]
    expected["groups"][2]["samples"][0]["leased"] = False
    expected["counters"]["requeued"] += 1
    assert r.snapshot() == expected
    assert r.version() == 4
    assert [r.group_state(g) for g in ("done", "taken", "busy", "gone")] == [
        GroupState.complete, GroupState.complete, GroupState.pending, GroupState.aborted]
    with pytest.raises(StaleLease):  # issued before the snapshot: stale, not unknown
        r.complete(leases["busy", 0].lease_id, "w", prog([1]), "stop")
    # The error release's sample keeps its used attempt.
    got = {l.sample_index: l for l in r.lease("w2", 5)}
    assert set(got) == {0, 2}
    assert (got[0].prefix.tokens, got[0].attempt) == ([7, 7], 1)
    assert (got[2].prefix.tokens, got[2].attempt) == ([9], 2)
    for l in got.values():
        assert l.lease_id not in {x.lease_id for x in leases.values()}
        r.complete(l.lease_id, "w2", prog([5]), "stop")
    out = {g.spec.group_id: g for g in r.take_completed()}
    assert list(out) == ["done", "busy"]
    assert [s.output.tokens for s in out["busy"].samples] == [[7, 7, 5], [8], [9, 5]]
    assert r.stats()["completed_groups"] == 3


def test_restore_replaces_everything(stores):
    c = stores.make()
    empty = c.snapshot()
    c.submit(group("g", n=2))
    [a] = c.lease("w", 1)
    c.restore(empty)
    assert c.stats() == dict(empty["counters"], running=0, queued=0)
    with pytest.raises(RLError):
        c.group_state("g")
    with pytest.raises(StaleLease):
        c.complete(a.lease_id, "w", prog([1]), "stop")
    c.submit(group("g", n=1))  # the id is free again
    [b] = c.lease("w", 1)
    assert b.lease_id != a.lease_id


def test_concurrent_workers_count_everything_once(stores):
    """Worker threads, each with its own handle (connection) on one coordinator, race each other
    and lease expiries that one of them causes by moving the clock: every sample completes once,
    with its tokens exactly once, and the counters add up."""
    c = stores.make(lease_timeout_s=TIMEOUT, max_attempts=1000)
    groups, samples, max_new = 12, 3, 6
    for g in range(groups):
        c.submit(group(f"g{g}", n=samples, max_new=max_new))

    def tokens(gid, i):
        return [(7 * int(gid[1:]) + 3 * i + p) % 40 + 1 for p in range(max_new)]

    seen = [dict(leases=0, tokens=0, completes=0) for _ in range(4)]
    errors, first_lease = [], threading.Event()

    def work(t, handle):
        try:
            worker, deadline = f"w{t}", threading.Event()
            timer = threading.Timer(120, deadline.set)  # a bug must fail the test, not hang it
            timer.start()
            while handle.stats()["samples_completed"] < groups * samples:
                assert not deadline.is_set(), "workers did not finish within 120 s"
                for lease in handle.lease(worker, 2):
                    seen[t]["leases"] += 1
                    if t == 0 and seen[t]["leases"] % 3 == 1:
                        stores.clock.advance(TIMEOUT + 1)  # every lease out now expires under its worker
                        first_lease.set()
                    want = tokens(lease.group_id, lease.sample_index)
                    n = len(lease.prefix.tokens)
                    assert lease.prefix.tokens == want[:n]
                    half = (n + max_new) // 2
                    try:
                        if half < max_new - 1:
                            handle.report_partial(lease.lease_id, worker, prog(want[n:half]))
                            seen[t]["tokens"] += half - n
                            n = half
                        handle.complete(lease.lease_id, worker, prog(want[n:]), "length")
                        seen[t]["tokens"] += max_new - n
                        seen[t]["completes"] += 1
                    except StaleLease:
                        pass  # expired under us: requeued with what was reported
            timer.cancel()
        except Exception as e:  # re-raised by the main thread
            errors.append(e)
        finally:
            first_lease.set()

    threads = [threading.Thread(target=work, args=(t, stores.another(c))) for t in range(4)]
    threads[0].start()
    assert first_lease.wait(60)  # w0 holds a lease and has moved the clock: at least one expiry
    for th in threads[1:]:
        th.start()
    for th in threads:
        th.join(180)
    assert not any(th.is_alive() for th in threads) and not errors, errors
    done = c.take_completed()
    assert [g.spec.group_id for g in done] == [f"g{g}" for g in range(groups)]
    for g in done:
        assert [s.output.tokens for s in g.samples] == [tokens(g.spec.group_id, i) for i in range(samples)]
    s = c.stats()
    total = {k: sum(x[k] for x in seen) for k in seen[0]}
    assert (s["leases_issued"], s["tokens_reported"], s["samples_completed"]) == (
        total["leases"], total["tokens"], total["completes"])
    assert s["samples_completed"] == groups * samples and s["requeued"] == s["expired"] >= 1
    assert (s["running"], s["queued"]) == (0, 0)
