"""What a weight publication moves, and where (docs/RL.md section 5): the model's tensors
(:class:`TensorSpec`), the rollout side's EP layout (:class:`Layout`: which global experts each
rank owns), and per published version the :class:`WeightManifest`: for every tensor and every
destination rank the byte ranges (chunks) it needs, each with its offset in the publisher's
source, its offset in the destination's landing area and its CRC-32.

A rank's landing area is laid out by :func:`landing_plan` from the schema and the layout alone,
so both ends compute it without talking: tensors in schema order, each at a 64-byte aligned
offset, a dense tensor whole, an expert tensor as the rows of the experts the rank owns, in the
order the layout lists them. The source is the publisher's flat copy of the full model, tensors
in schema order at :func:`source_offsets`, expert tensors with all ``num_experts`` rows.

Manifests travel as JSON (``to_json``/``from_json``); ``validate`` refuses a malformed one with a
:class:`WeightError` that says what is wrong, and ``check_for(rank, ...)`` checks that the chunks
for one rank cover exactly that rank's tensors in its landing area (every byte once, from the
rows of the experts it owns), so a wrong or torn manifest is refused before bytes are trusted.
"""

import dataclasses
import json
import math
import zlib
from typing import Dict, List, Optional, Sequence

import torch

from ..coordinator.protocol import RLError

FORMAT = "proxyep.weights/1"
ALIGN = 64  # landing offsets of tensors (cache lines; torch views need only the element size)

#: dtypes a published tensor may have, by the name the manifest uses.
DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float64": torch.float64,
    "int64": torch.int64,
    "int32": torch.int32,
    "uint8": torch.uint8,
}
_NAMES = {v: k for k, v in DTYPES.items()}
KINDS = ("dense", "expert")


class WeightError(RLError):
    """A refused or failed weight operation (bad input, mismatching layout, malformed manifest,
    stale version, a failed or timed-out transfer); the message names the phase and the peer."""


def dtype_name(dtype):
    try:
        return _NAMES[dtype]
    except KeyError:
        raise WeightError(f"dtype {dtype} cannot be published (supported: {sorted(DTYPES)})") from None


def _int(value, what, minimum=0):
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise WeightError(f"{what} must be an integer >= {minimum}, got {value!r}")
    return value


def checksum(data):
    """CRC-32 (zlib) of a bytes-like object (zlib releases the GIL on large buffers)."""
    return zlib.crc32(data) & 0xFFFFFFFF


def _align(n):
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """One published tensor: ``shape`` is the full model's (an expert tensor's first dimension
    is the global expert count)."""
    name: str
    dtype: str
    shape: tuple
    kind: str = "dense"

    def validate(self):
        if not isinstance(self.name, str) or not self.name:
            raise WeightError(f"tensor name must be a non-empty string, got {self.name!r}")
        if self.dtype not in DTYPES:
            raise WeightError(f"{self.name}: unsupported dtype {self.dtype!r} (supported: {sorted(DTYPES)})")
        if self.kind not in KINDS:
            raise WeightError(f"{self.name}: kind must be one of {KINDS}, got {self.kind!r}")
        if not isinstance(self.shape, tuple) or not self.shape:
            raise WeightError(f"{self.name}: shape must be a non-empty tuple, got {self.shape!r}")
        for d in self.shape:
            _int(d, f"{self.name}: dimension", 1)
        return self

    @property
    def itemsize(self):
        return torch.empty((), dtype=DTYPES[self.dtype]).element_size()

    @property
    def nbytes(self):
        return math.prod(self.shape) * self.itemsize

    @property
    def row_bytes(self):
        """Bytes of one expert row (an expert tensor's slice [e])."""
        return math.prod(self.shape[1:]) * self.itemsize

    def local_shape(self, experts):
        """The shape on a rank that owns ``experts`` (dense: the full shape)."""
        return self.shape if self.kind == "dense" else (len(experts),) + self.shape[1:]

    def to_dict(self):
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape), "kind": self.kind}

    @classmethod
    def from_dict(cls, d):
        if not isinstance(d, dict) or set(d) != {"name", "dtype", "shape", "kind"}:
            raise WeightError(f"tensor spec must have exactly name, dtype, shape, kind; got {d!r}")
        if not isinstance(d["shape"], list):
            raise WeightError(f"tensor spec {d.get('name')!r}: shape must be a list, got {d['shape']!r}")
        return cls(d["name"], d["dtype"], tuple(d["shape"]), d["kind"]).validate()


