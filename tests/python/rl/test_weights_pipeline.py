"""The pipelined weight publication (proxyep.rl.weights: packing.py's SourcePacker, the seal):
the publisher packs a version into its source on a thread of its own and checksums each chunk
as soon as it is packed; each receiver's transfer posts a chunk's write as soon as its checksum
exists and, after the last write, sends one seal carrying every chunk's CRC-32; the receiver
checksums each chunk as it lands and compares with the seal before it votes.

Checked here: the packer's bytes and CRCs against a straightforward pack + zlib.crc32, chunks
handed out in order while later tensors are still being packed, a packing error surfacing to the
senders and to publish() with nothing committed; a seal with a wrong CRC or the wrong number of
CRCs is refused (the receiver is poisoned and recovers, or is dropped when it keeps happening,
its worker keeping the last committed version); a seal that arrives before the last chunk has
landed is accepted, a seal of another version or a commit instead of the seal is refused, and a
seal that never comes ends the receiver's wait at its deadline.

The packer tests need no fabric; the others run a publisher here (no fault hook by default: the
batched, pipelined write path), an EP-1 worker as a separate process and EP-1 subscribers in this
process (their service threads), TCP on loopback with the reorder shim. Seals are tampered with in this process by wrapping ``wire.send`` (the publisher's
control channel), so the library needs no hook for them.
"""

import os
import re
import sys
import threading
import time
import zlib

import pytest
import torch

# The publisher in this process uses the same fabric as the children (set before the native
# module reads its parameters).
os.environ.update(PROXYEP_FABRIC_PROVIDER="tcp", PROXYEP_FABRIC_REORDER="1", PROXYEP_FABRIC_DOMAIN="lo")

from proxyep.rl.weights import (Layout, WeightError, WeightManifest, WeightPublisher,  # noqa: E402
                                WeightSubscriber, expected_tensors, schema_of, source_offsets, wire)
from proxyep.rl.weights.manifest import plan_ranges  # noqa: E402
from proxyep.rl.weights.packing import SourcePacker  # noqa: E402
from weights_helpers import CHUNK_BYTES, CONFIG, HERE, Child, child_env, local_share, state_for  # noqa: E402

WORKER = os.path.join(HERE, "weights_worker.py")
EP1 = Layout.contiguous(1, CONFIG.num_experts)
EP2 = Layout.contiguous(2, CONFIG.num_experts)
WAIT_S = 30.0  # every wait of these tests ends by then (they take a second or a few)


# ---- SourcePacker (no fabric) ----------------------------------------------------------------

def _model(version):
    """(specs, tensors in schema order, the straightforward flat source) of ``version``."""
    dense, rows = state_for(version)
    specs = schema_of(dense, rows)
    state = {**dense, **rows}
    tensors = [state[s.name].contiguous() for s in specs]
    offsets, total = source_offsets(specs)
    flat = torch.zeros(total, dtype=torch.uint8)
    for t, off in zip(tensors, offsets):
        flat[off:off + t.numel() * t.element_size()] = t.reshape(-1).view(torch.uint8)
    return specs, tensors, flat


def _ranges(specs, layouts, chunk_bytes):
    """{(src, length)} of every chunk some rank of ``layouts`` needs (what publish() packs for)."""
    return {(src, n) for layout in layouts for per_rank in plan_ranges(specs, layout, chunk_bytes)
            for chunks in per_rank for src, _, n in chunks}


def _crc(flat, src, n):
    return zlib.crc32(flat[src:src + n].numpy().tobytes())


def _run(packer):
    t = threading.Thread(target=packer.run, name="test-pack", daemon=True)
    t.start()
    return t


