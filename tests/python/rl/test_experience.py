"""proxyep.rl.train.experience: admission control (fixed numbers, and the staleness bound as a
property over random interleavings of submission, rollout completion, failure, training and weight
publication), pop order, max-age eviction, the DAPO filter, deadlines, threads, refused input
and snapshot/restore. Single process; no timing assertions (deadlines are generous and only
bound a failure)."""

import copy
import json
import math
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxyep.rl.coordinator.protocol import CompletedGroup, GroupSpec, Progress, RLError, Sample
from proxyep.rl.train.experience import AdmissionRefused, BatchTimeout, ExperienceBuffer, ScoredGroup

PROMPT = [5, 6, 7]


def spec(gid, n=2):
    return GroupSpec(gid, list(PROMPT), n)


def scored(gid, n=2, versions=None, rewards=None, tokens=3, source="rule:add"):
    """A scored group: sample i has ``tokens`` tokens all at versions[i] (default 0) and reward
    i (all different, so the DAPO filter keeps it) unless ``rewards`` is given."""
    versions = versions if versions is not None else [0] * n
    samples = []
    for i in range(n):
        v = versions[i] if isinstance(versions[i], list) else [versions[i]] * tokens
        out = Progress(tokens=[10 + j for j in range(len(v))], logprobs=[-0.5] * len(v), versions=list(v))
        samples.append(Sample(gid, i, list(PROMPT), out, "length", 1))
    return ScoredGroup(CompletedGroup(spec(gid, n), samples, 0.0),
                       list(rewards) if rewards is not None else [float(i) for i in range(n)], source)


def state(buf):
    """The buffer's observable state, less the time spent waiting in pop_batch."""
    snap = buf.snapshot()
    snap.pop("trainer_wait_s")
    return snap


# -- admission control --------------------------------------------------------------------------

def test_admission_formula_on_fixed_numbers():
    buf = ExperienceBuffer(batch_groups=4, staleness=1, max_in_flight=6)
    # min(6 - running, (1 + v + 1) * 4 - (accepted + running)), never negative
    assert buf.allowed(0, 0) == 6
    assert buf.allowed(0, 3) == 3
    assert buf.allowed(0, 6) == 0
    assert buf.allowed(0, 9) == 0  # over the cap: 0, not negative
    assert buf.allowed(1, 0) == 6
    for i in range(5):
        assert buf.put(scored(f"g{i}"))
    assert buf.allowed(0, 0) == 3  # 8 - 5 accepted
    assert buf.allowed(0, 2) == 1  # 8 - (5 + 2)
    assert buf.allowed(1, 2) == 4  # min(6 - 2, 12 - 7)
    buf.pop_batch(4, 0, version=1)  # consumed groups stay counted as accepted
    assert buf.allowed(1, 0) == 6 and buf.allowed(1, 5) == 1 and buf.allowed(0, 0) == 3
    assert not buf.put(scored("same", rewards=[1.0, 1.0]))  # filtered: not accepted
    assert buf.allowed(0, 0) == 3
    assert buf.metrics()["accepted"] == 5


def test_synchronous_mode_admits_one_batch_per_version():
    """eta = 0: exactly B groups per version, submitted() refusing the next with the state unchanged."""
    buf = ExperienceBuffer(batch_groups=2, staleness=0, max_in_flight=8)
    buf.submitted(spec("a"))
    buf.submitted(spec("b"))
    assert buf.allowed(0) == 0  # running defaults to the registered groups in flight
    before = state(buf)
    with pytest.raises(AdmissionRefused, match="allows no more groups at version 0"):
        buf.submitted(spec("c"))
    assert state(buf) == before
    buf.put(scored("b"))
    buf.put(scored("a"))
    assert [g.group_id for g in buf.pop_batch(2, 0, version=0)] == ["a", "b"]
    assert buf.allowed(0) == 0
    buf.set_version(1)
    assert buf.allowed(1) == 2
    buf.submitted(spec("c"))  # now allowed