def validate_schema(specs: Sequence[TensorSpec]):
    """The schema's expert count (0 without expert tensors); refuses duplicates and expert
    tensors that disagree on it."""
    if not specs:
        raise WeightError("the schema has no tensors")
    names, experts = set(), set()
    for s in specs:
        if not isinstance(s, TensorSpec):
            raise WeightError(f"schema entries must be TensorSpec, got {type(s).__name__}")
        s.validate()
        if s.name in names:
            raise WeightError(f"tensor {s.name!r} appears twice in the schema")
        names.add(s.name)
        if s.kind == "expert":
            experts.add(s.shape[0])
    if len(experts) > 1:
        raise WeightError(f"expert tensors disagree on the expert count: {sorted(experts)}")
    return experts.pop() if experts else 0


def schema_of(dense_state, expert_rows):
    """The schema of a model state: ``dense_state`` {name: tensor}, ``expert_rows`` {name:
    [num_experts, ...]} (training.gather_ep_state's output), in that order."""
    specs = [TensorSpec(n, dtype_name(t.dtype), tuple(t.shape), "dense") for n, t in dense_state.items()]
    specs += [TensorSpec(n, dtype_name(t.dtype), tuple(t.shape), "expert") for n, t in expert_rows.items()]
    validate_schema(specs)
    return specs


def source_offsets(specs):
    """(offset of each tensor in the publisher's flat source, total bytes)."""
    offsets, total = [], 0
    for s in specs:
        offsets.append(total)
        total = _align(total + s.nbytes)
    return offsets, max(total, ALIGN)


@dataclasses.dataclass(frozen=True)
class Layout:
    """A rollout worker's EP layout: ``experts[r]`` lists the global experts rank r owns, in the
    order of its local expert rows."""
    ep_size: int
    num_experts: int
    experts: tuple

    @classmethod
    def contiguous(cls, ep_size, num_experts):
        """MoELayer's layout: rank r owns experts [r * E/ep_size, (r + 1) * E/ep_size)."""
        _int(ep_size, "ep_size", 1)
        _int(num_experts, "num_experts", 1)
        if num_experts % ep_size:
            raise WeightError(f"num_experts {num_experts} is not a multiple of ep_size {ep_size}")
        k = num_experts // ep_size
        return cls(ep_size, num_experts, tuple(tuple(range(r * k, (r + 1) * k)) for r in range(ep_size))).validate()

    def validate(self):
        _int(self.ep_size, "layout ep_size", 1)
        _int(self.num_experts, "layout num_experts", 0)
        if not isinstance(self.experts, tuple) or len(self.experts) != self.ep_size:
            raise WeightError(f"layout: experts must list the experts of each of the {self.ep_size} ranks, "
                              f"got {self.experts!r}")
        owned = set()
        for r, mine in enumerate(self.experts):
            if not isinstance(mine, tuple):
                raise WeightError(f"layout: rank {r}'s experts must be a tuple, got {mine!r}")
            for e in mine:
                _int(e, f"layout: rank {r}'s expert id", 0)
                if e >= self.num_experts:
                    raise WeightError(f"layout: rank {r} owns expert {e}, but there are {self.num_experts}")
            if len(set(mine)) != len(mine):
                raise WeightError(f"layout: rank {r} lists an expert twice: {list(mine)}")
            owned.update(mine)
        if self.num_experts and owned != set(range(self.num_experts)):
            missing = sorted(set(range(self.num_experts)) - owned)
            raise WeightError(f"layout: no rank owns experts {missing}")
        return self

    def to_dict(self):
        return {"ep_size": self.ep_size, "num_experts": self.num_experts, "experts": [list(e) for e in self.experts]}

    @classmethod
    def from_dict(cls, d):
        if not isinstance(d, dict) or set(d) != {"ep_size", "num_experts", "experts"}:
            raise WeightError(f"layout must have exactly ep_size, num_experts, experts; got {d!r}")
        if not isinstance(d["experts"], list) or not all(isinstance(e, list) for e in d["experts"]):
            raise WeightError(f"layout: experts must be a list of lists, got {d['experts']!r}")
        return cls(d["ep_size"], d["num_experts"], tuple(tuple(e) for e in d["experts"])).validate()


