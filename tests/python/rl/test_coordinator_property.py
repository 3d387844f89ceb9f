"""Random runs of the lease protocol against each store (hypothesis, stateful): simulated workers
lease, generate, report, complete, release, heartbeat, die (stop heartbeating while time moves
on), while groups are submitted and aborted, versions published, completed groups taken and the
state snapshotted and restored (into the same or a new coordinator). Checked on every lease:

- queue order: the leases of one call come in (-priority, admission, index) order, and no sample
  still waiting (and not held back by its policy lag) comes before any of them; fewer leases than
  asked for only when nothing leasable is left (read from a snapshot taken right after);
- the prefix is exactly every token the coordinator accepted for that sample so far, which are
  the generator's first tokens (nothing lost on requeue, nothing duplicated).

At the end everything is drained (every worker dies, a drainer runs what is left) and:

- every submitted group ended exactly once, as complete, failed or aborted;
- every complete group was handed out exactly once, oldest admission first, with all its
  samples, each exactly its generator's tokens and log-probs in order, versions non-decreasing;
- the counters agree with what the workers saw.

The generator: sample (group, i) is a fixed token sequence of length L (1..max_new_tokens); it
ends with the stop token when L < max_new_tokens, else by length. Workers never send a sample's
last token before complete(), so a sample finishes only by complete() here (the coordinator
finishing a remainder with nothing left is covered in test_coordinator.py)."""

import zlib

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule, run_state_machine_as_test

from coordinator_fixtures import redis_server, stores  # noqa: F401 (fixtures)
from proxyep.rl import GroupSpec, GroupState, Progress, ReleaseReason, SamplingParams, StaleLease

STOP = 0
TIMEOUT = 30.0
WORKERS = ("w0", "w1", "w2")
EXAMPLES = {"memory": 200, "redis": 120, "service": 80}


def _h(*key):
    return zlib.crc32("/".join(map(str, key)).encode())


def expected(gid, i, max_new):
    """The generator's whole output for sample i of gid: (tokens, logprobs)."""
    n = 1 + _h("len", gid, i) % max_new
    tokens = [1 + _h("tok", gid, i, p) % 50 for p in range(n)]
    if n < max_new:
        tokens[-1] = STOP
    return tokens, [-(_h("lp", gid, i, p) % 1000) / 1000 for p in range(n)]


class Held:
    """A lease as its worker sees it: how many tokens it sent, and the ones not yet sent."""

    def __init__(self, lease):
        self.lease, self.sent, self.buffer = lease, 0, []

    @property
    def position(self):
        return len(self.lease.prefix.tokens) + self.sent + len(self.buffer)


