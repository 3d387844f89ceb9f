"""The publisher's packing pipeline: a version's tensors are copied into the registered source
a piece at a time, in source order, and every chunk is checksummed as soon as its last byte is
packed (its bytes are still in cache), on a thread of its own. Senders wait for a chunk's
checksum, not for the whole model: the first writes leave while later pieces are still being
packed, and each byte is read once for the copy and once for its CRC-32, never again.
"""

import threading
import time
import zlib

import torch

from .manifest import WeightError


class SourcePacker:
    """Packs ``tensors`` (contiguous CPU, schema order) into ``source`` (flat uint8) at
    ``offsets``, ``piece_bytes`` at a time, and checksums each range of ``ranges`` ({(src,
    length)}: the chunks some receiver needs) once the packing has passed its end. ``run()`` is
    the packing thread's body; ``crc()`` is what senders wait on."""

    def __init__(self, source, offsets, tensors, ranges, piece_bytes, names=None):
        self._source, self._offsets, self._tensors = source, offsets, tensors
        # The tensors' names (schema order), for an error naming the one that failed.
        self._names = names if names is not None else [f"tensor {i}" for i in range(len(tensors))]
        self._pending = sorted(ranges, key=lambda r: r[0] + r[1])  # by end: checksummed in this order
        self._piece = max(1, piece_bytes)
        self._cond = threading.Condition()
        self.crcs = {}
        self.error = None
        self.done = False
        self.seconds = 0.0

    @classmethod
    def packed(cls, crcs):
        """A packer whose work is done: the source already holds the version (recoveries and
        late joiners are sent the last committed one) and ``crcs`` are its chunks' checksums."""
        p = cls(None, [], [], (), 1)
        p.crcs, p.done = dict(crcs), True
        return p

    def run(self):
        t0 = time.perf_counter()
        try:
            flat = self._source
            view = memoryview(flat.numpy())
            k = 0
            for offset, tensor, name in zip(self._offsets, self._tensors, self._names):
                try:
                    raw = tensor.reshape(-1).view(torch.uint8)
                except Exception as e:  # noqa: BLE001 - named, then handed to the senders below
                    raise WeightError(f"packing {name}: {type(e).__name__}: {e}") from e
                n = raw.numel()
                for start in range(0, n, self._piece):
                    end = min(n, start + self._piece)
                    flat[offset + start:offset + end].copy_(raw[start:end])  # releases the GIL
                    packed_to = offset + end
                    new = {}
                    while k < len(self._pending) and sum(self._pending[k]) <= packed_to:
                        src, length = self._pending[k]
                        new[(src, length)] = zlib.crc32(view[src:src + length]) & 0xFFFFFFFF
                        k += 1
                    if new:
                        with self._cond:
                            self.crcs.update(new)
                            self._cond.notify_all()
            if k != len(self._pending):  # a range outside every tensor: a planning defect
                raise WeightError(f"weights.publish: {len(self._pending) - k} chunks lie outside the model")
        except BaseException as e:  # noqa: BLE001 - the senders must learn it, not hang
            with self._cond:
                self.error = e
        finally:
            self.seconds = time.perf_counter() - t0
            with self._cond:
                self.done = True
                self._cond.notify_all()

    def ready(self, key):
        """The CRC-32 of range ``key`` if it is packed and checksummed, else None (no wait)."""
        return self.crcs.get(key)

    def crc(self, key, deadline, phase, peer):
        """The CRC-32 of range ``key`` = (src, length), waiting until it is packed; WeightError
        naming ``phase`` and ``peer`` when packing failed or ``deadline`` (monotonic) passes."""
        with self._cond:
            while True:
                value = self.crcs.get(key)
                if value is not None:
                    return value
                if self.error is not None:
                    raise WeightError(f"{phase}: packing the source for {peer} failed: {self.error}")
                if self.done:
                    raise WeightError(f"{phase}: chunk {key} for {peer} is not in the packed source")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise WeightError(f"{phase}: chunk {key} for {peer} was not packed in time")
                self._cond.wait(left)

    def wait(self, timeout_s):
        """True once packing ended (check ``error``), False when ``timeout_s`` passed first."""
        with self._cond:
            return self._cond.wait_for(lambda: self.done, timeout_s)