class Driver:
    """A driver that follows admission control, against random schedules: ``published`` is the
    rollout side's policy version (the one new rollouts start with), ``trainer`` the trainer's
    (steps done). Rollouts finish in any order with token versions anywhere between their
    submission's published version and the current one."""

    def __init__(self, buf, data, group_size):
        self.buf, self.data, self.group_size = buf, data, group_size
        self.published = self.trainer = 0
        self.running = {}  # gid -> version submitted at
        self.next_id = 0
        self.lags = []
        self.submitted = 0

    def submit(self, want):
        n = min(want, self.buf.allowed(self.published))
        for _ in range(n):
            gid = f"g{self.next_id:04d}"
            self.next_id += 1
            self.buf.submitted(spec(gid, self.group_size), version=self.published)
            self.running[gid] = self.published
            self.submitted += 1

    def complete(self, index):
        gid = sorted(self.running)[index % len(self.running)]
        start = self.running.pop(gid)
        versions = []
        for _ in range(self.group_size):
            first = self.data.draw(st.integers(start, self.published))
            last = self.data.draw(st.integers(first, self.published))
            versions.append([first, last])
        rewards = self.data.draw(st.lists(st.sampled_from([0.0, 1.0]), min_size=self.group_size,
                                          max_size=self.group_size))
        self.buf.put(scored(gid, self.group_size, versions=versions, rewards=rewards))

    def fail(self, index):
        gid = sorted(self.running)[index % len(self.running)]
        del self.running[gid]
        self.buf.failed(gid)

    def train(self):
        try:
            batch = self.buf.pop_batch(self.buf.batch_groups, 0, version=self.trainer)
        except BatchTimeout:
            # Never stuck: something is in flight, or the driver may submit more.
            assert self.running or self.buf.allowed(self.trainer) > 0
            return False
        for g in batch:
            self.lags.append(self.trainer - g.oldest_version)
        self.trainer += 1  # one optimiser step per batch: the version counts steps
        self.buf.set_version(self.trainer)
        return True

    def publish(self):
        self.published = self.data.draw(st.integers(self.published, self.trainer))


def run_schedule(buf, data, group_size, eta):
    driver = Driver(buf, data, group_size)
    for _ in range(data.draw(st.integers(10, 60), label="actions")):
        action = data.draw(st.sampled_from(["submit", "complete", "complete", "fail", "train", "publish"]))
        if action == "submit":
            driver.submit(data.draw(st.integers(1, 4)))
        elif action == "complete" and driver.running:
            driver.complete(data.draw(st.integers(0, 100)))
        elif action == "fail" and driver.running:
            driver.fail(data.draw(st.integers(0, 100)))
        elif action == "train":
            driver.train()
        elif action == "publish":
            driver.publish()
    # Drain: finish everything in flight and train while batches can be formed.
    for _ in range(30):
        while driver.running:
            driver.complete(0)
        if not driver.train():
            driver.published = driver.trainer
            driver.submit(buf.batch_groups)
    while driver.running:
        driver.complete(0)
    m = buf.metrics()
    assert all(lag <= eta for lag in driver.lags), f"consumed a group {max(driver.lags)} versions old (eta={eta})"
    assert m["staleness"] == {lag: driver.lags.count(lag) for lag in set(driver.lags)}
    # Nothing lost: every submitted group is consumed, ready, filtered, evicted or failed.
    assert driver.submitted == m["consumed"] + m["depth"] + m["filtered"] + m["evicted"] + m["failed"]
    assert m["pending"] == 0
    return driver


