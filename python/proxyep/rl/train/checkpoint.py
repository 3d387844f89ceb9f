"""Checkpoints of an RL run (docs/RL.md section 6) in an object store (object_store.py: a
directory or S3): the policy's state_dict, the optimiser's, the experience buffer's snapshot and
the rollout pool's, each a separate object under ``ckpt-<step, 10 digits>/``, then a manifest
written LAST (``ckpt-<step>/manifest.json``: format, step, created, and per part its key, size,
sha256 and encoding).

A checkpoint exists only when its manifest does and every part matches the manifest's size and
checksum: a writer killed half-way (parts without a manifest), a truncated or corrupted part, or a
malformed manifest make :func:`latest_checkpoint` skip that step (logging why) and resume from
the previous complete one. Asking for such a step explicitly raises :class:`CheckpointError`
naming the key.

Encodings: ``bytes`` parts are stored as given; a value that JSON reproduces exactly (the
snapshots: dicts of lists, strings, numbers) is stored as JSON; anything else (state_dicts with
tensors, the optimiser's with tuples, floats and int keys) as ``tensors``: its structure as JSON
(dicts with any keys, OrderedDicts with a state_dict's ``_metadata``, lists, tuples, str, int,
float, bool, None, bytes) and its tensors (dense ``Tensor``/``Parameter``), both in one
``torch.save`` of ``{"tree": str, "tensors": [Tensor]}``; any other type is refused on save.

Loading runs no code from the store: torch parts are read with ``torch.load(weights_only=True)``
(tensors and plain containers only; with a torch that lacks it they are refused, never unpickled;
a TorchScript archive, which torch 1.13 would hand to torch.jit.load, is refused first), and the
structure is rebuilt from the JSON. A part holding anything else, e.g. a pickle that would call a
function, fails with a :class:`CheckpointError` naming its key. The checksums detect corruption,
not tampering (whoever can write the store can rewrite the manifest): :func:`latest_checkpoint`
still picks a tampered checkpoint whose checksums match, and loading it fails without running
code; one that still decodes can hold any values. ``torch``-encoded parts (a plain ``torch.save``
of the value, written before ``tensors``) are loaded the same safe way; one holding floats
outside tensors (an optimiser's state) is refused by torch 1.13's weights-only loader.
"""

import base64
import collections
import functools
import hashlib
import inspect
import io
import json
import logging
import re
import time
from dataclasses import dataclass
from typing import Dict, List, Optional

from .object_store import ObjectNotFound, ObjectStore, ObjectStoreError

FORMAT = 1
MANIFEST = "manifest.json"
_STEP_DIGITS = 10
_DIR = re.compile(r"^ckpt-(\d{%d})/" % _STEP_DIGITS)
_PART_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_EXTENSIONS = {"bytes": "bin", "json": "json", "tensors": "pt", "torch": "pt"}

