"""The trainer's side of weight publication (docs/RL.md section 5): :class:`WeightPublisher`
runs in ONE process of the trainer, its rank 0, after ``training.gather_ep_state`` has brought
every expert row there (dense tensors are replicated, so rank 0's are everyone's). Rollout
workers are separate jobs, never members of the trainer's process group: each of their ranks
dials the publisher's control listener with a :class:`~.subscriber.WeightSubscriber`.

Per receiver rank the publisher holds a session: the control connection and an RMA link of its
own (``_proxyep.RmaSender``; a private two-endpoint fabric, so a late or replaced receiver gets
a fresh one and a dead one breaks nothing else). ``publish(version, dense_state, expert_rows)``:

1. checks the version (above the last committed) and every tensor against the schema, before
   anything changes;
2. copies the state into the staging half of a double-buffered, registered source (the other
   half keeps the last committed version, which recoveries and late joiners are sent from), on
   a packing thread (packing.py) that checksums each chunk as soon as it is packed;
3. meanwhile stages on every receiver at once (a thread each), pipelined: the receiver's
   manifest (its layout's byte ranges, experts only to the ranks that own them, dense to all)
   goes over the control channel, the receiver says it is ready (its landing area is free and it
   polls), each chunk goes over the fabric as soon as it is packed, then the seal (every
   chunk's CRC-32) follows on the control channel; the receiver has checksummed each chunk as it
   landed, compares, and votes;
4. commits the version (it is now the last committed) and tells every receiver that staged,
   which hands the version out only then;
5. tells every receiver that failed to stage (bad checksum, refused manifest, timeout) that it
   is poisoned, and sends it the last committed version again (stage + commit); a receiver that
   fails that too, or whose connection or link died at any point, is dropped and named in the
   :class:`PublishResult`, without holding up the others beyond their phase deadlines.

A receiver that joins while a version is committed is sent that version at once (late joiners,
Spot replacements). A receiver whose layout or tensors do not match the schema is refused with
the reason on both sides (its subscriber raises, ``refusals`` here records it) before any bytes
move. Only full versions are published (no deltas yet).

``fault_hook(event, **info)``: for tests only. Events: ``"manifest"`` (session, version,
manifest_json, recover) may return replacement JSON; ``"chunk"`` (session, version, index, recover) may
return ``"corrupt"`` to send that chunk with one byte flipped (from a private copy: the source
stays intact); ``"commit"`` (session, version) is called before a receiver is told to commit.

Typical use::

    # trainer, every rank: dense, rows = gather_ep_state(model, group)  (collective)
    # trainer rank 0:
    pub = WeightPublisher.for_state(dense, rows, host="0.0.0.0", authkey=key)
    result = pub.publish(step, dense, rows)          # PublishResult: committed, recovered, dropped

    # rollout worker rank r of an EP-n worker:
    sub = WeightSubscriber(pub_address, key, "worker-7", r, Layout.contiguous(n, num_experts),
                           expected_tensors(model.named_parameters()))
    update = sub.poll()                               # between decode steps
    if update is not None:
        version, state = update                       # this rank's tensors, verified and committed
"""

import concurrent.futures
import dataclasses
import logging
import secrets
import threading
import time
import zlib
from typing import Dict, List, Optional

import torch

from . import wire
from .manifest import (NO_CHECKSUMS, Layout, TensorSpec, WeightError, dtype_name, landing_plan, manifest_from,
                       plan_ranges, schema_of, source_offsets, validate_schema)
from .packing import SourcePacker

log = logging.getLogger("proxyep.rl.weights")

_SLICE_MS = 100  # fabric waits run this long before the control channel is checked again


def _native():
    from proxyep import _proxyep
    return _proxyep