class Protocol(RuleBasedStateMachine):
    """The test sets ``fresh(options) -> (coordinator, clock)``: an empty coordinator (a store
    that cannot take other options sets the ones it runs with in ``options``)."""
    fresh = None

    def __init__(self):
        super().__init__()
        self.c = None
        self.held = {}  # lease id -> (worker, Held)
        self.groups = {}  # gid -> spec
        self.accepted = {}  # (gid, i) -> tokens the coordinator took for the sample
        self.taken = {}  # gid -> CompletedGroup
        self.seen = dict(leases=0, tokens=0, completes=0, errors=0, interrupted=0, drained=0, aborted_groups=0)

    @initialize(lease_tokens=st.sampled_from([None, 2, 3]), max_attempts=st.sampled_from([1, 2, 3, 3]))
    def options(self, lease_tokens, max_attempts):
        self.opts = dict(lease_timeout_s=TIMEOUT, lease_tokens=lease_tokens, max_attempts=max_attempts)
        self.c, self.clock = type(self).fresh(self.opts)
        self.max_attempts = self.opts["max_attempts"]

    # -- helpers --

    def expect(self, gid, i):
        return expected(gid, i, self.groups[gid].sampling.max_new_tokens)

    def progress(self, h):
        gid, i, first = h.lease.group_id, h.lease.sample_index, h.position - len(h.buffer)
        _, logprobs = self.expect(gid, i)
        return Progress(list(h.buffer), logprobs[first:first + len(h.buffer)],
                        [h.lease.version_started] * len(h.buffer))

    def send(self, lease_id, fn, counter=None, keeps=True):
        """Runs a lease call for its worker: on success the tokens it carried were accepted; a
        stale lease is dropped by the worker (any other refusal fails the run)."""
        worker, h = self.held[lease_id]
        n = len(h.buffer)
        try:
            fn(worker, self.progress(h))
        except StaleLease:
            del self.held[lease_id]
            return False
        if counter:
            self.seen[counter] += 1
        if keeps:
            self.seen["tokens"] += n
            self.accepted[h.lease.group_id, h.lease.sample_index] += n
        h.sent, h.buffer = h.sent + n, []
        return True

    def leasable_keys(self, snapshot):
        """(-priority, seq, index) of every sample waiting that a lease could take now."""
        version, keys = snapshot["version"], []
        for g in snapshot["groups"]:
            spec = g["spec"]
            if g["state"] != "pending":
                continue
            if spec["max_policy_lag"] is not None and version - spec["min_version"] > spec["max_policy_lag"]:
                continue
            keys += [(-spec["priority"], g["seq"], i) for i, s in enumerate(g["samples"])
                     if s["finish_reason"] is None and not s["leased"]]
        return keys

    def pick(self, data):
        return data.draw(st.sampled_from(sorted(self.held)))

    # -- rules --

    @rule(n=st.integers(1, 3), priority=st.integers(0, 2), max_new=st.integers(1, 6),
          lag=st.sampled_from([None, None, 1]))
    def submit(self, n, priority, max_new, lag):
        gid = f"g{len(self.groups)}"
        spec = GroupSpec(gid, [1 + len(self.groups)], n, SamplingParams(max_new_tokens=max_new, stop_token=STOP),
                         priority=priority, max_policy_lag=lag, min_version=self.c.version())
        self.c.submit(spec)
        self.groups[gid] = spec
        self.accepted.update({(gid, i): 0 for i in range(n)})

    @rule(worker=st.sampled_from(WORKERS), capacity=st.integers(1, 3))
    def lease(self, worker, capacity):
        leases = self.c.lease(worker, capacity)
        after = self.c.snapshot()
        assert len(leases) <= capacity
        self.seen["leases"] += len(leases)
        seq = {g["spec"]["group_id"]: g["seq"] for g in after["groups"]}
        keys = [(-self.groups[l.group_id].priority, seq[l.group_id], l.sample_index) for l in leases]
        assert keys == sorted(keys)
        waiting = self.leasable_keys(after)
        if len(leases) < capacity:
            assert not waiting, (keys, waiting)
        elif waiting:
            assert max(keys) < min(waiting), (keys, waiting)
        for lease in leases:
            tokens, logprobs = self.expect(lease.group_id, lease.sample_index)
            n = self.accepted[lease.group_id, lease.sample_index]
            assert lease.prefix.tokens == tokens[:n] and lease.prefix.logprobs == logprobs[:n]
            assert n < len(tokens) and lease.token_budget >= 1 and 1 <= lease.attempt <= self.max_attempts
            assert lease.version_started == after["version"] and lease.lease_id not in self.held
            self.held[lease.lease_id] = (worker, Held(lease))

    @precondition(lambda self: self.held)
    @rule(data=st.data(), k=st.integers(1, 3), report=st.sampled_from([True, True, False]))
    def generate(self, data, k, report):
        lease_id = self.pick(data)
        _, h = self.held[lease_id]
        tokens, _ = self.expect(h.lease.group_id, h.lease.sample_index)
        # Never the last token (that one goes with complete) nor beyond the lease's budget.
        k = min(k, len(tokens) - 1 - h.position, h.lease.token_budget - h.sent - len(h.buffer))
        h.buffer += tokens[h.position:h.position + max(k, 0)]
        if report:
            self.send(lease_id, lambda w, p: self.c.report_partial(lease_id, w, p))

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def finish(self, data):
        """Generates to the end if the budget allows and completes; else hands the stretch back."""
        lease_id = self.pick(data)
        _, h = self.held[lease_id]
        tokens, _ = self.expect(h.lease.group_id, h.lease.sample_index)
        room = h.lease.token_budget - h.sent - len(h.buffer)
        h.buffer += tokens[h.position:h.position + room]
        if h.position == len(tokens):
            reason = "stop" if len(tokens) < h.lease.sampling.max_new_tokens else "length"
            self.send(lease_id, lambda w, p: self.c.complete(lease_id, w, p, reason), "completes")
        else:  # this stretch is done, the sample is not
            self.send(lease_id, lambda w, p: self.c.release(lease_id, w, ReleaseReason.draining, p), "drained")
        self.held.pop(lease_id, None)

    @precondition(lambda self: self.held)
    @rule(data=st.data(), reason=st.sampled_from([ReleaseReason.interrupted, ReleaseReason.error,
                                                   ReleaseReason.error, ReleaseReason.aborted]))
    def release(self, data, reason):
        lease_id = self.pick(data)
        counter = {"interrupted": "interrupted", "error": "errors", "aborted": "aborted_groups"}[reason.value]
        self.send(lease_id, lambda w, p: self.c.release(lease_id, w, reason, p), counter,
                  keeps=reason is not ReleaseReason.aborted)
        self.held.pop(lease_id, None)

    @rule(worker=st.sampled_from(WORKERS))
    def heartbeat(self, worker):
        mine = sorted(lid for lid, (w, _) in self.held.items() if w == worker)
        alive = self.c.heartbeat(worker, mine)
        assert set(alive) <= set(mine)
        for lease_id in set(mine) - set(alive):
            del self.held[lease_id]

    @rule(dt=st.sampled_from([1.0, 15.0, TIMEOUT + 1, TIMEOUT + 1]))
    def tick(self, dt):
        self.clock.advance(dt)

    @precondition(lambda self: self.held)
    @rule(worker=st.sampled_from(WORKERS))
    def kill(self, worker):
        """Gone without a word: its leases expire (once time passes)."""
        self.held = {lid: x for lid, x in self.held.items() if x[0] != worker}

    @precondition(lambda self: self.groups)
    @rule(data=st.data(), everything=st.sampled_from([False, False, False, True]))
    def abort(self, data, everything):
        if everything:
            pending = sum(self.c.group_state(g) is GroupState.pending for g in self.groups)
            assert self.c.abort(None) == pending
        else:
            gid = data.draw(st.sampled_from(sorted(self.groups)))
            pending = int(self.c.group_state(gid) is GroupState.pending)
            assert self.c.abort(gid) == pending
        self.seen["aborted_groups"] += pending

    @rule()
    def publish(self):
        self.c.set_version(self.c.version() + 1)

    @rule(max_groups=st.sampled_from([None, 1, 2]))
    def take(self, max_groups):
        self.take_all(max_groups)

    @rule(fresh=st.booleans())
    def snapshot_restore(self, fresh):
        state = self.c.snapshot()
        if fresh:  # another coordinator (a restarted process) continues from the snapshot
            self.c, _ = type(self).fresh(self.opts)
        self.c.restore(state)

    def take_all(self, max_groups=None):
        out = self.c.take_completed(max_groups)
        assert max_groups is None or len(out) <= max_groups
        seqs = []
        for g in out:
            gid = g.spec.group_id
            assert gid not in self.taken, f"{gid} handed out twice"
            assert g.spec == self.groups[gid]
            self.taken[gid] = g
            seqs.append(int(gid[1:]))
        assert seqs == sorted(seqs)  # oldest admission first

    def teardown(self):
        if self.c is None:
            return
        # Every worker dies; their leases expire; a drainer runs everything left to the end.
        self.held = {}
        self.clock.advance(TIMEOUT + 1)
        for _ in range(1000):
            leases = self.c.lease("drainer", 50)
            if not leases:
                break
            self.seen["leases"] += len(leases)
            for lease in leases:
                tokens, _ = self.expect(lease.group_id, lease.sample_index)
                assert lease.prefix.tokens == tokens[:self.accepted[lease.group_id, lease.sample_index]]
                h = Held(lease)
                self.held[lease.lease_id] = ("drainer", h)
                h.buffer = tokens[h.position:h.position + lease.token_budget]
                if h.position == len(tokens):
                    reason = "stop" if len(tokens) < lease.sampling.max_new_tokens else "length"
                    assert self.send(lease.lease_id, lambda w, p: self.c.complete(lease.lease_id, w, p, reason),
                                     "completes")
                else:
                    assert self.send(lease.lease_id, lambda w, p: self.c.release(
                        lease.lease_id, w, ReleaseReason.draining, p), "drained")
                del self.held[lease.lease_id]
        self.seen["aborted_groups"] += self.c.abort(None)  # what a policy lag holds back
        self.take_all()
        states = {gid: self.c.group_state(gid) for gid in self.groups}
        assert all(s is not GroupState.pending for s in states.values())
        complete = {gid for gid, s in states.items() if s is GroupState.complete}
        assert complete == set(self.taken)
        for gid, g in self.taken.items():
            assert [s.sample_index for s in g.samples] == list(range(self.groups[gid].num_samples))
            for s in g.samples:
                tokens, logprobs = self.expect(gid, s.sample_index)
                assert s.output.tokens == tokens and s.output.logprobs == logprobs
                assert s.output.versions == sorted(s.output.versions) and len(s.output.versions) == len(tokens)
                max_new = self.groups[gid].sampling.max_new_tokens
                assert s.finish_reason == ("stop" if len(tokens) < max_new else "length")
                assert 1 <= s.attempts <= self.max_attempts
        stats = self.c.stats()
        count = lambda state: sum(s is state for s in states.values())  # noqa: E731
        assert (stats["submitted"], stats["completed_groups"], stats["failed_groups"], stats["aborted_groups"]) == (
            len(self.groups), len(complete), count(GroupState.failed), self.seen["aborted_groups"])
        assert stats["aborted_groups"] == count(GroupState.aborted)
        assert (stats["leases_issued"], stats["tokens_reported"], stats["samples_completed"]) == (
            self.seen["leases"], self.seen["tokens"], self.seen["completes"])
        assert (stats["errors"], stats["interrupted"], stats["drained"]) == (
            self.seen["errors"], self.seen["interrupted"], self.seen["drained"])
        assert (stats["running"], stats["queued"]) == (0, 0)
        assert stats["failed_groups"] <= stats["expired"] + stats["errors"]  # each ran out of attempts
        assert self.c.take_completed() == []


def test_random_runs_keep_every_invariant(stores):
    if stores.kind == "service":
        # One server process, emptied for each run; its options are the defaults.
        shared = stores.make()
        empty = shared.snapshot()

        def fresh(options):
            options.update(lease_tokens=None, max_attempts=3)
            shared.restore(empty)
            return shared, stores.clock
    else:
        def fresh(options):
            return stores.make(**options), stores.clock

    class Machine(Protocol):
        pass

    Machine.fresh = staticmethod(fresh)
    run_state_machine_as_test(Machine, settings=settings(
        max_examples=EXAMPLES[stores.kind], stateful_step_count=50, deadline=None, derandomize=True,
        database=None, suppress_health_check=list(HealthCheck)))