log = logging.getLogger("proxyep.rl.checkpoint")


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete, corrupt or malformed; the message names the key."""


def step_prefix(step):
    return f"ckpt-{step:0{_STEP_DIGITS}d}/"


def _check_step(step):
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step < 10 ** _STEP_DIGITS:
        raise CheckpointError(f"step must be an int in [0, 10^{_STEP_DIGITS}), got {step!r}")


def _tree(value, tensors, seen, path):
    """JSON-able description of ``value``; its tensors are appended to ``tensors`` (each object
    once: ``seen`` maps id -> index, so a tensor that appears twice comes back as one object)."""
    import torch

    kind = type(value)
    if value is None or kind in (bool, int, float, str):
        return value
    if kind is bytes:
        return ["bytes", base64.b64encode(value).decode()]
    if kind is torch.Tensor or kind is torch.nn.Parameter:
        if value.layout != torch.strided or value.is_quantized:
            raise TypeError(f"{path}: only dense tensors can be saved, not {value.layout} "
                            f"{'quantized ' if value.is_quantized else ''}ones")
        if id(value) not in seen:
            seen[id(value)] = len(tensors)
            tensors.append(value)
        return ["tensor", seen[id(value)]]
    if kind is list or kind is tuple:
        return [kind.__name__, [_tree(v, tensors, seen, f"{path}[{i}]") for i, v in enumerate(value)]]
    if kind is dict and all(type(k) is str for k in value):
        return {k: _tree(v, tensors, seen, f"{path}[{k!r}]") for k, v in value.items()}
    if kind is dict or kind is collections.OrderedDict:
        items = [[_tree(k, tensors, seen, f"{path} key {k!r}"), _tree(v, tensors, seen, f"{path}[{k!r}]")]
                 for k, v in value.items()]
        if kind is dict:
            return ["dict", items]
        attrs = vars(value)
        if set(attrs) - {"_metadata"}:
            raise TypeError(f"{path}: an OrderedDict's attributes other than _metadata cannot be saved "
                            f"({sorted(set(attrs) - {'_metadata'})})")
        if "_metadata" in attrs:
            return ["odict", items, _tree(attrs["_metadata"], tensors, seen, f"{path}._metadata")]
        return ["odict", items]
    raise TypeError(f"{path}: {kind.__module__}.{kind.__qualname__} cannot be saved (tensors, dicts, "
                    f"OrderedDicts, lists, tuples, str, int, float, bool, None and bytes can)")


def _untree(node, tensors):
    """The value that ``_tree`` described (ValueError for anything it does not write)."""
    kind = type(node)
    if node is None or kind in (bool, int, float, str):
        return node
    if kind is dict:
        return {k: _untree(v, tensors) for k, v in node.items()}
    if kind is list and len(node) in (2, 3) and type(node[0]) is str:
        tag, body = node[0], node[1]
        if len(node) == 2 and tag == "tensor" and type(body) is int and 0 <= body < len(tensors):
            return tensors[body]
        if len(node) == 2 and tag == "bytes" and type(body) is str:
            return base64.b64decode(body, validate=True)
        if len(node) == 2 and tag in ("list", "tuple") and type(body) is list:
            items = [_untree(v, tensors) for v in body]
            return items if tag == "list" else tuple(items)
        if tag in ("dict", "odict") and type(body) is list and (len(node) == 2 or tag == "odict"):
            if not all(type(item) is list and len(item) == 2 for item in body):
                raise ValueError(f"malformed {tag} items")
            pairs = [(_untree(k, tensors), _untree(v, tensors)) for k, v in body]
            if tag == "dict":
                return dict(pairs)
            value = collections.OrderedDict(pairs)
            if len(node) == 3:
                value._metadata = _untree(node[2], tensors)
            return value
    raise ValueError(f"malformed structure node {json.dumps(node)[:80]}")


def encode(value):
    """(encoding, bytes) of a part's value (see the module's docstring)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "bytes", bytes(value)
    try:
        text = json.dumps(value, allow_nan=False, sort_keys=True)
        if json.loads(text) == value:
            return "json", text.encode()
    except (TypeError, ValueError, RecursionError):
        pass
    import torch

    tensors = []
    tree = json.dumps(_tree(value, tensors, {}, "value"), allow_nan=True)
    buf = io.BytesIO()
    torch.save({"tree": tree, "tensors": tensors}, buf)
    return "tensors", buf.getvalue()


@functools.lru_cache(maxsize=None)
def _torch_has_weights_only():
    import torch

    return "weights_only" in inspect.signature(torch.load).parameters


def _is_torchscript(data):
    """Whether torch.load would treat ``data`` as a TorchScript archive (torch's own test)."""
    import torch

    ser = torch.serialization
    if not hasattr(ser, "_is_torchscript_zip"):
        return False
    buf = io.BytesIO(data)
    if not ser._is_zipfile(buf):
        return False
    with ser._open_zipfile_reader(buf) as reader:
        return ser._is_torchscript_zip(reader)


def _safe_torch_load(data, what, legacy=False):
    """torch.load(weights_only=True) of ``data``: tensors and plain containers, never code;
    CheckpointError (naming ``what``) for anything else, or where torch cannot load that way."""
    import torch

    if not _torch_has_weights_only():
        raise CheckpointError(f"{what}: torch {torch.__version__} has no torch.load(weights_only=True), and "
                              f"loading a checkpoint without it would unpickle, which can run code stored in "
                              f"the checkpoint: refused (use torch >= 1.13)")
    try:
        if _is_torchscript(data):
            raise RuntimeError("a TorchScript archive (torch 1.13's torch.load hands those to torch.jit.load "
                               "even with weights_only=True)")
        return torch.load(io.BytesIO(data), weights_only=True)
    except Exception as e:
        detail = str(e).rsplit("WeightsUnpickler error: ", 1)[-1]  # not torch's advice to load unsafely
        older = " (or a plain torch.save by an older save_checkpoint)" if legacy else ""
        raise CheckpointError(f"{what} holds objects other than tensors and plain containers ({detail}): "
                              f"not loaded, as loading it could run code; possibly tampered with{older}") from e


