"""A rollout worker rank's side of weight publication (docs/RL.md section 5).

:class:`WeightSubscriber` dials the trainer's :class:`~.publisher.WeightPublisher` with
this rank's EP layout and the tensors its model has (names, dtypes, local shapes); a mismatch is
refused on both sides before any bytes move. It then owns a landing area registered on an RMA
link of its own and a service thread that follows the publisher's two-phase protocol:

- ``stage``: check the manifest (this layout, this rank's tensors covered exactly once, from the
  rows of the experts this rank owns; a version above the last committed), say ready, take the
  chunks off the fabric (immediates tagged with the transfer, so a write of an earlier transfer
  is never mistaken for one of this), copying each out of the landing area into the version's
  own memory and checksumming it as it lands; the publisher's seal (every chunk's CRC-32, sent
  after its last write) is compared with them, and the vote is staged or failed;
- ``commit``: the verified tensors (views of the version's own memory, no copy) become the
  committed version; only now is it handed out (``poll``/``wait_committed``), so a worker never
  sees a torn or unverified version;
- ``poisoned``: discard the staged bytes; the publisher resends its last committed version.

The worker applies what ``poll()`` (non-blocking) or ``wait_committed(version, timeout_s)``
returns between decode steps (quiesce: pause, apply, resume). The ranks of one EP worker each
have a subscriber; they should apply the same version at the same step (e.g. the smallest
version every rank has committed, agreed over the worker's own group).

If the publisher goes away (closed, dropped this receiver, or died), the last committed version
stays available (``latest()``), ``error`` says what happened, and ``wait_committed`` raises it.
"""

import concurrent.futures
import dataclasses
import logging
import os
import threading
import time
from typing import List, Optional, Tuple

import torch

from . import wire
from .manifest import (ALIGN, DTYPES, Layout, TensorSpec, WeightError, WeightManifest, checksum,
                       dtype_name, landing_plan)

log = logging.getLogger("proxyep.rl.weights")

_SLICE_MS = 100  # how long one fabric wait runs before the control channel is checked again
_CRC_THREADS = min(8, os.cpu_count() or 1)


class CommittedWeights(tuple):
    """(version, {name: tensor}) of a committed version: this rank's tensors (dense whole,
    expert tensors as the rows of the experts it owns). Unpacks as ``version, state``."""

    def __new__(cls, version, tensors):
        return super().__new__(cls, (version, tensors))

    @property
    def version(self):
        return self[0]

    @property
    def tensors(self):
        return self[1]


@dataclasses.dataclass
class SubscriberStats:
    transfers: int = 0  # stage attempts that reached the fabric
    chunks_verified: int = 0  # chunks whose CRC matched
    bytes_received: int = 0  # bytes of verified transfers
    stale_writes: int = 0  # writes of earlier transfers that arrived during a later one
    poisoned: int = 0
    refused_manifests: int = 0
    prepare_seconds: float = 0.0  # faulting in the next version's memory, off the transfer's path


def expected_tensors(named):
    """{name: (dtype name, shape)} of a model's local parameters (``model.named_parameters()``
    or a {name: tensor} dict): what a subscriber says it expects."""
    items = named.items() if isinstance(named, dict) else named
    return {name: (dtype_name(t.dtype), tuple(t.shape)) for name, t in items}


