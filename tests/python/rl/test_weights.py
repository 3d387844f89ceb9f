"""Weight publication (proxyep.rl.weights, docs/RL.md section 5) end to end: a WeightPublisher
in this process (the trainer's rank 0) and rollout workers as separate processes, each with its
own EP layout and its own process group: worker A an EP-2 job under `proxyep launch -n 2`,
worker B an EP-1 process, later joiners C (EP-1) and others. The bytes go over the fabric's TCP
provider on loopback with the reorder shim (writes land and complete in any order).

Checked: every committed tensor is bit-exact against the publisher's (dense, and the rows of the
experts the rank owns, and only those: the bytes sent per rank are exactly its share); a chunk
corrupted in flight is caught by its checksum, never becomes visible, and the receiver is
poisoned and recovers to the last committed version; a malformed manifest is refused and
recovered from; a late joiner catches up at once; a wrong layout or tensor is refused with the
reason on both sides before any bytes move; stale/duplicate versions and bad state are refused
before anything changes; a receiver killed mid-transfer is dropped without holding up the others;
a publisher killed mid-transfer never leaves a torn version behind. Every case leaves the
publisher serving the others.

The manifest tests at the top need no fabric (planning, JSON, validation).
"""

import json
import os
import signal
import sys
import zlib

import pytest
import torch

# The publisher in this process uses the same fabric as the children: TCP on loopback with the
# reorder shim. Set before the native module reads its parameters.
os.environ.update(PROXYEP_FABRIC_PROVIDER="tcp", PROXYEP_FABRIC_REORDER="1", PROXYEP_FABRIC_DOMAIN="lo")

from proxyep.rl.weights import (Layout, WeightError, WeightManifest, WeightPublisher, landing_plan,  # noqa: E402
                                plan_manifest, schema_of, source_offsets)
from weights_helpers import (CHUNK_BYTES, CONFIG, HERE, Child, child_env, launcher, local_share,  # noqa: E402
                             nbytes, state_for)

WORKER = os.path.join(HERE, "weights_worker.py")
PUBLISHER = os.path.join(HERE, "weights_publisher_proc.py")
EP2 = Layout.contiguous(2, CONFIG.num_experts)
EP1 = Layout.contiguous(1, CONFIG.num_experts)


# ---- manifests (no fabric) -------------------------------------------------------------------

def _flat(dense, rows, specs):
    offsets, total = source_offsets(specs)
    flat = torch.zeros(total, dtype=torch.uint8)
    state = {**dense, **rows}
    for spec, off in zip(specs, offsets):
        flat[off:off + spec.nbytes] = state[spec.name].reshape(-1).view(torch.uint8)
    return flat


def _manifest(layout, version=3):
    dense, rows = state_for(version)
    specs = schema_of(dense, rows)
    flat = _flat(dense, rows, specs)
    return plan_manifest(version, specs, layout, 4096, memoryview(flat.numpy())), specs, flat, dense, rows


@pytest.mark.parametrize("layout", [EP2, EP1, Layout(2, 4, ((3, 0), (1, 2)))], ids=["ep2", "ep1", "scattered"])
def test_manifest_covers_each_rank_share_exactly(layout):
    """Each rank's chunks rebuild exactly its share (dense whole, its experts' rows in its order)
    from the source, with matching CRCs; no rank gets a byte of an expert it does not own."""
    m, specs, flat, dense, rows = _manifest(layout)
    back = WeightManifest.from_json(m.to_json())
    assert back.to_json() == m.to_json()
    src_offsets, _ = source_offsets(specs)
    for rank in range(layout.ep_size):
        offsets, landing_bytes = landing_plan(specs, layout, rank)
        back.check_for(rank, specs, layout, landing_bytes)
        landing = torch.zeros(landing_bytes, dtype=torch.uint8)
        for c in back.rank_chunks(rank):
            assert c.length <= 4096
            landing[c.dst:c.dst + c.length] = flat[c.src:c.src + c.length]
            assert zlib.crc32(flat[c.src:c.src + c.length].numpy().tobytes()) == c.crc
        share = local_share(dense, rows, layout, rank)
        for spec, off in zip(specs, offsets):
            want = share[spec.name]
            got = landing[off:off + want.numel() * want.element_size()].view(want.dtype).view(want.shape)
            assert torch.equal(got, want), (rank, spec.name)
            if spec.kind == "expert":  # the source rows read are exactly the owned experts'
                read = {(c.src - src_offsets[specs.index(spec)]) // spec.row_bytes
                        for c in back.chunks[specs.index(spec)][rank]}
                assert read <= set(layout.experts[rank])
        assert back.rank_bytes(rank) == nbytes(share)


