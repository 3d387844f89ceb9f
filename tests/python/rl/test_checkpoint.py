"""proxyep.rl.train.checkpoint over both object stores: a directory, and S3 through a real s3rver
started on loopback for this module (skipped, saying how to install it, when
tests/python/rl/s3/node_modules is missing). A TinyMoELM-sized policy with its Adam state and the
buffer/pool snapshots round-trip bit-exactly; a writer SIGKILLed half-way, a missing manifest, a
corrupt or missing part (or its sha256 changed in the manifest) and a malformed manifest are each
not a checkpoint, and resume picks the newest complete one; prune keeps the newest. Loading runs
no code from the store: Adam's and AdamW's state come back through torch.load(weights_only=True)
alone, a part replaced by a pickle that would run code (its manifest entry rewritten to match) is
refused naming its key and runs nothing, a part written the old way (plain torch.save) loads when
it holds only tensors, and a torch without weights_only loads no torch part. Plus the stores' own
contracts (atomic directory writes, refused keys, errors naming store/operation/key)."""

import functools
import hashlib
import io
import json
import logging
import os
import select
import shutil
import signal
import subprocess
import sys
import time
import uuid
import warnings

import pytest
import torch

from proxyep.moe import DenseTinyMoELM
from proxyep.rl.coordinator.protocol import CompletedGroup, GroupSpec, Lease, Progress, Sample, SamplingParams
from proxyep.rl.train import checkpoint
from proxyep.rl.train.checkpoint import (CheckpointError, CheckpointWriter, latest_checkpoint, load_checkpoint, prune,
                                         save_checkpoint, step_prefix)
from proxyep.rl.train.experience import ExperienceBuffer, ScoredGroup
from proxyep.rl.train.object_store import DirectoryStore, ObjectNotFound, ObjectStoreError, S3Store
from s3_server import S3Server, S3ServerError, default_cli

torch.set_num_threads(1)
BUCKET = "proxyep-checkpoints"
# test_moe_model.py's model: 2 layers of 8 experts, ~0.3 M parameters
MODEL = dict(vocab=64, hidden=128, layers=2, heads=4, num_experts=8, topk=2, ffn_hidden=32, seed=3, max_seq=32,
             aux_loss_coef=0.01)
CHILD_DEADLINE_S = 120  # importing torch on a loaded 2-core box


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory):
    if default_cli() is None or shutil.which("node") is None:
        why = ("s3rver or node is not installed: run scripts/install-deps.sh (it installs nodejs and runs "
               "npm ci --prefix tests/python/rl/s3)")
        # Where every test must run (scripts/test.sh, CI), a missing server fails instead of
        # quietly shrinking the suite (cmake/TestDependencies.cmake).
        if os.environ.get("PROXYEP_REQUIRE_ALL_TESTS") == "1" or os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    server = S3Server(tmp_path_factory.mktemp("s3rver"), buckets=[BUCKET])
    yield server
    server.stop()
    assert not server.running()


@pytest.fixture(params=["directory", "s3"])
def store_config(request, tmp_path):
    """A JSON-able description of a fresh, empty store (so a child process can open it too)."""
    if request.param == "directory":
        return {"kind": "directory", "root": str(tmp_path / "store")}
    server = request.getfixturevalue("s3_server")
    return {"kind": "s3", "bucket": BUCKET, "prefix": f"run-{uuid.uuid4().hex}", **server.client_options}


def open_store(config):
    config = dict(config)
    if config.pop("kind") == "directory":
        return DirectoryStore(config["root"])
    return S3Store(config.pop("bucket"), config.pop("prefix"), **config)


@pytest.fixture
def store(store_config):
    return open_store(store_config)


def trained_model_and_optimizer(steps=2, optimizer=torch.optim.Adam):
    torch.manual_seed(0)
    model = DenseTinyMoELM(**MODEL)
    opt = optimizer(model.parameters(), lr=2e-3)
    for _ in range(steps):
        tokens = torch.randint(0, MODEL["vocab"], (4, 9))
        logits, aux = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, MODEL["vocab"]), tokens[:, 1:].reshape(-1)) + aux
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model, opt