def decode(encoding, data, what="part"):
    """The value of a part stored as (``encoding``, ``data``); ``what`` names it in errors."""
    if encoding == "bytes":
        return data
    if encoding == "json":
        return json.loads(data)
    if encoding == "torch":
        return _safe_torch_load(data, what, legacy=True)
    if encoding == "tensors":
        import torch

        blob = _safe_torch_load(data, what)
        if not (type(blob) is dict and set(blob) == {"tree", "tensors"} and type(blob["tree"]) is str
                and type(blob["tensors"]) is list and all(isinstance(t, torch.Tensor) for t in blob["tensors"])):
            raise ValueError("not a {'tree': str, 'tensors': [Tensor]} dict")
        return _untree(json.loads(blob["tree"]), blob["tensors"])
    raise ValueError(f"unknown encoding {encoding!r}")


@dataclass
class Checkpoint:
    step: int
    created: float
    parts: Dict[str, object]  # name -> value (decoded)


def save_checkpoint(store: ObjectStore, step: int, parts: Dict[str, object], clock=time.time) -> dict:
    """Writes ``parts`` ({name: bytes, a JSON-able snapshot or a torch object}) as checkpoint
    ``step``, the manifest last; returns the manifest. Refuses a step that already has a
    complete checkpoint (a partial one left by a crash is overwritten). Every part is encoded
    before anything is written, so bad input writes nothing."""
    _check_step(step)
    if not isinstance(parts, dict) or not parts:
        raise CheckpointError(f"checkpoint {step}: parts must be a non-empty dict of name -> value")
    for name in parts:
        if not isinstance(name, str) or not _PART_NAME.match(name) or name in (MANIFEST, "manifest"):
            raise CheckpointError(f"checkpoint {step}: invalid part name {name!r} (letters, digits, '_', '.', '-'; "
                                  f"not 'manifest')")
    prefix = step_prefix(step)
    encoded = {}
    for name, value in parts.items():
        try:
            encoded[name] = encode(value)
        except Exception as e:
            raise CheckpointError(f"checkpoint {step}: part {name!r} cannot be serialised: {e!r}") from e
    if prefix + MANIFEST in store.list(prefix):
        raise CheckpointError(f"{store}: checkpoint {step} already exists ({prefix + MANIFEST})")
    manifest = {"format": FORMAT, "step": step, "created": clock(), "parts": {}}
    for name, (encoding, data) in encoded.items():
        key = f"{prefix}{name}.{_EXTENSIONS[encoding]}"
        store.put_bytes(key, data)
        manifest["parts"][name] = {"key": key, "size": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                                   "encoding": encoding}
    store.put_bytes(prefix + MANIFEST, json.dumps(manifest, indent=1, sort_keys=True).encode())
    return manifest


def checkpoint_steps(store: ObjectStore) -> List[int]:
    """Every step with any object in the store (complete or not), ascending."""
    steps = set()
    for key in store.list("ckpt-"):
        match = _DIR.match(key)
        if match:
            steps.add(int(match.group(1)))
    return sorted(steps)


def _manifest(store, step):
    key = step_prefix(step) + MANIFEST
    try:
        raw = store.get_bytes(key)
    except ObjectNotFound as e:
        raise CheckpointError(f"{store}: checkpoint {step} has no manifest ({key}): incomplete") from e
    try:
        manifest = json.loads(raw)
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise ValueError(f"not a format-{FORMAT} manifest")
        if manifest.get("step") != step:
            raise ValueError(f"its step is {manifest.get('step')!r}")
        parts = manifest["parts"]
        if not isinstance(parts, dict) or not parts:
            raise ValueError("no parts")
        for name, part in parts.items():
            if not (isinstance(part, dict) and isinstance(part.get("key"), str)
                    and part["key"].startswith(step_prefix(step)) and isinstance(part.get("size"), int)
                    and isinstance(part.get("sha256"), str) and part.get("encoding") in _EXTENSIONS):
                raise ValueError(f"part {name!r} is malformed")
        float(manifest["created"])
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{store}: malformed manifest {key}: {e}") from e
    return manifest