def _mutated(m, fn):
    d = json.loads(m.to_json())
    fn(d)
    return json.dumps(d)


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.update(format="other/1"), "format"),
    (lambda d: d.pop("layout"), "missing fields"),
    (lambda d: d.update(version=-1), "version"),
    (lambda d: d.update(base=2), "delta"),
    (lambda d: d["tensors"][0].update(dtype="complex64"), "unsupported dtype"),
    (lambda d: d["tensors"][0]["chunks"][0].append([0, 0, 4]), "malformed chunks"),
    (lambda d: d["tensors"][0]["chunks"][0][0].__setitem__(2, 0), "chunk length"),
    (lambda d: d["tensors"][0]["chunks"].pop(), "chunks for 1 ranks"),
    (lambda d: d["layout"]["experts"].__setitem__(1, [1, 2]), r"no rank owns experts \[3\]"),
    (lambda d: d["layout"]["experts"].__setitem__(1, [3, 3]), "twice"),
    (lambda d: d["tensors"][0].update(chunks=[[[0, 0, 4, 2**40]], []]), "not a CRC-32"),
], ids=["format", "missing", "version", "delta", "dtype", "chunk-fields", "chunk-length", "ranks", "uncovered",
        "duplicate-expert", "crc"])
def test_malformed_manifest_refused(mutate, message):
    m = _manifest(EP2)[0]
    with pytest.raises(WeightError, match=message):
        WeightManifest.from_json(_mutated(m, mutate))
    with pytest.raises(WeightError, match="not valid JSON"):
        WeightManifest.from_json(m.to_json()[:-20])


def test_manifest_for_another_rank_or_layout_refused():
    m, specs, _, _, _ = _manifest(EP2)
    _, landing_bytes = landing_plan(specs, EP2, 0)
    with pytest.raises(WeightError, match="is not this worker's"):
        m.check_for(0, specs, Layout(2, 4, ((1, 0), (2, 3))), landing_bytes)
    with pytest.raises(WeightError, match="landing bytes"):
        m.check_for(0, specs, EP2, landing_bytes - 64)
    fewer = WeightManifest.from_json(_mutated(m, lambda d: d["tensors"].pop()))  # consistent, but not this model
    with pytest.raises(WeightError, match="not the ones this rank expects"):
        fewer.check_for(0, specs, EP2, landing_bytes)
    expert = next(i for i, s in enumerate(specs) if s.kind == "expert")

    def other_expert(d):  # rank 0's first chunk of an expert tensor reads expert 2's rows
        chunk = d["tensors"][expert]["chunks"][0][0]
        chunk[0] += 2 * specs[expert].row_bytes

    with pytest.raises(WeightError, match="not expert 0's"):
        WeightManifest.from_json(_mutated(m, other_expert)).check_for(0, specs, EP2, landing_bytes)

    def gap(d):  # a chunk missing: the tensor is not covered
        d["tensors"][0]["chunks"][0].pop(1)

    with pytest.raises(WeightError, match="landing offset"):
        WeightManifest.from_json(_mutated(m, gap)).check_for(0, specs, EP2, landing_bytes)