def buffer_snapshot():
    buf = ExperienceBuffer(batch_groups=2, staleness=1, max_in_flight=4)
    for gid in ("a", "b"):
        buf.submitted(GroupSpec(gid, [1, 2], 2))
    out = Progress(tokens=[3, 4], logprobs=[-0.25, -1.5], versions=[0, 0])
    samples = [Sample("a", i, [1, 2], out, "length", 1) for i in range(2)]
    buf.put(ScoredGroup(CompletedGroup(GroupSpec("a", [1, 2], 2), samples, 12.5), [0.0, 1.0], "rule:add"))
    return buf.snapshot()


def pool_snapshot():
    """A rollout pool's state as its snapshot() gives it: JSON-able protocol dicts."""
    spec = GroupSpec("b", [1, 2], 2, SamplingParams(max_new_tokens=4))
    lease = Lease("L1", "b", 0, "worker-0", [1, 2], Progress([7], [-0.5], [0]), spec.sampling, 3, 1e9, 1, 0)
    return {"version": 0, "groups": [spec.to_dict()], "leases": [lease.to_dict()], "counters": {"submitted": 2}}


def parts_for(step):
    """Small distinguishable parts for checkpoint ``step``."""
    return {"policy": {"w": torch.full((8,), float(step))}, "buffer": {"step": step, "groups": []},
            "note": f"checkpoint {step}".encode()}


# -- round trip ---------------------------------------------------------------------------------