def landing_plan(specs, layout, rank):
    """(offset of each tensor in rank ``rank``'s landing area, landing bytes)."""
    offsets, total = [], 0
    for s in specs:
        offsets.append(total)
        n = s.nbytes if s.kind == "dense" else len(layout.experts[rank]) * s.row_bytes
        total = _align(total + n)
    return offsets, max(total, ALIGN)


@dataclasses.dataclass(frozen=True)
class Chunk:
    src: int  # offset in the publisher's flat source
    dst: int  # offset in the destination rank's landing area
    length: int
    crc: int

    def to_list(self):
        return [self.src, self.dst, self.length, self.crc]


@dataclasses.dataclass
class WeightManifest:
    """One published version for one layout. ``chunks[tensor index][rank]``: the chunks rank
    ``rank`` needs of that tensor; the immediate of chunk ``i`` of a rank's transfer (counting
    over its tensors in order) carries ``i``. ``base``: the version a delta applies to (None: a
    full version; only full versions are published today)."""
    version: int
    layout: Layout
    tensors: List[TensorSpec]
    chunks: List[List[List[Chunk]]]
    base: Optional[int] = None
    checksum: str = "crc32"

    def validate(self):
        _int(self.version, "manifest version", 0)
        if self.base is not None:
            raise WeightError(f"manifest v{self.version}: delta manifests (base {self.base}) are not supported")
        if self.checksum != "crc32":
            raise WeightError(f"manifest v{self.version}: unknown checksum {self.checksum!r}")
        if not isinstance(self.layout, Layout):
            raise WeightError("manifest layout must be a Layout")
        self.layout.validate()
        num_experts = validate_schema(self.tensors)
        if num_experts and num_experts != self.layout.num_experts:
            raise WeightError(f"manifest v{self.version}: expert tensors have {num_experts} experts, the layout "
                              f"{self.layout.num_experts}")
        if len(self.chunks) != len(self.tensors):
            raise WeightError(f"manifest v{self.version}: chunks for {len(self.chunks)} tensors, "
                              f"{len(self.tensors)} tensors")
        for spec, per_rank in zip(self.tensors, self.chunks):
            if len(per_rank) != self.layout.ep_size:
                raise WeightError(f"manifest v{self.version}: {spec.name} has chunks for {len(per_rank)} ranks, "
                                  f"the layout has {self.layout.ep_size}")
            for chunks in per_rank:
                for c in chunks:
                    for field in ("src", "dst", "crc"):
                        _int(getattr(c, field), f"{spec.name}: chunk {field}", 0)
                    _int(c.length, f"{spec.name}: chunk length", 1)
                    if c.crc > 0xFFFFFFFF:
                        raise WeightError(f"{spec.name}: chunk crc {c.crc} is not a CRC-32")
        return self

    def rank_chunks(self, rank):
        """Chunks for ``rank`` in transfer order (chunk i carries immediate i)."""
        return [c for per_rank in self.chunks for c in per_rank[rank]]

    def rank_bytes(self, rank):
        return sum(c.length for c in self.rank_chunks(rank))

    def check_for(self, rank, specs, layout, landing_bytes):
        """Refuses (WeightError) unless this manifest is for ``specs`` under ``layout`` and its
        chunks for ``rank`` fill exactly rank ``rank``'s tensors in a landing area of
        ``landing_bytes``: each tensor's landing range covered once, in order, from the source
        bytes of the rows the rank owns."""
        self.validate()
        where = f"manifest v{self.version} for rank {rank}"
        if [s.to_dict() for s in self.tensors] != [s.to_dict() for s in specs]:
            raise WeightError(f"{where}: its tensors are not the ones this rank expects")
        if self.layout != layout:
            raise WeightError(f"{where}: layout {self.layout.to_dict()} is not this worker's {layout.to_dict()}")
        if not 0 <= rank < layout.ep_size:
            raise WeightError(f"{where}: rank out of range (ep_size {layout.ep_size})")
        dst_offsets, needed = landing_plan(specs, layout, rank)
        if needed > landing_bytes:
            raise WeightError(f"{where}: needs {needed} landing bytes, this rank has {landing_bytes}")
        src_offsets, _ = source_offsets(specs)
        for spec, per_rank, src0, dst0 in zip(specs, self.chunks, src_offsets, dst_offsets):
            expected = dst0
            for c in per_rank[rank]:
                if c.dst != expected:
                    raise WeightError(f"{where}: {spec.name} chunk at landing offset {c.dst}, expected {expected}")
                local = c.dst - dst0
                if spec.kind == "dense":
                    if c.src != src0 + local:
                        raise WeightError(f"{where}: {spec.name} chunk reads source offset {c.src}, expected "
                                          f"{src0 + local}")
                else:
                    # Every local row the chunk touches must come from the source row of the
                    # expert the rank owns there.
                    rb = spec.row_bytes
                    pos = local
                    while pos < local + c.length:
                        row, within = divmod(pos, rb)
                        if row >= len(layout.experts[rank]):
                            raise WeightError(f"{where}: {spec.name} chunk runs past the rank's "
                                              f"{len(layout.experts[rank])} expert rows")
                        want = src0 + layout.experts[rank][row] * rb + within
                        if c.src + (pos - local) != want:
                            raise WeightError(f"{where}: {spec.name} local row {row} would come from source offset "
                                              f"{c.src + (pos - local)}, not expert "
                                              f"{layout.experts[rank][row]}'s ({want})")
                        pos = (row + 1) * rb
                expected += c.length
            local_bytes = (spec.nbytes if spec.kind == "dense" else len(layout.experts[rank]) * spec.row_bytes)
            if expected != dst0 + local_bytes:
                raise WeightError(f"{where}: {spec.name} chunks cover {expected - dst0} of {local_bytes} bytes")
        if len(self.rank_chunks(rank)) >= 1 << 24:
            raise WeightError(f"{where}: more than 2**24 chunks")

    def to_json(self):
        return json.dumps({
            "format": FORMAT, "version": self.version, "base": self.base, "checksum": self.checksum,
            "layout": self.layout.to_dict(),
            "tensors": [dict(s.to_dict(), chunks=[[c.to_list() for c in chunks] for chunks in per_rank])
                        for s, per_rank in zip(self.tensors, self.chunks)],
        })

    @classmethod
    def from_json(cls, text):
        """Parses and validates; anything malformed raises WeightError saying what."""
        try:
            d = json.loads(text)
        except (TypeError, ValueError) as e:
            raise WeightError(f"manifest: not valid JSON: {e}") from None
        if not isinstance(d, dict):
            raise WeightError(f"manifest: expected a JSON object, got {type(d).__name__}")
        if d.get("format") != FORMAT:
            raise WeightError(f"manifest: format {d.get('format')!r}, expected {FORMAT!r}")
        missing = {"version", "base", "checksum", "layout", "tensors"} - set(d)
        if missing:
            raise WeightError(f"manifest: missing fields {sorted(missing)}")
        if not isinstance(d["tensors"], list):
            raise WeightError("manifest: tensors must be a list")
        specs, chunks = [], []
        for t in d["tensors"]:
            if not isinstance(t, dict) or "chunks" not in t:
                raise WeightError(f"manifest: tensor entry without chunks: {t!r:.200}")
            t = dict(t)
            raw = t.pop("chunks")
            spec = TensorSpec.from_dict(t)
            try:
                per_rank = [[Chunk(*c) for c in rank_chunks] for rank_chunks in raw]
                for rank_chunks in raw:
                    if any(not isinstance(c, list) or len(c) != 4 for c in rank_chunks):
                        raise TypeError("a chunk is [src, dst, length, crc]")
            except TypeError as e:
                raise WeightError(f"manifest: {spec.name}: malformed chunks: {e}") from None
            specs.append(spec)
            chunks.append(per_rank)
        return cls(d["version"], Layout.from_dict(d["layout"]), specs, chunks, d["base"], d["checksum"]).validate()