# ---- end to end ------------------------------------------------------------------------------

class Cluster:
    """The publisher here, worker A (EP-2, launched) and worker B (EP-1), plus joiners."""

    def __init__(self, out):
        self.out = out
        self.hooks = []  # fault hooks tests install: hook(event, **info) -> None or an action
        dense, rows = state_for(0)
        self.pub = WeightPublisher.for_state(dense, rows, chunk_bytes=CHUNK_BYTES, control_timeout_s=20.0,
                                             stage_timeout_s=30.0, fault_hook=self._hook)
        self.env = child_env(WEIGHTS_ADDRESS=f"{self.pub.address[0]}:{self.pub.address[1]}",
                             WEIGHTS_AUTHKEY=self.pub.authkey.hex(), OUT=out)
        self.workers = {}
        self.layouts = {}

    def _hook(self, event, **info):
        for hook in list(self.hooks):
            action = hook(event, **info)
            if action is not None:
                return action
        return None

    def start(self, worker_id, ep, *extra):
        argv = [sys.executable, WORKER, "--worker-id", worker_id, *extra]
        if ep > 1:
            argv = [launcher(), "launch", "-n", str(ep), "--timeout", "300", "--"] + argv
        child = Child(argv, self.env, f"worker {worker_id}")
        self.workers[worker_id] = child
        self.layouts[worker_id] = Layout.contiguous(ep, CONFIG.num_experts)
        return child

    def joined(self, worker_id):
        child = self.workers[worker_id]
        for rank in range(self.layouts[worker_id].ep_size):
            child.expect(lambda e, r=rank: e["event"] == "joined" and e["rank"] == r, what=f"rank {rank} joined")

    def next_version(self):
        return (self.pub.committed_version or 0) + 1

    def check_committed(self, worker_id, version):
        """Waits for every rank of the worker to report ``version`` and checks the saved model
        bit for bit against the publisher's state of that version; returns the events."""
        dense, rows = state_for(version)
        layout, events = self.layouts[worker_id], []
        for rank in range(layout.ep_size):
            event = self.workers[worker_id].expect(
                lambda e, r=rank: e["event"] == "committed" and e["rank"] == r and e["version"] == version,
                what=f"rank {rank} committing v{version}")
            saved = torch.load(event["path"], weights_only=True)
            want = local_share(dense, rows, layout, rank)
            assert set(saved) == set(want)
            for name, value in want.items():
                assert torch.equal(saved[name], value), f"{worker_id}/{rank} v{version}: {name} differs"
            events.append(event)
        return events

    def close(self):
        self.pub.close()
        for child in self.workers.values():
            try:
                child.wait(60)
            finally:
                child.kill()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(str(tmp_path_factory.mktemp("weights")))
    try:
        c.start("A", 2)
        c.start("B", 1)
        c.joined("A")
        c.joined("B")
        c.pub.wait_receivers(3, 60)
        yield c
    finally:
        c.close()


def _receivers(c):
    return sorted(f"{w}/{r}" for w, child in c.workers.items() if child.proc.poll() is None
                  for r in range(c.layouts[w].ep_size))


def test_each_rank_gets_bit_exact_dense_and_only_its_experts(cluster):
    c = cluster
    v = c.next_version()
    dense, rows = state_for(v)
    result = c.pub.publish(v, dense, rows)
    assert result.committed == ["A/0", "A/1", "B/0"] and not result.dropped and not result.recovered
    # Bytes on the wire per rank: exactly its share. An EP-2 rank gets the dense tensors and half
    # the expert rows, never the other half.
    for rank in range(2):
        assert result.bytes[f"A/{rank}"] == nbytes(local_share(dense, rows, EP2, rank))
    assert result.bytes["B/0"] == nbytes(local_share(dense, rows, EP1, 0))
    expert_bytes = nbytes(rows)
    assert result.bytes["B/0"] - result.bytes["A/0"] == expert_bytes // 2
    for worker in ("A", "B"):
        for event in c.check_committed(worker, v):
            assert event["stats"]["chunks_verified"] > 0
            assert event["reorder"]["reorder"] is not None  # the shim was underneath
            assert "tcp" in event["reorder"]["provider"]
    assert c.pub.receivers() == {"A/0": v, "A/1": v, "B/0": v}