class WeightSubscriber:
    """Joins the publisher at ``address`` (host, port) with ``authkey`` as rank ``rank`` of
    worker ``worker_id`` under ``layout`` (a Layout), expecting ``tensors`` ({name: (dtype name,
    local shape)}, :func:`expected_tensors`). Raises WeightError when the publisher refuses
    (the reason included) or cannot be reached within ``connect_timeout_s``.

    ``stage_timeout_s``: how long a transfer may take once staged; ``control_timeout_s``: each
    control message. The link's fabric options come from the parameter registry
    (PROXYEP_FABRIC_PROVIDER, PROXYEP_FABRIC_REORDER, ...)."""

    def __init__(self, address, authkey, worker_id, rank, layout: Layout, tensors, connect_timeout_s=30.0,
                 control_timeout_s=10.0, stage_timeout_s=60.0):
        from proxyep import _proxyep

        layout.validate()
        if not isinstance(rank, int) or not 0 <= rank < layout.ep_size:
            raise WeightError(f"weights.join: rank {rank!r} is not in [0, {layout.ep_size})")
        self.address, self.worker_id, self.rank, self.layout = tuple(address), worker_id, rank, layout
        self.name = f"{worker_id}/{rank}"
        self.peer = f"the publisher at {address[0]}:{address[1]}"
        self.control_timeout_s, self.stage_timeout_s = control_timeout_s, stage_timeout_s
        self.expected = {n: (d, tuple(s)) for n, (d, s) in tensors.items()}
        for name, (dtype, shape) in self.expected.items():
            if dtype not in DTYPES:
                raise WeightError(f"weights.join: {name}: unsupported dtype {dtype!r}")
        self.stats = SubscriberStats()
        self.events: List[Tuple[str, int, str]] = []  # (event, version, detail): poisoned, refused, ...
        self.error: Optional[str] = None  # why the publisher is gone, once it is
        self._cond = threading.Condition()
        self._committed: Optional[CommittedWeights] = None
        self._handed = None  # the last version poll()/wait_committed returned
        self._staged = None  # (version, manifest, its verified bytes) awaiting commit
        self._closing = False
        self._spare = None  # the next version's memory, faulted in while idle (_prepare)
        self._prepared = threading.Event()
        # Checksums of a transfer's chunks in parallel (zlib releases the GIL).
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=_CRC_THREADS, thread_name_prefix="weights-crc")

        # The landing area: this rank's tensors, each 64-byte aligned (landing_plan, which needs
        # the schema's order; the sum of aligned sizes does not depend on it).
        landing_bytes = max(ALIGN, sum(_aligned(_nbytes(d, s)) for d, s in self.expected.values()))
        self._rx = _proxyep.RmaReceiver(landing_bytes, self.peer)
        self._landing = _to_tensor(self._rx.landing())
        self._conn = wire.dial(self.address, authkey, connect_timeout_s)
        try:
            self._join(landing_bytes)
        except BaseException:
            self._conn.close()
            self._rx.close()
            raise
        self._prepare()
        self._thread = threading.Thread(target=self._serve, name=f"weights-{self.name}", daemon=True)
        self._thread.start()

    # ---- the worker's calls ----

    @property
    def committed_version(self):
        with self._cond:
            return None if self._committed is None else self._committed.version

    def latest(self):
        """The last committed version (CommittedWeights), or None."""
        with self._cond:
            return self._committed

    def poll(self):
        """The last committed version if it is newer than the last one handed out, else None.
        Never blocks (apply it between decode steps)."""
        with self._cond:
            if self._committed is None or self._committed.version == self._handed:
                return None
            self._handed = self._committed.version
            return self._committed

    def wait_committed(self, version, timeout_s):
        """Waits until a version >= ``version`` is committed here and returns the last committed
        one. WeightError when ``timeout_s`` passes or the publisher is gone first."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._committed is None or self._committed.version < version:
                if self.error is not None:
                    raise WeightError(f"weights.wait: v{version} not committed on {self.name} "
                                      f"(last committed: v{self._version()}): {self.error}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise WeightError(f"weights.wait: v{version} not committed on {self.name} within {timeout_s} s "
                                      f"(last committed: v{self._version()}; {self.peer})")
                self._cond.wait(left)
            self._handed = self._committed.version
            return self._committed

    def _version(self):
        return None if self._committed is None else self._committed.version

    def link_stats(self):
        """The RMA link: provider, writes received, and the reorder shim's counters (None when
        the shim is off)."""
        return {"provider": self._rx.provider, "received": self._rx.received, "reorder": self._rx.reorder_stats()}

    def close(self):
        """Leaves: the publisher drops this receiver at its next message."""
        self._closing = True
        try:
            self._conn.close()
        except OSError:
            pass
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=self.stage_timeout_s + self.control_timeout_s)
        self._rx.close()
        self._pool.shutdown(wait=False)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- joining ----

    def _join(self, landing_bytes):
        phase = "weights.join"
        wire.send(self._conn, {"op": "hello", "worker_id": self.worker_id, "rank": self.rank,
                               "layout": self.layout.to_dict(), "pid": os.getpid(),
                               "tensors": {n: [d, list(s)] for n, (d, s) in self.expected.items()},
                               "address": self._rx.address().hex(), "descriptor": self._rx.descriptor().hex(),
                               "landing_bytes": landing_bytes}, phase, self.peer)
        reply = wire.recv(self._conn, self.control_timeout_s, phase, self.peer)
        if reply["op"] == "refused":
            raise WeightError(f"{phase}: {self.peer} refused {self.name}: {reply.get('error')}")
        if reply["op"] != "welcome":
            raise WeightError(f"{phase}: unexpected {reply['op']!r} from {self.peer}")
        try:
            self.schema = [TensorSpec.from_dict(d) for d in reply["schema"]]
            self._check_schema()
        except WeightError as e:
            wire.send(self._conn, {"op": "refused", "error": str(e)}, phase, self.peer)
            raise WeightError(f"{phase}: {self.name} refuses {self.peer}'s model: {e}") from None
        self._offsets = landing_plan(self.schema, self.layout, self.rank)[0]
        self._rx.connect(bytes.fromhex(reply["address"]))
        wire.send(self._conn, {"op": "joined"}, phase, self.peer)
        log.info("weights: %s joined %s (committed there: %s)", self.name, self.peer, reply.get("committed"))

    def _check_schema(self):
        mine = self.layout.experts[self.rank]
        names = [s.name for s in self.schema]
        if set(names) != set(self.expected):
            raise WeightError(f"the model's tensors {sorted(names)} are not this rank's {sorted(self.expected)}")
        for s in self.schema:
            want = (s.dtype, tuple(s.local_shape(mine)))
            if self.expected[s.name] != want:
                raise WeightError(f"{s.name}: this rank has {self.expected[s.name]}, the publisher sends {want}")

    # ---- the service thread ----

    def _serve(self):
        try:
            while not self._closing:
                if not self._conn.poll(0.5):  # idle: no publish in progress
                    continue
                msg = wire.recv(self._conn, self.control_timeout_s, "weights.subscribe", self.peer)
                op = msg["op"]
                if op == "stage":
                    self._stage(msg)
                elif op == "commit":
                    self._commit(msg)
                elif op == "seal":
                    pass  # the seal of a transfer this rank already voted down: it crossed the vote
                elif op == "poisoned":
                    self._staged = None
                    self.stats.poisoned += 1
                    self.events.append(("poisoned", msg.get("version"), msg.get("reason", "")))
                    log.warning("weights: %s poisoned at v%s (%s); waiting for the last committed version",
                                self.name, msg.get("version"), msg.get("reason"))
                elif op == "dropped":
                    raise WeightError(f"weights.subscribe: {self.peer} dropped {self.name}: {msg.get('reason')}")
                elif op == "closing":
                    raise WeightError(f"weights.subscribe: {self.peer} closed")
                else:
                    raise WeightError(f"weights.subscribe: unexpected message {op!r} from {self.peer}")
        except Exception as e:  # noqa: BLE001 - the worker must learn why the service stopped
            if self._closing:
                self._fail(f"weights.subscribe: {self.name} was closed")
            elif isinstance(e, (WeightError, RuntimeError)):
                self._fail(str(e))
            else:
                self._fail(f"weights.subscribe: {type(e).__name__}: {e}")

    def _fail(self, message):
        self._staged = None  # whatever was staged is never handed out
        with self._cond:
            if self.error is None:
                self.error = message
            self._cond.notify_all()
        log.warning("weights: %s: %s", self.name, message)

    def _stage(self, msg):
        phase = "weights.stage"
        self._staged = None
        version = msg.get("version")
        try:
            manifest = WeightManifest.from_json(msg.get("manifest"))
            if manifest.version != version:
                raise WeightError(f"manifest v{manifest.version} in a stage message for v{version}")
            committed = self.committed_version
            if committed is not None and version <= committed:
                raise WeightError(f"v{version} is not above this rank's committed v{committed} (stale or duplicate)")
            manifest.check_for(self.rank, self.schema, self.layout, self._landing.numel())
            tag, writes_before = msg["tag"], msg["writes_before"]
            if not isinstance(tag, int) or not 0 <= tag < 256 or not isinstance(writes_before, int):
                raise WeightError(f"bad tag {tag!r} or writes_before {writes_before!r}")
        except (WeightError, KeyError, TypeError) as e:
            self.stats.refused_manifests += 1
            self.events.append(("refused", version, str(e)))
            wire.send(self._conn, {"op": "refused", "error": f"{self.name}: {e}"}, phase, self.peer)
            return
        wire.send(self._conn, {"op": "ready", "version": version}, phase, self.peer)
        self.stats.transfers += 1
        self._staging_version = version
        chunks = manifest.rank_chunks(self.rank)
        # The version's own memory, filled chunk by chunk as they land (copied out of the landing
        # area and checksummed there, in one pass while the transfer goes on): what commit hands
        # out, never written again, so the commit itself copies nothing.
        out, self._spare = self._spare, None
        if out is None:
            out = torch.empty(self._landing.numel(), dtype=torch.uint8)
        # Writes of an earlier, failed transfer may still land on these bytes until all of them
        # are in: take chunks as they arrive only when none is outstanding, else at the end.
        early = self._rx.received == writes_before
        taken, sealed = {}, []
        error = self._receive(chunks, tag, writes_before + len(chunks), out, taken if early else None, sealed)
        if error is None and not sealed:
            error = self._await_seal(version, sealed)
        if error is None:
            error = self._verify(manifest, chunks, out, taken, sealed[0])
        if error is not None:
            self._spare = out  # never handed out: the next transfer may fill it
            self.events.append(("stage_failed", version, error))
            wire.send(self._conn, {"op": "stage_failed", "version": version, "error": f"{self.name}: {error}"},
                      phase, self.peer)
            return
        self._staged = (version, manifest, out)
        self.stats.bytes_received += sum(c.length for c in chunks)
        wire.send(self._conn, {"op": "staged", "version": version}, phase, self.peer)

    def _take(self, out, c):
        """Copies chunk ``c`` out of the landing area into ``out`` and checksums the copy (what
        will be handed out, read while still in cache)."""
        out[c.dst:c.dst + c.length].copy_(self._landing[c.dst:c.dst + c.length])
        return checksum(memoryview(out.numpy())[c.dst:c.dst + c.length])

    def _seal(self, msg, version, count, sealed):
        """Records the publisher's seal (the chunks' CRC-32s, in transfer order); None or why
        it is not one."""
        crcs = msg.get("crcs")
        if msg.get("op") != "seal" or msg.get("version") != version:
            return f"expected the seal of v{version}, got {msg.get('op')!r} for v{msg.get('version')}"
        if not isinstance(crcs, list) or len(crcs) != count or not all(isinstance(c, int) for c in crcs):
            return f"the seal of v{version} does not carry {count} checksums"
        sealed.append(crcs)
        return None

    def _await_seal(self, version, sealed):
        """Every chunk is in; the seal is still on its way (it follows the last write)."""
        msg = wire.recv(self._conn, self.stage_timeout_s + self.control_timeout_s, "weights.stage", self.peer)
        if msg["op"] in ("dropped", "closing"):
            raise WeightError(f"weights.stage: {self.peer} sent {msg['op']} ({msg.get('reason', '')}) instead of "
                              f"the seal of v{version}")
        return self._seal(msg, version, len(self._staging_chunks), sealed)

    def _receive(self, chunks, tag, total, out, taken, sealed):
        """Takes the transfer's writes off the fabric: None when every chunk arrived once, else
        why not. With ``taken`` (a dict), each chunk is copied out and checksummed on the pool as
        soon as it has landed ({index: future}). The publisher's seal may come meanwhile (into
        ``sealed``). Raises PeerGone when the publisher's connection ends meanwhile."""
        seen = bytearray(len(chunks))
        self._staging_chunks = chunks
        deadline = time.monotonic() + self.stage_timeout_s
        while True:
            for imm in self._rx.wait_some(total, _SLICE_MS, "weights.stage"):
                if imm >> 24 != tag:
                    self.stats.stale_writes += 1
                    continue
                index = imm & 0xFFFFFF
                if index >= len(chunks) or seen[index]:
                    return f"chunk {index} arrived twice or is not in the manifest ({len(chunks)} chunks)"
                seen[index] = 1
                if taken is not None:
                    taken[index] = self._pool.submit(self._take, out, chunks[index])
            if self._rx.received >= total:
                break
            if self._conn.poll(0):  # the publisher spoke mid-transfer: only its seal may come
                msg = wire.recv(self._conn, self.control_timeout_s, "weights.stage", self.peer)
                if sealed or msg.get("op") != "seal":
                    return f"the publisher sent {msg.get('op')!r} in the middle of a transfer"
                error = self._seal(msg, self._staging_version, len(chunks), sealed)
                if error is not None:
                    return error
            if time.monotonic() >= deadline:
                return (f"{sum(seen)} of {len(chunks)} chunks arrived within {self.stage_timeout_s} s "
                        f"({self._rx.received} of {total} writes on the link)")
        missing = len(chunks) - sum(seen)
        return None if missing == 0 else f"{missing} of {len(chunks)} chunks never arrived"

    def _verify(self, manifest, chunks, out, taken, crcs):
        """None when every chunk's CRC-32 matches the publisher's seal (``taken``: {index:
        future} of the chunks taken as they arrived; the rest are taken now), else which one
        does not."""
        rest = {i: self._pool.submit(self._take, out, c) for i, c in enumerate(chunks) if i not in taken}
        for i, c in enumerate(chunks):
            crc = (taken[i] if i in taken else rest[i]).result()
            if crc != crcs[i] & 0xFFFFFFFF:
                name = self._tensor_at(manifest, c.dst)
                return (f"checksum mismatch in chunk {i} ({name}, landing bytes [{c.dst}, +{c.length})): "
                        f"crc32 {crc:#010x}, sealed {crcs[i] & 0xFFFFFFFF:#010x}")
            self.stats.chunks_verified += 1
        return None

    def _tensor_at(self, manifest, dst):
        for spec, per_rank in zip(manifest.tensors, manifest.chunks):
            if any(c.dst <= dst < c.dst + c.length for c in per_rank[self.rank]):
                return spec.name
        return "?"

    def _commit(self, msg):
        version = msg.get("version")
        if self._staged is None or self._staged[0] != version:
            staged = None if self._staged is None else self._staged[0]
            wire.send(self._conn, {"op": "commit_refused", "error": f"{self.name}: commit v{version}, staged {staged}"},
                      "weights.commit", self.peer)
            return
        _, manifest, out = self._staged
        tensors = {}
        mine = self.layout.experts[self.rank]
        for spec, start in zip(manifest.tensors, self._offsets):
            # check_for proved the chunks cover exactly [start, start + local bytes); ``out`` is
            # this version's alone (views, no copy), verified chunk by chunk.
            n = _nbytes(spec.dtype, spec.local_shape(mine))
            tensors[spec.name] = out[start:start + n].view(DTYPES[spec.dtype]).reshape(spec.local_shape(mine))
        self._staged = None
        with self._cond:
            self._committed = CommittedWeights(version, tensors)
            self._cond.notify_all()
        wire.send(self._conn, {"op": "committed", "version": version}, "weights.commit", self.peer)
        self._prepare()

    def _prepare(self):
        """Faults in the memory of the next version now, while no transfer runs: filling fresh
        pages while chunks land costs several times more here (the page faults contend with the
        fabric's copies into this process). The worker's committed versions are never reused."""
        self._prepared.clear()
        try:
            if self._spare is None:
                t0 = time.perf_counter()
                self._spare = torch.zeros(self._landing.numel(), dtype=torch.uint8)
                self.stats.prepare_seconds += time.perf_counter() - t0
        finally:
            self._prepared.set()

    def wait_prepared(self, timeout_s):
        """True once the memory of the next version is ready (after a commit it is prepared in
        the background); a benchmark waits for it before timing something else."""
        return self._prepared.wait(timeout_s)


def _nbytes(dtype, shape):
    n = torch.empty((), dtype=DTYPES[dtype]).element_size()
    for d in shape:
        n *= d
    return n


def _aligned(n):
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _to_tensor(capsule):
    from proxyep import _tensors
    return _tensors.tensor(capsule)


__all__ = ["CommittedWeights", "SubscriberStats", "WeightSubscriber", "expected_tensors"]