@pytest.mark.parametrize("piece", [1000, 4096, 1 << 20], ids=["piece<chunk", "piece=chunk", "whole-tensors"])
def test_source_packer_matches_straightforward_pack_and_crc(piece):
    """Packed bytes and every chunk's CRC-32 equal a plain copy + zlib.crc32, whatever the piece
    size (pieces that end mid-chunk included); checksums appear in the order of the chunks' ends."""
    specs, tensors, flat = _model(3)
    ranges = _ranges(specs, [EP1, EP2, Layout(2, 4, ((3, 0), (1, 2)))], 4096)
    offsets, total = source_offsets(specs)
    source = torch.zeros(total, dtype=torch.uint8)
    packer = SourcePacker(source, offsets, tensors, ranges, piece)
    t = _run(packer)
    assert packer.wait(WAIT_S), "packing did not end"
    t.join(WAIT_S)
    assert packer.error is None and packer.done
    assert torch.equal(source, flat)
    assert packer.crcs == {(src, n): _crc(flat, src, n) for src, n in ranges}
    ends = [src + n for src, n in packer.crcs]  # insertion order: when each became available
    assert ends == sorted(ends)
    deadline = time.monotonic() + WAIT_S
    for src, n in ranges:
        assert packer.crc((src, n), deadline, "weights.stage", "receiver T/0") == _crc(flat, src, n)


class _Gated:
    """A tensor whose packing starts only when ``gate`` is set (``entered`` says it was reached)."""

    def __init__(self, tensor):
        self.tensor, self.gate, self.entered = tensor, threading.Event(), threading.Event()

    def reshape(self, *shape):
        self.entered.set()
        assert self.gate.wait(WAIT_S), "the test never opened the gate"
        return self.tensor.reshape(*shape)


def test_source_packer_hands_out_chunks_while_later_tensors_are_packed():
    """A sender gets the CRC of every chunk of the first tensor while the second is not packed
    yet (the writes can leave early); a later chunk is not there, and a wait for it ends at its
    deadline with an error naming the phase and the receiver; once packing goes on, it is."""
    specs, tensors, flat = _model(4)
    ranges = _ranges(specs, [EP1], 4096)
    offsets, total = source_offsets(specs)
    gated = _Gated(tensors[1])
    packer = SourcePacker(torch.zeros(total, dtype=torch.uint8), offsets, [tensors[0], gated, *tensors[2:]],
                          ranges, 1000)
    t = _run(packer)
    try:
        assert gated.entered.wait(WAIT_S)
        first = sorted(r for r in ranges if sum(r) <= offsets[1])
        later = sorted(r for r in ranges if r[0] >= offsets[1])
        assert first and later
        deadline = time.monotonic() + 10  # they are packed already: no wait at all
        for src, n in first:
            assert packer.crc((src, n), deadline, "weights.stage", "receiver T/0") == _crc(flat, src, n)
        assert all(packer.ready(r) is None for r in later)
        t0 = time.monotonic()
        with pytest.raises(WeightError, match=r"weights\.stage: chunk .* for receiver T/0 was not packed in time"):
            packer.crc(later[0], time.monotonic() + 0.2, "weights.stage", "receiver T/0")
        assert time.monotonic() - t0 < 5
        assert not packer.done
    finally:
        gated.gate.set()
    assert packer.wait(WAIT_S)
    t.join(WAIT_S)
    assert packer.error is None
    assert all(packer.ready(r) == _crc(flat, *r) for r in later)


class _Exploding:
    def reshape(self, *shape):
        raise RuntimeError("exploded while packing")