def test_late_joiner_catches_up_at_once(cluster):
    c = cluster
    if c.pub.committed_version is None:
        c.pub.publish(1, *state_for(1))
    current = c.pub.committed_version
    c.start("C", 1)
    c.joined("C")
    c.check_committed("C", current)  # sent the last committed version on joining
    v = c.next_version()
    result = c.pub.publish(v, *state_for(v))
    assert "C/0" in result.committed and not result.dropped
    for worker in ("A", "B", "C"):
        c.check_committed(worker, v)


def _install(c, hook):
    c.hooks.append(hook)
    return hook


def test_corrupted_chunk_never_visible_receiver_poisoned_and_recovers(cluster):
    c = cluster
    v = c.next_version()
    hook = _install(c, lambda event, **i: "corrupt" if (event == "chunk" and i["session"] == "A/1" and
                                                       i["version"] == v and i["index"] == 2 and not i["recover"])
                    else None)
    try:
        result = c.pub.publish(v, *state_for(v))
    finally:
        c.hooks.remove(hook)
    assert "A/1" in result.recovered and "checksum mismatch" in result.recovered["A/1"]
    assert set(result.committed) >= {"A/0", "A/1", "B/0"} and not result.dropped
    events = c.check_committed("A", v)
    kinds = [(k, ver) for k, ver, _ in events[1]["events"]]
    assert ("stage_failed", v) in kinds and ("poisoned", v) in kinds
    assert events[1]["stats"]["poisoned"] >= 1
    assert not any(ver == v for _, ver, _ in events[0]["events"])  # rank 0 staged cleanly
    # Nothing but exact, committed versions was ever handed to A/1: every saved state matches.
    seen = [e["version"] for e in c.workers["A"].events if e["event"] == "committed" and e["rank"] == 1]
    assert seen == sorted(set(seen))
    for version in seen:
        saved = torch.load(os.path.join(c.out, f"A-r1-v{version}.pt"), weights_only=True)
        want = local_share(*state_for(version), EP2, 1)
        assert all(torch.equal(saved[n], want[n]) for n in want)
    c.check_committed("B", v)


@pytest.mark.parametrize("kind", ["truncated", "foreign-rows"])
def test_malformed_manifest_refused_by_receiver_then_recovered(cluster, kind):
    c = cluster
    v = c.next_version()

    def mangle(event, **i):
        if event != "manifest" or i["session"] != "B/0" or i["version"] != v or i["recover"]:
            return None
        if kind == "truncated":
            return i["manifest_json"][:-10]
        d = json.loads(i["manifest_json"])
        for t in d["tensors"]:
            if t["kind"] == "dense":
                t["chunks"][0][0][0] += 4  # reads the wrong source bytes
                return json.dumps(d)
        return None

    _install(c, mangle)
    try:
        result = c.pub.publish(v, *state_for(v))
    finally:
        c.hooks.remove(mangle)
    reason = result.recovered.get("B/0", "")
    assert "refused the manifest" in reason
    assert ("not valid JSON" if kind == "truncated" else "reads source offset") in reason
    events = c.check_committed("B", v)
    assert ("refused", v) in [(k, ver) for k, ver, _ in events[0]["events"]]
    c.check_committed("A", v)