def checksums(source: memoryview, ranges, pool=None):
    """{(offset, length): CRC-32} of byte ranges of ``source``, computed on ``pool`` (a
    concurrent.futures executor; zlib releases the GIL, so threads run in parallel) when given."""
    ranges = list(dict.fromkeys(ranges))
    if pool is None:
        values = [checksum(source[o:o + n]) for o, n in ranges]
    else:
        values = list(pool.map(lambda r: checksum(source[r[0]:r[0] + r[1]]), ranges))
    return dict(zip(ranges, values))


def plan_ranges(specs, layout, chunk_bytes):
    """``[tensor][rank] -> [(src, dst, length)]``: every rank's chunks under ``layout``, at most
    ``chunk_bytes`` long, a chunk never spanning two local rows whose experts are not adjacent in
    the source. Depends on no version: a publisher plans once per layout and reuses it."""
    _int(chunk_bytes, "chunk_bytes", 1)
    layout.validate()
    num_experts = validate_schema(specs)
    if num_experts and num_experts != layout.num_experts:
        raise WeightError(f"the model has {num_experts} experts, the layout {layout.num_experts}")

    def split(src, dst, n):
        return [(src + off, dst + off, min(chunk_bytes, n - off)) for off in range(0, n, chunk_bytes)]

    src_offsets, _ = source_offsets(specs)
    dst_offsets = [landing_plan(specs, layout, rank)[0] for rank in range(layout.ep_size)]
    ranges = []
    for i, spec in enumerate(specs):
        per_rank = []
        for rank in range(layout.ep_size):
            dst0 = dst_offsets[rank][i]
            if spec.kind == "dense":
                per_rank.append(split(src_offsets[i], dst0, spec.nbytes))
                continue
            # Runs of local rows whose experts are consecutive in the source: one range each.
            rb, mine, rank_chunks, row = spec.row_bytes, layout.experts[rank], [], 0
            while row < len(mine):
                end = row + 1
                while end < len(mine) and mine[end] == mine[end - 1] + 1:
                    end += 1
                rank_chunks += split(src_offsets[i] + mine[row] * rb, dst0 + row * rb, (end - row) * rb)
                row = end
            per_rank.append(rank_chunks)
        ranges.append(per_rank)
    return ranges