def test_source_packer_error_reaches_every_waiting_sender():
    """An exception while packing a tensor ends the packing; every sender waiting for a chunk
    not packed yet gets a WeightError naming its phase, its receiver and the cause (no hang);
    chunks packed before it stay answerable. A range outside the model is a planning defect."""
    specs, tensors, flat = _model(5)
    ranges = _ranges(specs, [EP1], 4096)
    offsets, total = source_offsets(specs)
    packer = SourcePacker(torch.zeros(total, dtype=torch.uint8), offsets, [tensors[0], _Exploding(), *tensors[2:]],
                          ranges, 4096)
    later = sorted(r for r in ranges if r[0] >= offsets[1])
    errors = []

    def sender(key):  # a session thread blocked in crc() before the error
        try:
            packer.crc(key, time.monotonic() + WAIT_S, "weights.stage", "receiver W/0")
        except WeightError as e:
            errors.append(str(e))

    waiting = [threading.Thread(target=sender, args=(r,), daemon=True) for r in (later[0], later[-1])]
    for w in waiting:
        w.start()
    _run(packer).join(WAIT_S)
    for w in waiting:
        w.join(WAIT_S)
        assert not w.is_alive()
    assert packer.done and isinstance(packer.error, WeightError)
    assert len(errors) == 2
    assert all("weights.stage: packing the source for receiver W/0 failed: packing tensor 1: "
               "RuntimeError: exploded while packing" in e for e in errors)
    first = min(ranges)
    assert packer.crc(first, time.monotonic() + 1, "weights.stage", "receiver W/0") == _crc(flat, *first)

    outside = SourcePacker(torch.zeros(total, dtype=torch.uint8), offsets, tensors, {(total, 64)}, 4096)
    _run(outside).join(WAIT_S)
    assert isinstance(outside.error, WeightError) and "1 chunks lie outside the model" in str(outside.error)
    with pytest.raises(WeightError, match="packing the source for receiver W/0 failed"):
        outside.crc((total, 64), time.monotonic() + WAIT_S, "weights.stage", "receiver W/0")


# ---- seals, end to end ---------------------------------------------------------------------

class Pipe:
    """The publisher here (no fault hook unless a test sets one), EP-1 workers as separate
    processes and EP-1 subscribers in this process (threads: they join in milliseconds, where a
    worker process takes seconds)."""

    def __init__(self, out, **timeouts):
        self.out = out
        dense, rows = state_for(0)
        self.pub = WeightPublisher.for_state(dense, rows, chunk_bytes=CHUNK_BYTES, **timeouts)
        self.env = child_env(WEIGHTS_ADDRESS=f"{self.pub.address[0]}:{self.pub.address[1]}",
                             WEIGHTS_AUTHKEY=self.pub.authkey.hex(), OUT=out)
        self.workers = {}
        self.subs = {}

    def start(self, worker_id, *extra):
        child = Child([sys.executable, WORKER, "--worker-id", worker_id, *extra], self.env, f"worker {worker_id}")
        self.workers[worker_id] = child
        return child

    def subscribe(self, worker_id, stage_timeout_s=10.0, control_timeout_s=10.0):
        expected = expected_tensors(local_share(*state_for(0), EP1, 0))
        sub = WeightSubscriber(self.pub.address, self.pub.authkey, worker_id, 0, EP1, expected,
                               connect_timeout_s=WAIT_S, control_timeout_s=control_timeout_s,
                               stage_timeout_s=stage_timeout_s)
        self.subs[worker_id] = sub
        return sub

    def joined(self, worker_id):
        self.workers[worker_id].expect(lambda e: e["event"] == "joined", timeout_s=60, what="the join")

    def check_committed(self, worker_id, version):
        """The worker's (or subscriber's) ``version``, checked bit for bit."""
        want = local_share(*state_for(version), EP1, 0)
        if worker_id in self.subs:
            got_version, saved = self.subs[worker_id].wait_committed(version, WAIT_S)
            assert got_version == version
            event = None
        else:
            event = self.workers[worker_id].expect(lambda e: e["event"] == "committed" and e["version"] == version,
                                                   timeout_s=WAIT_S, what=f"committing v{version}")
            saved = torch.load(event["path"], weights_only=True)
        assert set(saved) == set(want)
        assert all(torch.equal(saved[n], want[n]) for n in want), f"{worker_id} v{version} differs"
        return event

    def never_handed_out(self, sub, before):
        """The subscriber gave up; it keeps ``before``, bit-exact, and hands out nothing newer."""
        latest = sub.latest()
        assert latest.version == before and sub.committed_version == before
        want = local_share(*state_for(before), EP1, 0)
        assert all(torch.equal(latest.tensors[n], want[n]) for n in want)
        assert sub.poll() is None or sub.latest().version == before

    def close(self):
        self.pub.close()
        for sub in self.subs.values():
            sub.close()
        for child in self.workers.values():
            try:
                child.wait(WAIT_S)
            finally:
                child.kill()