@dataclasses.dataclass
class PublishResult:
    """What one publish did. Receivers are named ``"<worker_id>/<rank>"``.

    ``committed``: every receiver that holds ``version`` as committed when publish returns
    (staged first time, or recovered); ``recovered``: those among them that were poisoned first
    (with the reason); ``dropped``: receivers that are gone, with the reason; ``bytes``: fabric
    bytes written to each receiver during this publish (recoveries included)."""
    version: int
    committed: List[str]
    recovered: Dict[str, str]
    dropped: Dict[str, str]
    bytes: Dict[str, int]
    seconds: Dict[str, float]  # copy, stage, commit, recover: wall time of each phase


class _Session:
    def __init__(self, worker_id, rank, layout, conn, pid):
        self.worker_id, self.rank, self.layout, self.conn, self.pid = worker_id, rank, layout, conn, pid
        self.name = f"{worker_id}/{rank}"
        self.sender = None
        self.remote = None
        self.regions = []  # region id of each source slot
        self.scratch = None  # (tensor, region) for the corrupt fault
        self.transfers = 0
        self.committed = None
        self.bytes_total = 0

    def close(self):
        try:
            self.conn.close()
        except OSError:
            pass
        if self.sender is not None:
            self.sender.close()
            self.sender = None


class _Outcome:
    def __init__(self, kind, reason="", nbytes=0):
        self.kind, self.reason, self.nbytes = kind, reason, nbytes  # kind: staged | failed | dead