HYPOTHESIS = settings(max_examples=300, deadline=None, derandomize=True, database=None,
                      suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@HYPOTHESIS
@given(data=st.data(), batch=st.integers(1, 3), eta=st.integers(0, 2), max_in_flight=st.integers(1, 8),
       group_size=st.integers(1, 3))
def test_wait_policy_never_consumes_beyond_the_staleness_bound(data, batch, eta, max_in_flight, group_size):
    """Admission control alone (no eviction) bounds every consumed group's oldest token to eta
    versions behind the trainer, whatever order rollouts finish in."""
    buf = ExperienceBuffer(batch, eta, max_in_flight)
    driver = run_schedule(buf, data, group_size, eta)
    assert buf.metrics()["evicted"] == 0 and driver.trainer == buf.metrics()["consumed"] // batch


@HYPOTHESIS
@given(data=st.data(), batch=st.integers(1, 3), eta=st.integers(0, 2), max_in_flight=st.integers(1, 8),
       group_size=st.integers(1, 3))
def test_drop_policy_never_consumes_beyond_max_age(data, batch, eta, max_in_flight, group_size):
    """Serving the oldest ready groups: over-age ones are evicted (and refilled), never consumed."""
    buf = ExperienceBuffer(batch, eta, max_in_flight, max_age_versions=eta)
    run_schedule(buf, data, group_size, eta)
    reasons = {reason for _, reason in buf.take_refills()}
    assert reasons <= {"filtered", "evicted", "failed"}


# -- serving ------------------------------------------------------------------------------------

def test_pop_returns_oldest_admission_first_and_the_wait_policy_holds_for_older_groups():
    buf = ExperienceBuffer(batch_groups=2, staleness=4, max_in_flight=8)
    for gid in ("a", "b", "c"):
        buf.submitted(spec(gid))
    buf.put(scored("c"))
    buf.put(scored("b"))
    with pytest.raises(BatchTimeout) as info:
        buf.pop_batch(2, 0, version=0)
    assert info.value.waiting_for == "a" and info.value.ready == 2 and "waits for the older group a" in str(info.value)
    buf.put(scored("a"))
    assert [g.group_id for g in buf.pop_batch(2, 0, version=0)] == ["a", "b"]
    buf.put(scored("d"))  # never registered: admitted when put, after c
    assert [g.group_id for g in buf.pop_batch(2, 0, version=0)] == ["c", "d"]


def test_failed_and_aborted_groups_stop_holding_the_batch():
    buf = ExperienceBuffer(batch_groups=1, staleness=4, max_in_flight=8)
    for gid in ("a", "b", "c"):
        buf.submitted(spec(gid))
    buf.put(scored("c"))
    buf.failed("a")
    with pytest.raises(BatchTimeout, match="older group b"):
        buf.pop_batch(1, 0, version=0)
    buf.aborted("b")
    assert [g.group_id for g in buf.pop_batch(1, 0, version=0)] == ["c"]
    assert buf.take_refills() == [("a", "failed")]  # aborted surplus is not refilled
    assert buf.failed_ids == ["a"]
    with pytest.raises(RLError, match="already put or settled"):
        buf.failed("c")


def test_drop_policy_serves_ready_groups_and_evicts_over_age_ones():
    buf = ExperienceBuffer(batch_groups=2, staleness=1, max_in_flight=8, max_age_versions=1)
    for gid in ("old", "slow", "new1", "new2"):
        buf.submitted(spec(gid))
    buf.put(scored("old", versions=[0, 0]))
    buf.set_version(2)
    buf.put(scored("new1", versions=[1, 2]))  # oldest token at version 1: lag 1 at version 2
    buf.put(scored("new2", versions=[2, 2]))
    allowed_before = buf.allowed(2, 0)
    batch = buf.pop_batch(2, 0, version=2)  # "slow" is still in flight: not waited for
    assert [g.group_id for g in batch] == ["new1", "new2"]
    m = buf.metrics()
    assert m["evicted"] == 1 and buf.evicted == ["old"] and m["consumed"] == 2 and m["depth"] == 0
    assert m["staleness"] == {0: 1, 1: 1}
    assert buf.take_refills() == [("old", "evicted")]
    assert buf.allowed(2, 0) == allowed_before + 1  # "old" left accepted, the 2 consumed stay
    with pytest.raises(RLError, match="duplicate"):
        buf.put(scored("old", versions=[2, 2]))  # an evicted id is settled for good


def test_dapo_filter_drops_groups_without_signal():
    buf = ExperienceBuffer(batch_groups=1, staleness=0, max_in_flight=4)
    buf.submitted(spec("flat"))
    assert buf.put(scored("flat", rewards=[1.0, 1.0])) is False
    assert buf.put(scored("single", n=1, rewards=[1.0]))  # one sample: its advantage is its reward
    m = buf.metrics()
    assert m["filtered"] == 1 and m["depth"] == 1 and m["pending"] == 0 and buf.filtered == ["flat"]
    assert buf.take_refills() == [("flat", "filtered")] and buf.take_refills() == []
    assert [g.group_id for g in buf.pop_batch(1, 0, version=0)] == ["single"]
    unfiltered = ExperienceBuffer(batch_groups=1, staleness=0, max_in_flight=4, dapo_filter=False)
    assert unfiltered.put(scored("flat", rewards=[1.0, 1.0]))


def test_timeout_names_how_many_were_ready_and_changes_nothing():
    buf = ExperienceBuffer(batch_groups=3, staleness=2, max_in_flight=8, max_age_versions=2)
    buf.put(scored("a"))
    before = state(buf)
    with pytest.raises(BatchTimeout, match="1 of 3 groups ready after 0.2 s") as info:
        buf.pop_batch(3, 0.2, version=0)
    assert info.value.ready == 1 and info.value.needed == 3
    assert state(buf) == before
    assert buf.metrics()["trainer_wait_s"] > 0


def test_a_waiting_pop_is_woken_by_puts_from_other_threads():
    buf = ExperienceBuffer(batch_groups=2, staleness=2, max_in_flight=8)
    result = {}

    def trainer():
        try:
            result["batch"] = [g.group_id for g in buf.pop_batch(2, 60, version=0)]
        except Exception as e:  # reported below, never swallowed
            result["error"] = e

    thread = threading.Thread(target=trainer)
    thread.start()
    buf.put(scored("x"))
    buf.put(scored("y"))
    thread.join(90)
    assert not thread.is_alive() and "error" not in result
    assert result["batch"] == ["x", "y"]


def test_concurrent_producers_and_a_consumer_lose_nothing_and_keep_admission_order():
    groups, batch = 100, 5
    buf = ExperienceBuffer(batch_groups=batch, staleness=groups // batch, max_in_flight=groups)
    ids = [f"g{i:03d}" for i in range(groups)]
    for gid in ids:
        buf.submitted(spec(gid))
    errors, consumed = [], []

    def producer(mine):
        try:
            for gid in mine:
                buf.put(scored(gid))
        except Exception as e:
            errors.append(e)

    def consumer():
        try:
            version = 0
            while len(consumed) < groups:
                consumed.extend(g.group_id for g in buf.pop_batch(batch, 60, version=version))
                version += 1
        except Exception as e:
            errors.append(e)

    # Each producer puts its share in reverse, so completions arrive out of admission order.
    threads = [threading.Thread(target=producer, args=(ids[k::4][::-1],)) for k in range(4)]
    threads.append(threading.Thread(target=consumer))
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads) and errors == []
    assert consumed == ids  # every group exactly once, in admission order
    m = buf.metrics()
    assert m["consumed"] == groups and m["depth"] == 0 and m["pending"] == 0


# -- refused input ------------------------------------------------------------------------------

def _bad(make):
    g = scored("bad")
    make(g)
    return g


BAD_GROUPS = {
    "sample count": lambda g: g.group.samples.pop(),
    "logprob count": lambda g: g.group.samples[0].output.logprobs.pop(),
    "version count": lambda g: g.group.samples[1].output.versions.append(0),
    "decreasing versions": lambda g: g.group.samples[0].output.versions.__setitem__(slice(None), [1, 0, 0]),
    "non-finite reward": lambda g: g.rewards.__setitem__(0, math.nan),
    "infinite reward": lambda g: g.rewards.__setitem__(1, math.inf),
    "reward count": lambda g: g.rewards.append(2.0),
    "no reward source": lambda g: setattr(g, "reward_source", ""),
    "mask length": lambda g: g.loss_masks[0].pop(),
    "mask on the prompt": lambda g: g.loss_masks[1].__setitem__(0, 1),
    "sample order": lambda g: g.group.samples.reverse(),
    "other prompt": lambda g: setattr(g.group.samples[0], "prompt", [1]),
    "non-finite logprob": lambda g: g.group.samples[0].output.logprobs.__setitem__(0, math.inf),
}


@pytest.mark.parametrize("what", sorted(BAD_GROUPS))
def test_malformed_groups_are_refused_with_the_state_unchanged(what):
    buf = ExperienceBuffer(batch_groups=2, staleness=1, max_in_flight=4)
    buf.submitted(spec("bad"))
    buf.put(scored("fine"))
    before = state(buf)
    with pytest.raises(RLError, match="group bad"):
        buf.put(_bad(BAD_GROUPS[what]))
    assert state(buf) == before
    assert buf.put(scored("bad"))  # the buffer stays usable, and the id was not burnt


def test_future_versions_and_duplicates_are_refused_with_the_state_unchanged():
    buf = ExperienceBuffer(batch_groups=1, staleness=1, max_in_flight=4)
    buf.set_version(1)
    buf.put(scored("a", versions=[1, 1]))
    before = state(buf)
    with pytest.raises(RLError, match="future version"):
        buf.put(scored("b", versions=[1, 2]))
    with pytest.raises(RLError, match="duplicate"):
        buf.put(scored("a"))
    with pytest.raises(RLError, match="duplicate"):
        buf.submitted(spec("a"))
    with pytest.raises(RLError, match="behind the buffer's 1"):
        buf.pop_batch(1, 0, version=0)
    with pytest.raises(RLError, match="behind the buffer's 1"):
        buf.set_version(0)
    with pytest.raises(RLError, match="batch_groups"):
        buf.pop_batch(0, 0, version=1)
    with pytest.raises(RLError, match="timeout_s"):
        buf.pop_batch(1, math.inf, version=1)
    with pytest.raises(RLError, match="not in"):
        buf.submitted(spec("c"), version=2)
    assert state(buf) == before
    buf.pop_batch(1, 0, version=1)
    with pytest.raises(RLError, match="duplicate"):
        buf.put(scored("a"))  # consumed ids stay settled


@pytest.mark.parametrize("kwargs", [dict(batch_groups=0), dict(staleness=-1), dict(max_in_flight=0),
                                    dict(max_age_versions=-1), dict(batch_groups=1.5)])
def test_bad_configuration_is_refused(kwargs):
    args = dict(batch_groups=2, staleness=1, max_in_flight=4)
    args.update(kwargs)
    with pytest.raises(RLError, match=next(iter(kwargs))):
        ExperienceBuffer(**args)


# -- persistence --------------------------------------------------------------------------------

def test_scored_group_round_trips_with_its_loss_masks():
    g = scored("r", versions=[[0, 1], [1, 1, 2]], rewards=[0.5, -1.0])
    g.group.samples[0].output.routed_experts = [[[0, 1]], [[2, 3]]]
    assert g.loss_masks == [[0, 0, 0, 1, 1], [0, 0, 0, 1, 1, 1]]
    back = ScoredGroup.from_dict(json.loads(json.dumps(g.to_dict())))
    assert back == g and back.oldest_version == 0 and back.reward_source == "rule:add"


def busy_buffer():
    """Two consumed (a, b), one ready (c, oldest token at 0), one filtered (d), one in flight (e,
    submitted at version 0), at version 1."""
    buf = ExperienceBuffer(batch_groups=2, staleness=1, max_in_flight=8, max_age_versions=1)
    for gid in ("a", "b", "c", "e"):
        buf.submitted(spec(gid))
    buf.put(scored("a"))
    buf.put(scored("b"))
    buf.pop_batch(2, 0, version=0)
    buf.set_version(1)
    buf.submitted(spec("d"))
    buf.put(scored("c", versions=[0, 1]))
    buf.put(scored("d", rewards=[3.0, 3.0]))  # filtered
    return buf


def test_snapshot_restore_round_trip_then_identical_behaviour():
    original = busy_buffer()
    snap = json.loads(json.dumps(original.snapshot()))
    copy_ = ExperienceBuffer(batch_groups=2, staleness=1, max_in_flight=8, max_age_versions=1)
    assert copy_.restore(snap) == ["e"]
    assert state(copy_) == state(original)
    assert copy_.pending_spec("e") == spec("e")
    for buf in (original, copy_):
        buf.put(scored("e", versions=[1, 1]))
        assert [g.group_id for g in buf.pop_batch(2, 0, version=1)] == ["c", "e"]
        with pytest.raises(RLError, match="duplicate"):
            buf.put(scored("a"))  # the consumed watermark survived
    assert state(copy_) == state(original)


def test_restore_drops_past_targets_and_over_age_entries():
    snap = busy_buffer().snapshot()
    buf = ExperienceBuffer(batch_groups=2, staleness=1, max_in_flight=8, max_age_versions=1)
    assert buf.restore(copy.deepcopy(snap), version=2) == []  # e was submitted at 0: target passed
    m = buf.metrics()
    assert m["depth"] == 0 and m["evicted"] == 1 and m["past_target"] == 1 and m["version"] == 2
    assert buf.take_refills() == [("d", "filtered"), ("c", "evicted"), ("e", "past_target")]
    assert buf.allowed(2, 0) == min(8, (1 + 2 + 1) * 2 - 2)  # only the consumed two still count


def test_malformed_snapshots_are_refused_with_the_state_unchanged():
    buf = busy_buffer()
    before = state(buf)
    good = buf.snapshot()
    broken = [dict(good, format=99), {k: v for k, v in good.items() if k != "ready"},
              dict(good, ready=[{"seq": 0}]), dict(good, settled=["a", "c"]), "nope"]
    for bad in broken:
        with pytest.raises(RLError, match="ExperienceBuffer.restore"):
            buf.restore(bad)
        assert state(buf) == before
    with pytest.raises(RLError, match="behind the snapshot"):
        buf.restore(good, version=0)
    assert state(buf) == before