@pytest.fixture(scope="module")
def pipe(tmp_path_factory):
    """Worker P (a process: the one the tests tamper with and that must recover), subscribers Q
    (dropped by one test) and R (short timeouts: its wait for a seal that never comes is 2 + 2 s)
    in this process, v1 committed."""
    p = Pipe(str(tmp_path_factory.mktemp("pipeline")), control_timeout_s=10.0, stage_timeout_s=10.0)
    try:
        p.start("P")
        p.subscribe("Q")
        p.subscribe("R", stage_timeout_s=2.0, control_timeout_s=2.0)
        p.joined("P")
        p.pub.wait_receivers(3, 60)
        result = p.pub.publish(1, *state_for(1))
        assert result.committed == ["P/0", "Q/0", "R/0"], result
        for w in "PQR":
            p.check_committed(w, 1)
        yield p
    finally:
        p.close()


def _tamper_seals(monkeypatch, fn):
    """Wraps the control channel's send in this process: every seal the publisher sends goes
    through ``fn(receiver name, message copy)``, which returns the message to send (None:
    swallowed). Only the publisher sends seals; the subscribers here are not affected."""
    real = wire.send

    def send(conn, message, phase, peer):
        if isinstance(message, dict) and message.get("op") == "seal":
            message = fn(peer.removeprefix("receiver "), dict(message, crcs=list(message["crcs"])))
            if message is None:
                return None
        return real(conn, message, phase, peer)

    monkeypatch.setattr(wire, "send", send)
    return real


def _first_seal_of(name, version, change):
    """A tamper that applies ``change`` to the first seal of ``version`` sent to ``name`` only
    (the recovery's seal, the second, goes out intact)."""
    seen = []

    def fn(receiver, message):
        if receiver == name and message["version"] == version:
            seen.append(message)
            if len(seen) == 1:
                return change(message)
        return message

    return fn, seen


def _others_committed(p, result, version, *names):
    for w in names:
        assert f"{w}/0" in result.committed and f"{w}/0" not in result.recovered, result
        p.check_committed(w, version)


def _wrong_crc(m):
    m["crcs"][3] ^= 0x1
    return m


def _one_crc_short(m):
    m["crcs"].pop()
    return m


def _publish_with_first_seal_to_p_changed(p, monkeypatch, change):
    """Publishes the next version with P's first seal passed through ``change``; returns
    (version, the seals P was sent, the PublishResult)."""
    v = p.pub.committed_version + 1
    fn, seen = _first_seal_of("P/0", v, change)
    _tamper_seals(monkeypatch, fn)
    result = p.pub.publish(v, *state_for(v))
    monkeypatch.undo()
    return v, seen, result


@pytest.mark.parametrize("change, reason", [(_wrong_crc, r"checksum mismatch in chunk 3 .*sealed"),
                                            (_one_crc_short, r"the seal of v\d+ does not carry \d+ checksums")],
                         ids=["wrong-crc", "too-few-crcs"])
def test_bad_seal_refused_receiver_poisoned_and_recovers(pipe, monkeypatch, change, reason):
    """P's seal is wrong (one CRC, or one CRC missing) although its bytes are right: P refuses to
    stage, the publisher names it, poisons it and resends the committed version with a true seal;
    P hands out nothing but bit-exact, committed versions."""
    p = pipe
    v, seen, result = _publish_with_first_seal_to_p_changed(p, monkeypatch, change)
    assert len(seen) == 2  # the tampered one and the recovery's
    assert "P/0" in result.recovered and not result.dropped, result
    assert re.search(reason, result.recovered["P/0"]), result.recovered["P/0"]
    event = p.check_committed("P", v)
    kinds = [(k, ver) for k, ver, _ in event["events"]]
    assert ("stage_failed", v) in kinds and ("poisoned", v) in kinds
    committed = [e["version"] for e in p.workers["P"].events if e["event"] == "committed"]
    assert committed == sorted(set(committed))  # v handed out once, after its verified resend
    _others_committed(p, result, v, "Q", "R")