def test_stale_duplicate_and_bad_state_refused_publisher_keeps_serving(cluster):
    c = cluster
    if c.pub.committed_version is None:
        c.pub.publish(1, *state_for(1))
    current = c.pub.committed_version
    dense, rows = state_for(current + 1)
    for version in (current, current - 1):
        with pytest.raises(WeightError, match="not above the last committed"):
            c.pub.publish(version, dense, rows)
    name = next(iter(dense))
    bad = [({k: v for k, v in dense.items() if k != name}, rows, "missing"),
           ({**dense, name: dense[name][:-1]}, rows, "schema says"),
           ({**dense, name: dense[name].double()}, rows, "float64"),
           ({**dense, "extra": dense[name]}, rows, "unknown"),
           (dense, {k: v.tolist() for k, v in rows.items()}, "not a tensor")]
    for d, r, message in bad:
        with pytest.raises(WeightError, match=message):
            c.pub.publish(current + 1, d, r)
    assert c.pub.committed_version == current
    result = c.pub.publish(current + 1, dense, rows)
    assert set(result.committed) >= {"A/0", "A/1", "B/0"} and not result.dropped
    c.check_committed("A", current + 1)
    c.check_committed("B", current + 1)


@pytest.mark.parametrize("wrong, message", [("experts", "experts"), ("shape", "under its layout")])
def test_wrong_layout_refused_on_both_sides(cluster, wrong, message):
    c = cluster
    before = len(c.pub.refusals)
    child = Child([sys.executable, WORKER, "--worker-id", f"bad-{wrong}", "--wrong", wrong], c.env,
                  f"worker bad-{wrong}")
    try:
        event = child.expect(lambda e: e["event"] in ("refused", "joined"), what="the join's outcome")
        assert event["event"] == "refused"
        assert "refused" in event["error"] and message in event["error"]
        assert child.wait(60) == 3
    finally:
        child.kill()
    assert len(c.pub.refusals) == before + 1 and message in c.pub.refusals[-1]
    assert f"bad-{wrong}/0" not in c.pub.receivers()
    v = c.next_version()
    result = c.pub.publish(v, *state_for(v))
    assert set(result.committed) >= {"A/0", "A/1", "B/0"} and not result.dropped
    c.check_committed("B", v)


def test_receiver_killed_mid_transfer_is_dropped_others_commit(cluster):
    c = cluster
    victim = c.start("D", 1)
    c.joined("D")
    c.pub.wait_receivers(len(_receivers(c)), 60)
    v = c.next_version()

    def kill(event, **i):
        if event == "chunk" and i["session"] == "D/0" and i["version"] == v and i["index"] == 1:
            os.kill(victim.proc.pid, signal.SIGKILL)
        return None

    _install(c, kill)
    try:
        result = c.pub.publish(v, *state_for(v))
    finally:
        c.hooks.remove(kill)
    assert "D/0" in result.dropped and "D/0" not in result.committed
    assert set(result.committed) >= {"A/0", "A/1", "B/0"}
    assert "D/0" not in c.pub.receivers()
    victim.wait(30)
    c.check_committed("A", v)
    c.check_committed("B", v)
    v += 1
    result = c.pub.publish(v, *state_for(v))  # the others are served as before
    assert set(result.committed) >= {"A/0", "A/1", "B/0"} and not result.dropped


def test_receiver_that_gives_up_mid_transfer_absorbs_late_writes_and_recovers(cluster):
    """A transfer stalls (the publisher stops writing half way) until the receiver's stage
    deadline passes: it votes stage_failed, is poisoned, and the resend must cope with the first
    transfer's remaining writes landing late (tagged stale, waited for, then the chunks verified
    after them): the worker ends with the version bit-exact."""
    c = cluster
    c.start("F", 1, "--stage-timeout", "3")
    c.joined("F")
    c.pub.wait_receivers(len(_receivers(c)), 60)
    v = c.next_version()

    def stall(event, **i):
        if event == "chunk" and i["session"] == "F/0" and i["version"] == v and i["index"] == 3 and not i["recover"]:
            # Event-based: hold the writes until F's stage_failed vote is waiting on its control
            # connection (white box: the session's connection), then let the rest go out late.
            assert c.pub._sessions["F/0"].conn.poll(60), "F never gave up"
        return None

    _install(c, stall)
    try:
        result = c.pub.publish(v, *state_for(v))
    finally:
        c.hooks.remove(stall)
    assert "F/0" in result.recovered and "chunks arrived within 3" in result.recovered["F/0"]
    assert {"A/0", "A/1", "B/0", "F/0"} <= set(result.committed) and not result.dropped
    event = c.check_committed("F", v)[0]
    assert event["stats"]["stale_writes"] > 0 and event["stats"]["poisoned"] == 1
    c.check_committed("A", v)