def test_round_trip_is_bit_exact_and_training_continues_identically(store):
    model, opt = trained_model_and_optimizer()
    buf_snap, pool_snap = buffer_snapshot(), pool_snapshot()
    manifest = CheckpointWriter(store).save(7, {"policy": model.state_dict(), "optimizer": opt.state_dict(),
                                                "buffer": buf_snap, "pool": pool_snap, "rng": b"\x00\xffraw"})
    assert {n: p["encoding"] for n, p in manifest["parts"].items()} == {
        "policy": "tensors", "optimizer": "tensors", "buffer": "json", "pool": "json", "rng": "bytes"}
    assert len(store.list(step_prefix(7))) == 6  # five parts and the manifest

    ckpt = load_checkpoint(store)
    assert ckpt.step == 7 and latest_checkpoint(store) == 7
    state = model.state_dict()
    assert list(ckpt.parts["policy"]) == list(state)
    for name, tensor in state.items():
        loaded = ckpt.parts["policy"][name]
        assert loaded.dtype == tensor.dtype and loaded.shape == tensor.shape
        assert torch.equal(loaded, tensor), name
    assert ckpt.parts["buffer"] == buf_snap and ckpt.parts["pool"] == pool_snap
    assert ckpt.parts["rng"] == b"\x00\xffraw"

    # Resume: a fresh model + optimiser from the checkpoint take the same next step, bit for bit.
    resumed = DenseTinyMoELM(**dict(MODEL, seed=MODEL["seed"] + 1))
    resumed.load_state_dict(ckpt.parts["policy"])
    resumed_opt = torch.optim.Adam(resumed.parameters(), lr=2e-3)
    resumed_opt.load_state_dict(ckpt.parts["optimizer"])
    tokens = torch.randint(0, MODEL["vocab"], (4, 9), generator=torch.Generator().manual_seed(5))
    for m, o in ((model, opt), (resumed, resumed_opt)):
        logits, aux = m(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, MODEL["vocab"]), tokens[:, 1:].reshape(-1)) + aux
        o.zero_grad()
        loss.backward()
        o.step()
    for (name, a), b in zip(model.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name

    restored = ExperienceBuffer(batch_groups=2, staleness=1, max_in_flight=4)
    assert restored.restore(ckpt.parts["buffer"]) == ["b"]
    assert restored.snapshot() == buf_snap


@pytest.mark.parametrize("optimizer", [torch.optim.Adam, torch.optim.AdamW])
def test_optimizer_state_round_trips_through_the_weights_only_loader(store, optimizer, monkeypatch):
    _, opt = trained_model_and_optimizer(steps=1, optimizer=optimizer)
    state = opt.state_dict()  # 'state': {int: {tensors}}; 'param_groups': floats, tuples (betas), None, bools
    save_checkpoint(store, 1, {"optimizer": state})
    real_load, weights_only = torch.load, []

    @functools.wraps(real_load)  # the same signature: checkpoint.py looks for weights_only in it
    def recording_load(*args, **kwargs):
        weights_only.append(kwargs.get("weights_only", False))
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", recording_load)
    loaded = load_checkpoint(store, 1).parts["optimizer"]
    assert weights_only and all(w is True for w in weights_only), weights_only
    assert loaded["param_groups"] == state["param_groups"]
    assert isinstance(loaded["param_groups"][0]["betas"], tuple)
    assert list(loaded["state"]) == list(state["state"]) and all(isinstance(k, int) for k in loaded["state"])
    for index, entry in state["state"].items():
        assert list(loaded["state"][index]) == list(entry)
        for name, value in entry.items():
            got = loaded["state"][index][name]
            assert got.dtype == value.dtype and torch.equal(got, value), (index, name)


def rewrite_part(store, step, name, data, encoding=None):
    """Replaces checkpoint ``step``'s part ``name`` with ``data`` and rewrites its manifest entry
    to match (size, sha256 and, if given, encoding): what someone who can write the store can do.
    Returns the part's key."""
    manifest_key = step_prefix(step) + "manifest.json"
    manifest = json.loads(store.get_bytes(manifest_key))
    part = manifest["parts"][name]
    store.put_bytes(part["key"], data)
    part.update(size=len(data), sha256=hashlib.sha256(data).hexdigest())
    if encoding is not None:
        part["encoding"] = encoding
    store.put_bytes(manifest_key, json.dumps(manifest).encode())
    return part["key"]


class CreatesFile:
    """Pickles as a call of open(path, "w"): unpickling it creates ``path``."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return open, (self.path, "w")


class Scripted(torch.nn.Module):
    def forward(self, x):
        return x + 1


@pytest.mark.parametrize("payload", ["pickle", "torchscript"])
@pytest.mark.parametrize("encoding", ["tensors", "torch"])
def test_a_part_that_would_run_code_is_refused_and_runs_nothing(store, tmp_path, encoding, payload):
    for step in (1, 2):
        save_checkpoint(store, step, parts_for(step))
    marker = tmp_path / "code-ran"
    buf = io.BytesIO()
    if payload == "pickle":
        torch.save({"tree": '["tensor", 0]', "tensors": [CreatesFile(str(marker))]}, buf)
    else:  # a module with code, which torch 1.13's torch.load(weights_only=True) hands to torch.jit.load
        torch.jit.save(torch.jit.script(Scripted()), buf)
    key = rewrite_part(store, 2, "policy", buf.getvalue(), encoding)
    assert latest_checkpoint(store) == 2  # the checksums match: only decoding can tell
    with pytest.raises(CheckpointError, match="holds objects other than tensors and plain containers") as info:
        load_checkpoint(store, 2)
    assert key in str(info.value) and "possibly tampered" in str(info.value)
    assert info.value.__cause__ is not None  # the loader's own error
    assert not marker.exists()
    assert load_checkpoint(store, 1).parts["note"] == b"checkpoint 1"
    # The payload is live: the unrestricted unpickler runs it; TorchScript gets past weights_only.
    if payload == "pickle":
        torch.load(io.BytesIO(store.get_bytes(key)))["tensors"][0].close()
        assert marker.exists()
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "looks like a TorchScript archive"
            try:
                loaded = torch.load(io.BytesIO(store.get_bytes(key)), weights_only=True)
            except Exception:  # a torch that refuses TorchScript with weights_only itself
                loaded = None
        assert loaded is None or isinstance(loaded, torch.jit.ScriptModule)


def test_a_part_written_by_plain_torch_save_loads_only_when_it_is_tensors(store):
    _, opt = trained_model_and_optimizer(steps=1)
    save_checkpoint(store, 1, {"policy": {"w": torch.zeros(2)}, "optimizer": {"w": torch.zeros(2)}})
    for name, value in (("policy", {"w": torch.arange(4.0)}), ("optimizer", opt.state_dict())):
        buf = io.BytesIO()
        torch.save(value, buf)
        rewrite_part(store, 1, name, buf.getvalue(), "torch")
    with pytest.raises(CheckpointError, match=r"'optimizer' \(ckpt-0000000001/optimizer.pt\) holds objects other "
                                              r"than tensors.*older save_checkpoint"):
        load_checkpoint(store, 1)
    rewrite_part(store, 1, "optimizer", store.get_bytes(step_prefix(1) + "policy.pt"))
    assert torch.equal(load_checkpoint(store, 1).parts["optimizer"]["w"], torch.arange(4.0))


def test_a_torch_without_weights_only_loads_no_torch_part(store, monkeypatch):
    save_checkpoint(store, 1, parts_for(1))
    monkeypatch.setattr(checkpoint, "_torch_has_weights_only", lambda: False)
    with pytest.raises(CheckpointError, match=r"'policy' \(ckpt-0000000001/policy.pt\): torch .* has no "
                                              r"torch.load\(weights_only=True\).*refused"):
        load_checkpoint(store, 1)
    save_checkpoint(store, 2, {"buffer": {"step": 2}, "note": b"no tensors"})
    assert load_checkpoint(store, 2).parts == {"buffer": {"step": 2}, "note": b"no tensors"}


# -- incomplete and corrupt checkpoints ---------------------------------------------------------

CHILD = r"""
import json, sys
from proxyep.rl.train.checkpoint import save_checkpoint
from proxyep.rl.train.object_store import DirectoryStore, S3Store
import torch

config, step, stop_after = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
kind = config.pop("kind")
store = DirectoryStore(config["root"]) if kind == "directory" else \
    S3Store(config.pop("bucket"), config.pop("prefix"), **config)
puts = 0
real_put = store.put_bytes

def put_then_hang(key, data):
    # After `stop_after` objects, tell the parent and block: it SIGKILLs this process here.
    global puts
    real_put(key, data)
    puts += 1
    if puts == stop_after:
        print("wrote", puts, flush=True)
        sys.stdin.read()

store.put_bytes = put_then_hang
parts = {name: {"w": torch.randn(64, 64)} for name in ("policy", "optimizer", "reference")}
parts["buffer"] = {"step": step}
save_checkpoint(store, step, parts)
print("finished", flush=True)
"""


def save_in_child_and_kill(config, step, stop_after):
    """Runs save_checkpoint in a child process and SIGKILLs it once it has written
    ``stop_after`` objects (it reports each milestone on stdout and then blocks)."""
    child = subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(config), str(step), str(stop_after)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + CHILD_DEADLINE_S
        line = ""
        while not line:
            remaining = deadline - time.monotonic()
            readable, _, _ = select.select([child.stdout], [], [], max(0.0, remaining))
            if not readable:
                raise AssertionError(f"checkpoint writer (pid {child.pid}) did not report within "
                                     f"{CHILD_DEADLINE_S} s")
            line = child.stdout.readline()
            if not line:
                raise AssertionError(f"checkpoint writer (pid {child.pid}) exited early: {child.wait(10)}, "
                                     f"stderr:\n{child.stderr.read()}")
        assert line.split() == ["wrote", str(stop_after)], line
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(30) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(30)
        for pipe in (child.stdin, child.stdout, child.stderr):
            pipe.close()


def test_writer_killed_half_way_is_not_a_checkpoint_and_resume_picks_the_previous(store_config, caplog):
    store = open_store(store_config)
    save_checkpoint(store, 1, parts_for(1))
    save_in_child_and_kill(store_config, 2, stop_after=2)
    written = store.list(step_prefix(2))
    assert len(written) == 2 and not any(k.endswith("manifest.json") for k in written)  # really half-way
    with caplog.at_level(logging.WARNING, logger="proxyep.rl.checkpoint"):
        assert latest_checkpoint(store) == 1
    assert "skipping checkpoint 2" in caplog.text and "no manifest" in caplog.text
    ckpt = load_checkpoint(store)
    assert ckpt.step == 1 and torch.equal(ckpt.parts["policy"]["w"], torch.full((8,), 1.0))
    with pytest.raises(CheckpointError, match=r"ckpt-0000000002/manifest.json.*incomplete"):
        load_checkpoint(store, 2)
    # The resumed run writes step 2 again over the debris.
    save_checkpoint(store, 2, parts_for(2))
    assert latest_checkpoint(store) == 2 and load_checkpoint(store).parts["note"] == b"checkpoint 2"


def test_a_writer_killed_before_the_manifest_leaves_every_part_but_no_checkpoint(store_config):
    store = open_store(store_config)
    save_checkpoint(store, 3, parts_for(3))
    save_in_child_and_kill(store_config, 4, stop_after=4)  # all four parts, not the manifest
    assert len(store.list(step_prefix(4))) == 4
    assert latest_checkpoint(store) == 3


@pytest.mark.parametrize("damage", ["flipped byte", "truncated", "deleted", "manifest's sha256"])
def test_a_damaged_part_is_detected_and_the_previous_checkpoint_loads(store, damage, caplog):
    for step in (1, 2):
        save_checkpoint(store, step, parts_for(step))
    manifest = json.loads(store.get_bytes(step_prefix(2) + "manifest.json"))
    key = manifest["parts"]["policy"]["key"]
    data = bytearray(store.get_bytes(key))
    if damage == "manifest's sha256":
        manifest["parts"]["policy"]["sha256"] = hashlib.sha256(b"something else").hexdigest()
        store.put_bytes(step_prefix(2) + "manifest.json", json.dumps(manifest).encode())
    elif damage == "flipped byte":
        data[len(data) // 2] ^= 0x01
        store.put_bytes(key, bytes(data))
    elif damage == "truncated":
        store.put_bytes(key, bytes(data[:-1]))
    else:
        store.delete(key)
    expected = "is missing" if damage == "deleted" else "does not match its checksum"
    with caplog.at_level(logging.WARNING, logger="proxyep.rl.checkpoint"):
        assert latest_checkpoint(store) == 1
    assert expected in caplog.text and key in caplog.text
    with pytest.raises(CheckpointError, match=expected) as info:
        load_checkpoint(store, 2)
    assert key in str(info.value)
    assert load_checkpoint(store).step == 1


def test_newest_complete_checkpoint_wins(store):
    for step in (9, 100, 10, 3):  # out of order; 100 > 10 > 9 numerically
        save_checkpoint(store, step, parts_for(step))
    store.put_bytes(step_prefix(101) + "policy.pt", b"half-written")  # a newer one, still being written
    assert latest_checkpoint(store) == 100
    ckpt = load_checkpoint(store)
    assert ckpt.step == 100 and ckpt.parts["buffer"] == {"step": 100, "groups": []}
    assert load_checkpoint(store, 9).parts["note"] == b"checkpoint 9"


@pytest.mark.parametrize("manifest", [b"{not json", b"[]", json.dumps({"format": 1, "step": 6}).encode(),
                                      json.dumps({"format": 1, "step": 99, "created": 0, "parts": {}}).encode()])
def test_a_malformed_manifest_is_a_clear_error_and_others_still_load(store, manifest, caplog):
    for step in (5, 6):
        save_checkpoint(store, step, parts_for(step))
    store.put_bytes(step_prefix(6) + "manifest.json", manifest)
    with pytest.raises(CheckpointError, match=r"malformed manifest ckpt-0000000006/manifest.json"):
        load_checkpoint(store, 6)
    with caplog.at_level(logging.WARNING, logger="proxyep.rl.checkpoint"):
        assert latest_checkpoint(store) == 5
    assert "skipping checkpoint 6" in caplog.text
    assert load_checkpoint(store, 5).parts["note"] == b"checkpoint 5"


def test_prune_keeps_the_newest_and_spares_a_checkpoint_in_progress(store):
    for step in range(1, 6):
        save_checkpoint(store, step, parts_for(step))
    store.delete(step_prefix(2) + "manifest.json")  # an old crashed one: garbage
    store.put_bytes(step_prefix(6) + "policy.pt", b"in progress")
    assert prune(store, keep=2) == [1, 2, 3]
    assert sorted({k.split("/")[0] for k in store.list()}) == ["ckpt-0000000004", "ckpt-0000000005",
                                                               "ckpt-0000000006"]
    assert latest_checkpoint(store) == 5
    writer = CheckpointWriter(store, keep=1)
    writer.save(7, parts_for(7))
    assert writer.latest() == 7 and [s for s in (4, 5) if store.list(step_prefix(s))] == []


def test_bad_saves_write_nothing(store):
    save_checkpoint(store, 1, parts_for(1))
    before = store.list()
    with pytest.raises(CheckpointError, match="already exists"):
        save_checkpoint(store, 1, parts_for(1))
    with pytest.raises(CheckpointError, match="cannot be serialised"):
        save_checkpoint(store, 2, {"policy": {"w": torch.zeros(2)}, "bad": lambda: None})
    with pytest.raises(CheckpointError, match="invalid part name"):
        save_checkpoint(store, 2, {"../policy": b"x"})
    with pytest.raises(CheckpointError, match="invalid part name"):
        save_checkpoint(store, 2, {"manifest": b"x"})
    with pytest.raises(CheckpointError, match="step must be"):
        save_checkpoint(store, -1, parts_for(1))
    with pytest.raises(CheckpointError, match="non-empty dict"):
        save_checkpoint(store, 2, {})
    assert store.list() == before
    assert load_checkpoint(store, 1).parts["note"] == b"checkpoint 1"


def test_an_empty_store_has_no_checkpoint(store):
    assert latest_checkpoint(store) is None and load_checkpoint(store) is None
    with pytest.raises(CheckpointError, match="no manifest"):
        load_checkpoint(store, 0)


# -- the stores ---------------------------------------------------------------------------------

def test_store_contract(store):
    store.put_bytes("a/b/c", b"1")
    store.put_bytes("a/b/c", b"22")  # replaced whole
    store.put_bytes("a/d", b"")
    store.put_bytes("ab", b"3")
    assert store.get_bytes("a/b/c") == b"22" and store.get_bytes("a/d") == b""
    assert store.list() == ["a/b/c", "a/d", "ab"] and store.list("a/") == ["a/b/c", "a/d"]
    assert store.list("a") == ["a/b/c", "a/d", "ab"] and store.list("zz") == []
    with pytest.raises(ObjectNotFound, match=r"get 'a/b'.*no such object") as info:
        store.get_bytes("a/b")
    assert repr(store) in str(info.value)
    store.delete("a/b/c")
    store.delete("a/b/c")  # deleting what is gone is not an error
    assert store.list() == ["a/d", "ab"]
    for key in ("../escape", "/abs", "a//b", "a/./b", "", "a/.tmp-x"):
        with pytest.raises(ObjectStoreError, match="invalid key"):
            store.put_bytes(key, b"x")
    with pytest.raises(ObjectStoreError, match="must be bytes"):
        store.put_bytes("k", "text")
    assert store.list() == ["a/d", "ab"]


def test_directory_store_never_lists_an_interrupted_write(tmp_path):
    store = DirectoryStore(tmp_path)
    store.put_bytes("ckpt/part", b"old")
    # What a writer killed between writing its temporary file and renaming it leaves behind.
    (tmp_path / "ckpt" / ".tmp-crashed").write_bytes(b"partial")
    assert store.list() == ["ckpt/part"] and store.get_bytes("ckpt/part") == b"old"
    store.put_bytes("ckpt/part", b"new")
    assert store.get_bytes("ckpt/part") == b"new"
    assert sorted(os.listdir(tmp_path / "ckpt")) == [".tmp-crashed", "part"]  # no temporary file of its own
    store.delete("ckpt/part")
    assert store.list() == []


def test_a_failed_directory_write_keeps_the_old_object_and_no_debris(tmp_path, monkeypatch):
    store = DirectoryStore(tmp_path)
    store.put_bytes("ckpt/part", b"old")

    def failing_fsync(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(ObjectStoreError, match=r"put 'ckpt/part'.*Input/output error"):
        store.put_bytes("ckpt/part", b"new")
    monkeypatch.undo()
    assert store.get_bytes("ckpt/part") == b"old"
    assert os.listdir(tmp_path / "ckpt") == ["part"]


def test_a_server_that_cannot_start_is_an_error_not_a_hang(s3_server, tmp_path):
    with pytest.raises(S3ServerError, match=r"s3rver \(pid \d+\) did not report its port; exited with"):
        S3Server(tmp_path / "second", port=s3_server.port, buckets=[BUCKET])  # the port is taken


def test_s3_errors_name_the_store_operation_and_key(s3_server, tmp_path):
    missing_bucket = S3Store("no-such-bucket", "p", **s3_server.client_options)
    with pytest.raises(ObjectStoreError, match=r"s3://no-such-bucket/p/.*: put 'k'.*NoSuchBucket"):
        missing_bucket.put_bytes("k", b"x")
    # An endpoint nobody listens on: a bounded error, not a hang.
    dead = S3Server(tmp_path / "dead", buckets=[BUCKET])
    options = dead.client_options
    dead.kill()
    store = S3Store(BUCKET, "p", **options)
    with pytest.raises(ObjectStoreError, match=r"get 'k'.*Could not connect"):
        store.get_bytes("k")