def test_seal_before_last_chunk_lands_is_accepted(pipe, monkeypatch):
    """The seal travels on the control channel, the chunks over the fabric: the seal may reach
    the receiver while chunks are still missing (and a chunk land after it). Here the seal (its
    true CRCs) goes out before the last chunk is even posted, and the chunk is held a second
    after it: the receiver waits for the chunk, verifies it against the seal and stages first
    time, no vote down, no recovery."""
    p = pipe
    v = p.pub.committed_version + 1
    state = state_for(v)
    sent_early = []
    real = _tamper_seals(monkeypatch, lambda name, m: None if name == "P/0" and m["version"] == v and sent_early
                         else m)  # the publisher's own seal for P: already sent
    template = {}

    def hook(event, **i):
        if i["session"] != "P/0" or i["version"] != v or i.get("recover", True):
            return None
        if event == "manifest":
            template["chunks"] = WeightManifest.from_json(i["manifest_json"]).rank_chunks(0)
        elif event == "chunk" and i["index"] == len(template["chunks"]) - 1:
            _, _, flat = _model(v)
            crcs = [_crc(flat, c.src, c.length) for c in template["chunks"]]
            real(p.pub._sessions["P/0"].conn, {"op": "seal", "version": v, "crcs": crcs}, "test", "receiver P/0")
            sent_early.append(True)
            time.sleep(1.0)  # the receiver polls its control channel every 0.1 s while chunks are missing
        return None

    p.pub.fault_hook = hook  # the per-chunk write path, so the last chunk can be held
    try:
        result = p.pub.publish(v, *state)
    finally:
        p.pub.fault_hook = None
        monkeypatch.undo()
    assert sent_early and not result.recovered and not result.dropped, result
    event = p.check_committed("P", v)
    assert not any(ver == v for _, ver, _ in event["events"])  # no stage_failed, no poisoning
    _others_committed(p, result, v, "Q", "R")


@pytest.mark.parametrize("change, reason", [
    (lambda m: dict(m, version=m["version"] - 1), r"expected the seal of v(\d+), got 'seal' for v"),
    (lambda m: {"op": "commit", "version": m["version"]}, r"'commit'"),
], ids=["seal-of-another-version", "commit-instead-of-seal"])
def test_out_of_order_seal_refused_then_recovered(pipe, monkeypatch, change, reason):
    """A seal of another version (an earlier transfer's) or a commit where the seal belongs is
    refused whether it comes mid-transfer or after the last chunk: P votes the transfer down, is
    poisoned and recovers; the others commit."""
    p = pipe
    v, seen, result = _publish_with_first_seal_to_p_changed(p, monkeypatch, change)
    assert len(seen) == 2 and "P/0" in result.recovered and not result.dropped, result
    assert re.search(reason, result.recovered["P/0"]), result.recovered["P/0"]
    p.check_committed("P", v)
    _others_committed(p, result, v, "Q", "R")


def _like_a_worker(sub, version, errors):
    """What a worker does (weights_worker.py): wait for ``version``; when the subscriber gives
    up, record why and close it (the publisher sees the connection end)."""
    def run():
        try:
            sub.wait_committed(version, WAIT_S)
        except WeightError as e:
            errors.append(str(e))
            sub.close()

    t = threading.Thread(target=run, name="test-worker", daemon=True)
    t.start()
    return t