def test_receiver_that_cannot_recover_is_dropped_keeping_last_committed(cluster):
    """B's chunks are corrupted on every attempt: poisoned, the resend fails too, B is dropped;
    its worker never sees the torn version and keeps the last one committed."""
    c = cluster
    v = c.next_version()
    before = c.pub.committed_version
    _install(c, lambda event, **i: "corrupt" if event == "chunk" and i["session"] == "B/0" else None)
    result = c.pub.publish(v, *state_for(v))
    assert "B/0" in result.dropped and "recovery failed" in result.dropped["B/0"]
    assert {"A/0", "A/1"} <= set(result.committed)
    error = c.workers["B"].expect(lambda e: e["event"] == "error", what="B's error")
    assert "dropped" in error["error"] and error["latest"] == before
    assert c.workers["B"].wait(60) == 4
    assert not os.path.exists(os.path.join(c.out, f"B-r0-v{v}.pt"))
    c.check_committed("A", v)


@pytest.mark.parametrize("die_at", [5, "commit"], ids=["mid-transfer", "before-commit"])
def test_publisher_killed_leaves_no_torn_or_uncommitted_version(tmp_path, die_at):
    """The trainer dies while writing v2 (a torn transfer), or after the worker staged and
    verified all of v2 but before the commit: either way the worker keeps v1 (bit-exact), never
    hands out v2, and its wait for v2 fails naming the publisher instead of hanging."""
    pub = Child([sys.executable, PUBLISHER], child_env(), "publisher", stdin=True)
    worker = None
    try:
        address = pub.expect(lambda e: e["event"] == "address", what="the address")
        env = child_env(WEIGHTS_ADDRESS=address["address"], WEIGHTS_AUTHKEY=address["authkey"], OUT=str(tmp_path))
        worker = Child([sys.executable, WORKER, "--worker-id", "E", "--until", "2", "--timeout", "60"], env,
                       "worker E")
        worker.expect(lambda e: e["event"] == "joined", what="the join")
        pub.send({"wait_receivers": 1})
        pub.expect(lambda e: e["event"] == "receivers")
        pub.send({"publish": 1})
        assert pub.expect(lambda e: e["event"] == "published")["committed"] == ["E/0"]
        event = worker.expect(lambda e: e["event"] == "committed" and e["version"] == 1)
        pub.send({"publish": 2, "die_at": die_at})
        assert pub.wait(60) == -signal.SIGKILL
        error = worker.expect(lambda e: e["event"] == "error", what="the worker's error")
        assert "v2 not committed" in error["error"] and "publisher" in error["error"]
        assert error["latest"] == 1
        if die_at == "commit":  # v2 was staged and verified here: only the commit was missing
            assert error["stats"]["transfers"] == 2
            assert error["stats"]["chunks_verified"] == 2 * event["stats"]["chunks_verified"]
        assert worker.wait(60) == 4
        assert sorted(os.listdir(tmp_path)) == ["E-r0-v1.pt"]
        saved = torch.load(event["path"], weights_only=True)
        want = local_share(*state_for(1), EP1, 0)
        assert all(torch.equal(saved[n], want[n]) for n in want)
    finally:
        pub.kill()
        if worker is not None:
            worker.kill()