def manifest_from(version, specs, layout, ranges, crc_of):
    """The manifest of ``version`` over ``ranges`` (plan_ranges'), each chunk's CRC-32 from
    ``crc_of[(src, length)]``; a mapping that answers 0 gives the template a pipelined
    publication sends first (its checksums follow the chunks in the seal message)."""
    chunks = [[[Chunk(src, dst, n, crc_of[(src, n)]) for src, dst, n in rank_chunks] for rank_chunks in per_rank]
              for per_rank in ranges]
    return WeightManifest(version, layout, list(specs), chunks).validate()


class _Zero(dict):
    def __missing__(self, key):
        return 0


NO_CHECKSUMS = _Zero()  # crc_of for a template manifest: every checksum 0, sent later


def plan_manifest(version, specs, layout, chunk_bytes, source: memoryview, crc_cache: Optional[Dict] = None,
                  pool=None):
    """The manifest of ``version`` for ``layout`` (plan_ranges' chunks), CRCs computed from
    ``source`` (the flat source buffer) on ``pool`` when given; ``crc_cache`` {(src, length):
    crc} shares them between layouts and ranks of one version (every rank gets the same dense
    chunks)."""
    ranges = plan_ranges(specs, layout, chunk_bytes)
    crc_cache = {} if crc_cache is None else crc_cache
    todo = [(src, n) for per_rank in ranges for chunks in per_rank for src, _, n in chunks
            if (src, n) not in crc_cache]
    crc_cache.update(checksums(source, todo, pool))
    return manifest_from(version, specs, layout, ranges, crc_cache)