def test_seal_that_never_comes_ends_at_the_receivers_deadline(pipe, monkeypatch):
    """R's seal is never sent: R's wait for it ends at its deadline (stage + control timeout,
    2 + 2 s), R keeps its last committed version, and the publisher names R dropped, long before
    its own deadline for R's vote (10 + 10 s); the others commit."""
    p = pipe
    v = p.pub.committed_version + 1
    before, sub, errors = p.pub.committed_version, p.subs["R"], []
    _tamper_seals(monkeypatch, lambda name, m: None if name == "R/0" else m)
    worker = _like_a_worker(sub, v, errors)
    t0 = time.monotonic()
    result = p.pub.publish(v, *state_for(v))
    elapsed = time.monotonic() - t0
    monkeypatch.undo()
    worker.join(WAIT_S)
    assert "R/0" in result.dropped and "R/0" not in result.committed, result
    assert elapsed < 12, f"publish took {elapsed:.1f} s"
    assert len(errors) == 1 and "no message from the publisher" in sub.error and "within 4.0 s" in sub.error, \
        sub.error
    p.never_handed_out(sub, before)
    assert "R/0" not in p.pub.receivers()
    _others_committed(p, result, v, "P", "Q")


def test_receiver_that_keeps_getting_bad_seals_is_dropped_keeping_last_committed(pipe, monkeypatch):
    """Q's seals carry a wrong CRC every time (the recovery's too): Q is poisoned, fails again and
    is dropped and named; it never hands out the version and keeps the previous one."""
    p = pipe
    v = p.pub.committed_version + 1
    before, sub = p.pub.committed_version, p.subs["Q"]
    _tamper_seals(monkeypatch, lambda name, m: _wrong_crc(m) if name == "Q/0" else m)
    result = p.pub.publish(v, *state_for(v))
    monkeypatch.undo()
    reason = result.dropped.get("Q/0", "")
    assert "checksum mismatch in chunk 3" in reason and "recovery failed" in reason, result
    assert "Q/0" not in result.committed and "Q/0" not in p.pub.receivers()
    with pytest.raises(WeightError, match="dropped Q/0"):
        sub.wait_committed(v, WAIT_S)
    kinds = [(k, ver) for k, ver, _ in sub.events]
    assert kinds.count(("stage_failed", v)) == 2 and ("poisoned", v) in kinds
    p.never_handed_out(sub, before)
    _others_committed(p, result, v, "P")


class _ExplodingTensor(torch.Tensor):
    """Passes publish()'s checks; viewing its bytes while packing raises."""

    def view(self, *args, **kwargs):
        if args and args[0] is torch.uint8:
            raise RuntimeError("exploded while packing")
        return super().view(*args, **kwargs)


def test_packing_error_fails_publish_commits_nothing(tmp_path):
    """A tensor that cannot be packed: publish() raises naming the phase and the cause, the
    version is not committed (publisher and receiver keep v1), the receiver mid-stage is dropped
    and named rather than left waiting; the publisher publishes the next version afterwards."""
    p = Pipe(str(tmp_path), control_timeout_s=10.0, stage_timeout_s=10.0)
    try:
        sub = p.subscribe("X")
        p.pub.wait_receivers(1, 60)
        assert p.pub.publish(1, *state_for(1)).committed == ["X/0"]
        p.check_committed("X", 1)
        dense, rows = state_for(2)
        name = sorted(rows)[-1]  # one of the last tensors packed: the writes of earlier ones are under way
        rows[name] = rows[name].as_subclass(_ExplodingTensor)
        t0 = time.monotonic()
        with pytest.raises(WeightError, match=rf"weights\.publish v2: packing the source failed: packing {name}: .*exploded"):
            p.pub.publish(2, dense, rows)
        assert time.monotonic() - t0 < 8
        assert p.pub.committed_version == 1
        assert "X/0" in p.pub.dropped and "packing the source failed" in p.pub.dropped["X/0"]
        with pytest.raises(WeightError, match="v2 not committed on X/0"):
            sub.wait_committed(2, WAIT_S)
        p.never_handed_out(sub, 1)
        result = p.pub.publish(2, *state_for(2))  # nothing connected now; the publisher still works
        assert result.committed == [] and p.pub.committed_version == 2
    finally:
        p.close()