def _read_verified(store, step):
    """(manifest, {name: bytes}) of a complete checkpoint, every part checked against the manifest."""
    manifest = _manifest(store, step)
    data = {}
    for name, part in manifest["parts"].items():
        try:
            raw = store.get_bytes(part["key"])
        except ObjectNotFound as e:
            raise CheckpointError(f"{store}: checkpoint {step} part {name!r} ({part['key']}) is missing") from e
        if len(raw) != part["size"] or hashlib.sha256(raw).hexdigest() != part["sha256"]:
            raise CheckpointError(f"{store}: checkpoint {step} part {name!r} ({part['key']}) does not match its "
                                  f"checksum ({len(raw)} bytes, manifest says {part['size']}): corrupt")
        data[name] = raw
    return manifest, data


def _decoded(store, step, manifest, data):
    parts = {}
    for name, raw in data.items():
        part = manifest["parts"][name]
        what = f"{store}: checkpoint {step} part {name!r} ({part['key']})"
        try:
            parts[name] = decode(part["encoding"], raw, what)
        except CheckpointError:  # refused as unsafe: already names the part
            raise
        except Exception as e:
            raise CheckpointError(f"{what} cannot be decoded as {part['encoding']}: {e!r}") from e
    return Checkpoint(step, float(manifest["created"]), parts)


def _newest_complete(store):
    """(step, manifest, data) of the newest complete checkpoint, or None; logs each step skipped."""
    for step in reversed(checkpoint_steps(store)):
        try:
            manifest, data = _read_verified(store, step)
            return step, manifest, data
        except CheckpointError as e:
            log.warning("skipping checkpoint %d: %s", step, e)
    return None


def latest_checkpoint(store: ObjectStore) -> Optional[int]:
    """The newest step whose manifest exists and whose parts all match their checksums (None:
    there is none)."""
    found = _newest_complete(store)
    return None if found is None else found[0]


def load_checkpoint(store: ObjectStore, step: Optional[int] = None) -> Optional[Checkpoint]:
    """Checkpoint ``step`` (CheckpointError unless complete and intact), or with None the newest
    complete one (None when there is none)."""
    if step is None:
        found = _newest_complete(store)
        return None if found is None else _decoded(store, *found)
    _check_step(step)
    manifest, data = _read_verified(store, step)
    return _decoded(store, step, manifest, data)


def prune(store: ObjectStore, keep: int) -> List[int]:
    """Deletes all but the newest ``keep`` complete checkpoints, and every incomplete or corrupt
    one older than the newest complete one (a newer one may still be being written). Only the
    checkpoints it keeps are read and verified. Each checkpoint's manifest goes first, so one
    whose deletion is interrupted is already not a checkpoint. Returns the steps deleted."""
    if not isinstance(keep, int) or isinstance(keep, bool) or keep < 1:
        raise CheckpointError(f"prune: keep must be an int >= 1, got {keep!r}")
    kept, doomed = [], []
    for step in reversed(checkpoint_steps(store)):
        if len(kept) == keep:
            doomed.append(step)
            continue
        try:
            _read_verified(store, step)
            kept.append(step)
        except CheckpointError as e:
            if kept:  # older than a complete checkpoint: garbage
                log.warning("pruning checkpoint %d: %s", step, e)
                doomed.append(step)
    for step in sorted(doomed):
        prefix = step_prefix(step)
        for key in sorted(store.list(prefix), key=lambda k: k != prefix + MANIFEST):  # the manifest first
            store.delete(key)
    return sorted(doomed)


class CheckpointWriter:
    """save/latest/load/prune bound to one store; ``keep``: prune to that many after each save."""

    def __init__(self, store: ObjectStore, keep: Optional[int] = None, clock=time.time):
        if not isinstance(store, ObjectStore):
            raise CheckpointError(f"CheckpointWriter needs an ObjectStore, got {type(store).__name__}")
        if keep is not None and (not isinstance(keep, int) or keep < 1):
            raise CheckpointError(f"keep must be None or an int >= 1, got {keep!r}")
        self.store, self.keep, self._clock = store, keep, clock

    def save(self, step, parts):
        manifest = save_checkpoint(self.store, step, parts, clock=self._clock)
        if self.keep is not None:
            prune(self.store, self.keep)
        return manifest

    def latest(self):
        return latest_checkpoint(self.store)

    def load(self, step=None):
        return load_checkpoint(self.store, step)

    def prune(self, keep):
        return prune(self.store, keep)


__all__ = ["Checkpoint", "CheckpointError", "CheckpointWriter", "ObjectStoreError", "latest_checkpoint",
           "load_checkpoint", "prune", "save_checkpoint"]