class WeightPublisher:
    """Publishes versions of a model to rollout workers (see the module docstring).

    ``schema``: the model's tensors (:func:`~.manifest.schema_of` of the first state,
    or :meth:`for_state`). ``host``/``port``: where the control listener binds (port 0: a free
    one; ``address`` says which). ``authkey``: bytes every subscriber must present (default: a
    random key, ``authkey`` attribute). ``chunk_bytes``: the bucket size of fabric writes (also
    bounded by the provider's maximum message size). Timeouts are in seconds: ``control_timeout_s``
    for each control round trip, ``stage_timeout_s`` for a receiver's whole transfer."""

    def __init__(self, schema, host="127.0.0.1", port=0, authkey=None, chunk_bytes=1 << 20,
                 control_timeout_s=10.0, stage_timeout_s=60.0, fault_hook=None):
        self.schema = list(schema)
        self.num_experts = validate_schema(self.schema)
        if chunk_bytes < 1:
            raise WeightError(f"chunk_bytes must be positive, got {chunk_bytes}")
        self.authkey = secrets.token_bytes(32) if authkey is None else bytes(authkey)
        self.chunk_bytes = chunk_bytes
        self.control_timeout_s, self.stage_timeout_s = control_timeout_s, stage_timeout_s
        self.fault_hook = fault_hook
        self.refusals: List[str] = []  # why receivers were refused at join, oldest first
        self.dropped: Dict[str, str] = {}  # every receiver ever dropped, with the reason
        self._offsets, total = source_offsets(self.schema)
        # Two registered source slots: the last committed version and the one being staged.
        self._slots = [torch.zeros(total, dtype=torch.uint8) for _ in range(2)]
        self._committed_slot = 0
        self.committed_version: Optional[int] = None
        self._plans: Dict[tuple, list] = {}  # (layout key, chunk bytes) -> plan_ranges (version-free)
        self._plans_layout: Dict[tuple, Layout] = {}
        self._committed_crcs: Dict[tuple, int] = {}  # (src, length) -> CRC-32 of the committed version
        self._manifest_json: Dict[tuple, str] = {}
        self._sessions: Dict[str, _Session] = {}
        self._lock = threading.RLock()  # publish, joins and close, one at a time
        self._closing = threading.Event()
        self._listener = wire.listen(host, port)
        self._listener.settimeout(0.2)  # the accept loop checks _closing this often
        self.address = self._listener.getsockname()[:2]
        self._joiners = set()
        self._session_pool, self._session_pool_size = None, 0
        self._accept_thread = threading.Thread(target=self._accept_loop, name="weights-accept", daemon=True)
        self._accept_thread.start()

    @classmethod
    def for_state(cls, dense_state, expert_rows, **kwargs):
        """A publisher for the model whose state this is (gather_ep_state's output)."""
        return cls(schema_of(dense_state, expert_rows), **kwargs)

    # ---- status ----

    def receivers(self):
        """{name: committed version} of the receivers connected now."""
        with self._lock:
            return {name: s.committed for name, s in self._sessions.items()}

    def wait_receivers(self, count, timeout_s):
        """Waits until ``count`` receivers have joined (and caught up); WeightError on timeout."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                have = len(self._sessions)
            if have >= count:
                return have
            if time.monotonic() >= deadline:
                raise WeightError(f"weights.join: {have} of {count} receivers joined within {timeout_s} s "
                                  f"(refused: {self.refusals[-3:]})")
            self._closing.wait(0.01)

    # ---- publishing ----

    def publish(self, version, dense_state, expert_rows):
        """Publishes ``version`` (see the module docstring); returns a PublishResult. Raises
        WeightError for a version not above the last committed, or a state that does not match
        the schema (nothing has changed then); receivers that fail are reported, not raised."""
        if self._closing.is_set():
            raise WeightError("weights.publish: the publisher is closed")
        state = self._check_state(version, dense_state, expert_rows)
        with self._lock:
            if self.committed_version is not None and version <= self.committed_version:
                raise WeightError(f"weights.publish: version {version} is not above the last committed version "
                                  f"{self.committed_version} (stale or duplicate)")
            seconds = {}
            t0 = time.perf_counter()
            slot = 1 - self._committed_slot if self.committed_version is not None else 0
            sessions = list(self._sessions.values())
            plans = {self._plan_key(s): self._plan(s) for s in sessions}
            # Pipelined: the packer copies the state into the staging slot and checksums each
            # chunk as it passes it, while every session's thread sends its manifest, waits for
            # ready and posts each chunk as soon as its checksum exists.
            ranges = {(src, n) for ranges in plans.values() for per_rank in ranges for chunks in per_rank
                      for src, _, n in chunks}
            packer = SourcePacker(self._slots[slot], self._offsets, state, ranges, self.chunk_bytes,
                                  names=[spec.name for spec in self.schema])
            packing = threading.Thread(target=packer.run, name="weights-pack", daemon=True)
            packing.start()
            templates = {key: manifest_from(version, self.schema, self._plans_layout[key], r, NO_CHECKSUMS)
                         for key, r in plans.items()}
            outcomes = self._parallel(sessions, lambda s: self._stage(s, version, slot, templates[self._plan_key(s)],
                                                                      packer))
            if not packer.wait(self.stage_timeout_s):
                packer.error = packer.error or WeightError(f"not done within {self.stage_timeout_s} s")
            seconds["copy"] = packer.seconds  # overlapped with the stage phase
            seconds["stage"] = time.perf_counter() - t0
            if packer.error is not None:
                # Nothing is committed; receivers mid-stage cannot be left waiting for writes.
                reason = f"weights.publish v{version}: packing the source failed: {packer.error}"
                for s in sessions:
                    self._drop(s.name, reason)
                raise WeightError(reason)
            # Commit: the version is the last committed from here on, whoever acknowledged.
            self.committed_version, self._committed_slot = version, slot
            self._committed_crcs = packer.crcs
            nbytes = {s.name: o.nbytes for s, o in outcomes}
            dropped = {s.name: o.reason for s, o in outcomes if o.kind == "dead"}
            staged = [s for s, o in outcomes if o.kind == "staged"]
            failed = [(s, o.reason) for s, o in outcomes if o.kind == "failed"]
            t0 = time.perf_counter()
            committed = []
            for s, o in self._parallel(staged, lambda s: self._commit(s, version)):
                if o.kind == "staged":
                    committed.append(s.name)
                else:
                    dropped[s.name] = o.reason
            seconds["commit"] = time.perf_counter() - t0

            t0 = time.perf_counter()
            recovered, reasons = {}, {s.name: reason for s, reason in failed}
            for s, reason in failed:
                log.warning("weights: %s failed to stage v%d (%s): poisoned, resending v%d", s.name, version,
                            reason, version)
            for s, o in self._parallel([s for s, _ in failed], lambda s: self._recover(s, version, reasons[s.name])):
                reason = reasons[s.name]
                nbytes[s.name] += o.nbytes
                if o.kind == "staged":
                    committed.append(s.name)
                    recovered[s.name] = reason
                else:
                    dropped[s.name] = f"failed to stage ({reason}), then recovery failed: {o.reason}"
            seconds["recover"] = time.perf_counter() - t0
            for name, reason in dropped.items():
                self._drop(name, reason)
            return PublishResult(version, sorted(committed), recovered, dropped, nbytes, seconds)

    def _check_state(self, version, dense_state, expert_rows):
        """The state's tensors in schema order (contiguous CPU), or WeightError saying what is
        wrong."""
        if not isinstance(version, int) or isinstance(version, bool) or version < 0:
            raise WeightError(f"weights.publish: version must be a non-negative integer, got {version!r}")
        if self.committed_version is not None and version <= self.committed_version:
            raise WeightError(f"weights.publish: version {version} is not above the last committed version "
                              f"{self.committed_version} (stale or duplicate)")
        if not isinstance(dense_state, dict) or not isinstance(expert_rows, dict):
            raise WeightError(f"weights.publish v{version}: dense_state and expert_rows must be dicts of tensors")
        given = {**{n: ("dense", t) for n, t in dense_state.items()},
                 **{n: ("expert", t) for n, t in expert_rows.items()}}
        expected = {s.name for s in self.schema}
        if set(given) != expected or len(given) != len(dense_state) + len(expert_rows):
            extra, missing = sorted(set(given) - expected), sorted(expected - set(given))
            raise WeightError(f"weights.publish v{version}: tensors do not match the schema "
                              f"(missing {missing}, unknown {extra})")
        out = []
        for spec in self.schema:
            kind, t = given[spec.name]
            if not isinstance(t, torch.Tensor):
                raise WeightError(f"weights.publish v{version}: {spec.name} is a {type(t).__name__}, not a tensor")
            if kind != spec.kind:
                raise WeightError(f"weights.publish v{version}: {spec.name} given as {kind}, the schema says "
                                  f"{spec.kind}")
            if t.device.type != "cpu":
                raise WeightError(f"weights.publish v{version}: {spec.name} is on {t.device}; pass CPU tensors")
            if tuple(t.shape) != spec.shape or dtype_name(t.dtype) != spec.dtype:
                raise WeightError(f"weights.publish v{version}: {spec.name} is {tuple(t.shape)} "
                                  f"{dtype_name(t.dtype)}, the schema says {spec.shape} {spec.dtype}")
            out.append(t.detach().contiguous())
        return out

    def _chunk_limit(self, session):
        return max(1, min(self.chunk_bytes, session.sender.max_write_bytes))

    @staticmethod
    def _layout_key(layout):
        return repr(layout.to_dict())

    def _plan_key(self, session):
        return (self._layout_key(session.layout), self._chunk_limit(session))

    def _plan(self, session):
        """plan_ranges for the session's layout and chunk size, planned once (no version in it)."""
        key = self._plan_key(session)
        if key not in self._plans:
            self._plans[key] = plan_ranges(self.schema, session.layout, key[1])
            self._plans_layout[key] = session.layout
        return self._plans[key]

    def _parallel(self, sessions, fn):
        """fn(session) for every session at once (a thread each: they wait on different peers),
        as [(session, result)]. Only publish() calls it, under the lock, so the pool is never
        shared by two phases; its threads are kept between phases (starting them costs more
        than a control round trip)."""
        if not sessions:
            return []
        if self._session_pool is None or self._session_pool_size < len(sessions):
            if self._session_pool is not None:
                self._session_pool.shutdown(wait=True)
            self._session_pool_size = max(len(sessions), 2 * self._session_pool_size)
            self._session_pool = concurrent.futures.ThreadPoolExecutor(max_workers=self._session_pool_size,
                                                                       thread_name_prefix="weights-session")
        return list(zip(sessions, self._session_pool.map(fn, sessions)))

    def _manifest_text(self, session, manifest, recover):
        key = (self._plan_key(session), manifest.version)
        text = self._manifest_json.get(key)
        if text is None:
            if len(self._manifest_json) > 16:  # only the current and last committed versions matter
                self._manifest_json.clear()
            text = self._manifest_json[key] = manifest.to_json()
        if self.fault_hook is not None:
            text = self.fault_hook("manifest", session=session.name, version=manifest.version,
                                   manifest_json=text, recover=recover) or text
        return text

    def _stage(self, session, version, slot, manifest, packer, recover=False):
        """One transfer of ``version`` from source ``slot`` to ``session`` -> _Outcome (never
        raises): staged (the receiver verified every chunk), failed (it says it could not
        stage: poison it) or dead (connection or link broken, or no answer in time).

        Pipelined: ``manifest`` is the template (every CRC 0); each chunk is posted as soon as
        ``packer`` has packed and checksummed it, and once all are posted their checksums follow
        in one seal message, which the receiver checks against its own, computed as the chunks
        landed. No round trip per chunk, one checksum pass on each side."""
        phase, peer = "weights.stage", f"receiver {session.name}"
        sent = 0
        try:
            tag = session.transfers & 0xFF
            session.transfers += 1
            chunks = manifest.rank_chunks(session.rank)
            writes_before = session.sender.posted
            wire.send(session.conn, {"op": "stage", "version": version, "tag": tag, "writes_before": writes_before,
                                     "recover": recover, "manifest": self._manifest_text(session, manifest, recover)},
                      phase, peer)
            reply = wire.recv(session.conn, self.control_timeout_s, phase, peer)
            if reply["op"] == "refused":
                return _Outcome("failed", f"refused the manifest: {reply.get('error')}")
            if reply["op"] != "ready":
                return _Outcome("dead", f"{phase}: unexpected reply {reply['op']!r} from {peer}")
            region, remote = session.regions[slot], session.remote
            deadline = time.monotonic() + self.stage_timeout_s
            crcs, reply, i = [], None, 0
            while i < len(chunks) and reply is None:
                crcs.append(packer.crc((chunks[i].src, chunks[i].length), deadline, phase, peer))
                if self.fault_hook is not None:
                    reply = self._write_hooked(session, version, slot, chunks, i, tag, recover, phase, peer)
                    i += 1
                    continue
                # Every chunk packed by now goes out in one batch (one GIL release).
                j = i + 1
                while j < len(chunks):
                    value = packer.ready((chunks[j].src, chunks[j].length))
                    if value is None:
                        break
                    crcs.append(value)
                    j += 1
                writes = [(c.src, c.length, c.dst, (tag << 24) | k) for k, c in enumerate(chunks[i:j], start=i)]
                reply = self._write_all(session, region, remote, writes, phase, peer)
                i = j
            sent = sum(c.length for c in chunks[:i])
            session.bytes_total += sent
            if reply is None:
                wire.send(session.conn, {"op": "seal", "version": version, "crcs": crcs}, phase, peer)
                reply = self._flush(session, phase, peer)
            if reply is None:
                reply = wire.recv(session.conn, self.stage_timeout_s + self.control_timeout_s, phase, peer)
            if reply["op"] == "staged" and reply.get("version") == version:
                return _Outcome("staged", nbytes=sent)
            if reply["op"] == "stage_failed":
                return _Outcome("failed", reply.get("error", "no reason given"), sent)
            return _Outcome("dead", f"{phase}: unexpected reply {reply['op']!r} from {peer}", sent)
        except wire.PeerGone as e:
            return _Outcome("dead", str(e), sent)
        except WeightError as e:  # a control timeout: the receiver does not answer
            return _Outcome("dead", str(e), sent)
        except RuntimeError as e:  # ProxyEPError from the link (names the phase and the peer)
            return _Outcome("dead", f"fabric: {e}", sent)

    def _write_hooked(self, session, version, slot, chunks, i, tag, recover, phase, peer):
        """Chunk ``i`` alone, through the fault hook (tests): it may corrupt it, stall or kill."""
        c = chunks[i]
        write = (c.src, c.length, c.dst, (tag << 24) | i)
        action = self.fault_hook("chunk", session=session.name, version=version, index=i, recover=recover)
        if action == "corrupt":
            self._write_corrupted(session, slot, write, int(self.stage_timeout_s * 1000), phase)
            return None
        return self._write_all(session, session.regions[slot], session.remote, [write], phase, peer)

    def _write_all(self, session, region, remote, writes, phase, peer):
        """Posts the transfer's writes in slices, watching the control channel between them, as
        _flush does: a receiver that said ready and then died (a drained worker exiting) ends the
        transfer at once (PeerGone) instead of having its writes refused until the stage
        deadline. Returns the receiver's message if it sent one (stage_failed), else None."""
        deadline = time.monotonic() + self.stage_timeout_s
        first = session.sender.posted
        while True:
            done = session.sender.posted - first  # a refused write is not counted: resume there
            if done >= len(writes):
                return None
            try:
                session.sender.write_batch(region, remote, writes[done:], 5 * _SLICE_MS, phase)
                return None
            except RuntimeError as e:  # ProxyEPError
                if "refused a write" not in str(e):
                    raise
                if session.conn.poll(0):
                    return wire.recv(session.conn, self.control_timeout_s, phase, peer)
                if time.monotonic() >= deadline:
                    raise

    def _flush(self, session, phase, peer):
        """Waits until the transfer's writes completed here, in slices, watching the control
        channel meanwhile: a receiver that dies ends the wait at once (PeerGone), one that gives
        up early (stage_failed) ends it with its vote, which is returned."""
        deadline = time.monotonic() + self.stage_timeout_s
        while not session.sender.flush_some(_SLICE_MS, phase):
            if session.conn.poll(0):
                return wire.recv(session.conn, self.control_timeout_s, phase, peer)
            if time.monotonic() >= deadline:
                raise WeightError(f"{phase}: writes to {peer} did not complete within {self.stage_timeout_s} s")
        return None

    def _write_corrupted(self, session, slot, write, timeout_ms, phase):
        """The fault hook's "corrupt": the chunk from a private copy with its first byte flipped."""
        src, length, dst, imm = write
        if session.scratch is None or session.scratch[0].numel() < length:
            session.sender.flush(timeout_ms, phase)
            scratch = torch.empty(max(length, self.chunk_bytes), dtype=torch.uint8)
            session.scratch = (scratch, session.sender.register(scratch, scratch.data_ptr(), scratch.numel()))
        scratch, region = session.scratch
        session.sender.flush(timeout_ms, phase)  # the scratch may still be in flight
        scratch[:length].copy_(self._slots[slot][src:src + length])
        scratch[0] ^= 0xFF
        session.sender.write(region, 0, length, session.remote, dst, imm, timeout_ms, phase)

    def _commit(self, session, version):
        phase, peer = "weights.commit", f"receiver {session.name}"
        if self.fault_hook is not None:
            self.fault_hook("commit", session=session.name, version=version)
        try:
            wire.send(session.conn, {"op": "commit", "version": version}, phase, peer)
            reply = wire.recv(session.conn, self.control_timeout_s, phase, peer)
            if reply["op"] == "committed" and reply.get("version") == version:
                session.committed = version
                return _Outcome("staged")
            return _Outcome("dead", f"{phase}: {peer} answered {reply} to commit v{version}")
        except WeightError as e:
            return _Outcome("dead", str(e))

    def _recover(self, session, version, reason):
        """Poisons ``session`` (it discards its staging) and sends it the last committed
        version, ``version``, again."""
        try:
            wire.send(session.conn, {"op": "poisoned", "version": version, "reason": reason}, "weights.poison",
                      f"receiver {session.name}")
        except WeightError as e:
            return _Outcome("dead", str(e))
        return self._sync(session)

    def _sync(self, session):
        """Stage + commit of the last committed version to one session (late joiners and
        recoveries); the lock is held."""
        version = self.committed_version
        plan = self._plan(session)
        # The committed slot holds the whole version, but its checksums cover only the chunks
        # the receivers of its publication needed (none, when it had none): a joiner of
        # another layout needs others, checksummed here from the slot.
        missing = {(src, n) for per_rank in plan for chunks in per_rank for src, _, n in chunks} \
            - self._committed_crcs.keys()
        if missing:
            source = memoryview(self._slots[self._committed_slot].numpy())
            for src, n in missing:
                self._committed_crcs[(src, n)] = zlib.crc32(source[src:src + n]) & 0xFFFFFFFF
        template = manifest_from(version, self.schema, session.layout, plan, NO_CHECKSUMS)
        packer = SourcePacker.packed(self._committed_crcs)  # the committed slot holds it already
        o = self._stage(session, version, self._committed_slot, template, packer, recover=True)
        if o.kind != "staged":
            return o
        c = self._commit(session, version)
        return _Outcome(c.kind, c.reason, o.nbytes)

    def _drop(self, name, reason):
        session = self._sessions.pop(name, None)
        self.dropped[name] = reason
        if session is None:
            return
        log.warning("weights: dropped receiver %s: %s", name, reason)
        try:
            wire.send(session.conn, {"op": "dropped", "reason": reason}, "weights.drop", name)
        except WeightError:
            pass
        session.close()

    # ---- joining ----

    def _accept_loop(self):
        while not self._closing.is_set():
            try:
                sock, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._closing.is_set():
                    return
                raise
            t = threading.Thread(target=self._join, args=(sock,), name="weights-join", daemon=True)
            self._joiners.add(t)
            t.start()

    def _refuse(self, conn, who, reason):
        message = f"weights.join: {who} refused: {reason}"
        log.warning("%s", message)
        with self._lock:
            self.refusals.append(message)
        try:
            wire.send(conn, {"op": "refused", "error": message}, "weights.join", who)
        except WeightError:
            pass
        conn.close()

    def _join(self, sock):
        try:
            self._join_one(sock)
        except Exception:  # noqa: BLE001 - a join thread must never die silently
            log.exception("weights: a join failed")
        finally:
            self._joiners.discard(threading.current_thread())

    def _join_one(self, sock):
        try:
            conn = wire.accept(sock, self.authkey, self.control_timeout_s)
        except WeightError as e:
            with self._lock:
                self.refusals.append(str(e))
            return
        who = "a receiver"
        try:
            hello = wire.recv(conn, self.control_timeout_s, "weights.join", who)
            if hello["op"] != "hello":
                raise WeightError(f"expected hello, got {hello['op']!r}")
            who = f"receiver {hello.get('worker_id')}/{hello.get('rank')}"
            session = self._session_from(hello, conn)
        except WeightError as e:
            self._refuse(conn, who, str(e).removeprefix("weights.join: "))
            return
        try:
            session.sender = _native().RmaSender(f"receiver {session.name}")
            session.sender.connect(bytes.fromhex(hello["address"]))
            session.remote = session.sender.add_remote(bytes.fromhex(hello["descriptor"]))
            session.regions = [session.sender.register(s, s.data_ptr(), s.numel()) for s in self._slots]
        except (RuntimeError, ValueError) as e:
            session.close()
            self._refuse(conn, who, f"cannot open the link: {e}")
            return
        with self._lock:
            if self._closing.is_set():
                session.close()
                return
            try:
                self._check_peers(session)
            except WeightError as e:
                session.sender.close()
                self._refuse(conn, who, str(e))
                return
            try:
                wire.send(conn, {"op": "welcome", "address": session.sender.address().hex(),
                                 "schema": [s.to_dict() for s in self.schema], "committed": self.committed_version},
                          "weights.join", who)
                reply = wire.recv(conn, self.control_timeout_s, "weights.join", who)
            except WeightError as e:
                log.warning("weights: %s left during the join: %s", who, e)
                session.close()
                return
            if reply["op"] != "joined":
                with self._lock:
                    self.refusals.append(f"weights.join: {who} refused the publisher: {reply.get('error')}")
                session.close()
                return
            self._sessions[session.name] = session
            self.dropped.pop(session.name, None)
            log.info("weights: %s joined (pid %s, layout %s)", session.name, session.pid, session.layout.to_dict())
            if self.committed_version is not None:
                o = self._sync(session)
                if o.kind != "staged":
                    self._drop(session.name, f"late join: could not send v{self.committed_version}: {o.reason}")

    def _session_from(self, hello, conn):
        """A session from a hello, or WeightError when its layout or tensors do not match."""
        for field in ("worker_id", "rank", "layout", "tensors", "address", "descriptor", "landing_bytes"):
            if field not in hello:
                raise WeightError(f"hello without {field}")
        worker_id, rank = hello["worker_id"], hello["rank"]
        if not isinstance(worker_id, str) or not worker_id or "/" in worker_id:
            raise WeightError(f"worker_id must be a non-empty string without '/', got {worker_id!r}")
        layout = Layout.from_dict(hello["layout"])
        if not isinstance(rank, int) or not 0 <= rank < layout.ep_size:
            raise WeightError(f"rank {rank!r} is not in [0, {layout.ep_size})")
        if self.num_experts and layout.num_experts != self.num_experts:
            raise WeightError(f"layout has {layout.num_experts} experts, the published model {self.num_experts}")
        tensors = hello["tensors"]
        if not isinstance(tensors, dict):
            raise WeightError("tensors must map names to [dtype, shape]")
        mine = layout.experts[rank]
        expected = {s.name: [s.dtype, list(s.local_shape(mine))] for s in self.schema}
        missing, unknown = sorted(set(expected) - set(tensors)), sorted(set(tensors) - set(expected))
        if missing or unknown:
            raise WeightError(f"tensors do not match the model: missing {missing}, unknown {unknown}")
        for name, want in expected.items():
            if list(tensors[name]) != want:
                raise WeightError(f"{name}: the receiver expects {tensors[name]}, under its layout it gets {want} "
                                  f"(rank {rank} owns experts {list(mine)})")
        needed = landing_plan(self.schema, layout, rank)[1]
        if not isinstance(hello["landing_bytes"], int) or hello["landing_bytes"] < needed:
            raise WeightError(f"landing area of {hello['landing_bytes']} bytes, {needed} needed")
        return _Session(worker_id, rank, layout, conn, hello.get("pid"))

    def _check_peers(self, session):
        if session.name in self._sessions:
            raise WeightError(f"{session.name} is already connected")
        for other in self._sessions.values():
            if other.worker_id == session.worker_id and other.layout != session.layout:
                raise WeightError(f"its layout {session.layout.to_dict()} differs from that of {other.name} "
                                  f"({other.layout.to_dict()}); every rank of a worker must declare the same")

    # ---- teardown ----

    def close(self):
        """Stops the listener and closes every session (receivers see the publisher close)."""
        if self._closing.is_set():
            return
        self._closing.set()
        self._listener.close()
        self._accept_thread.join(timeout=5)
        for t in list(self._joiners):
            t.join(timeout=self.control_timeout_s + 1)
        with self._lock:
            for s in list(self._sessions.values()):
                try:
                    wire.send(s.conn, {"op": "closing"}, "weights.close", s.name)
                except WeightError:
                    pass
                s.close()
            self._sessions.clear()
        if self._session_pool is not None:
            self._session_pool.shutdown(wait=False)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


__all__ = ["PublishResult", "TensorSpec", "WeightPublisher"]
