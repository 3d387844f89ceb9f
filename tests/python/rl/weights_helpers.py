"""What the weight-publication tests (test_weights.py) and their child processes share: the
model, the state of every policy version (deterministic, so a child can rebuild the publisher's
exact bytes), a rank's expected share under a layout, and child processes whose JSON event
lines are read with deadlines."""

import json
import os
import queue
import re
import subprocess
import sys
import threading
import time

import torch

from proxyep.rl.model_config import ModelConfig, build_dense_reference, expert_parameter_names

HERE = os.path.dirname(os.path.abspath(__file__))
# A real TinyMoELM shape (hidden a multiple of 128 for the rollout side's LL exchange), small.
CONFIG = ModelConfig(vocab=64, hidden=128, layers=2, heads=4, num_experts=4, topk=2, ffn_hidden=32, max_seq=32,
                     seed=5)
# Small buckets, so every tensor spans several chunks and transfers have dozens of writes.
CHUNK_BYTES = 16 << 10


def state_for(version, config=CONFIG):
    """(dense {name: tensor}, expert rows {name: [E, ...]}) of policy ``version``: the model's
    initial weights plus noise seeded by the version (what gather_ep_state would give)."""
    model = build_dense_reference(config)
    experts = expert_parameter_names(config)
    dense, rows = {}, {}
    for i, (name, p) in enumerate(model.named_parameters()):
        g = torch.Generator().manual_seed(version * 7919 + i)
        value = (p.detach() + 0.01 * version * torch.randn(p.shape, generator=g)).contiguous()
        (rows if name in experts else dense)[name] = value
    return dense, rows


def local_share(dense, rows, layout, rank):
    """{name: tensor} that rank ``rank`` of ``layout`` must hold: dense whole, expert tensors as
    the rows of the experts it owns, in the layout's order."""
    out = dict(dense)
    index = torch.tensor(layout.experts[rank], dtype=torch.long)
    for name, value in rows.items():
        out[name] = value.index_select(0, index)
    return out


def nbytes(state):
    return sum(t.numel() * t.element_size() for t in state.values())


def child_env(**extra):
    """The environment of a child: the build's python/, EP traffic over TCP on loopback with the
    reorder shim (unordered completions, as on EFA)."""
    env = dict(os.environ)
    env.update(PYTHONPATH=os.pathsep.join([p for p in sys.path if p] + [HERE]), PYTHONDONTWRITEBYTECODE="1",
               PROXYEP_FABRIC_PROVIDER="tcp", PROXYEP_FABRIC_REORDER="1", PROXYEP_FABRIC_DOMAIN="lo")
    env.update({k: str(v) for k, v in extra.items()})
    return env


_LINE = re.compile(r"^(?:\[rank (\d+)\] )?(\{.*\})\s*$")


class Child:
    """A child process (or a `proxyep launch` job) that prints one JSON object per line; a
    thread reads them into a queue so waits have deadlines. ``rank`` is taken from the
    launcher's "[rank k] " prefix (0 without one)."""

    def __init__(self, argv, env, name, stdin=False):
        self.name = name
        # stderr on a pipe of its own: a log line written to a shared pipe could land in the
        # middle of an event line.
        self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     stdin=subprocess.PIPE if stdin else subprocess.DEVNULL)
        self.events = []  # every event seen, in order
        self.lines = []  # every line of both streams (for failure messages)
        self._queue = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._errors = threading.Thread(target=self._read_stderr, daemon=True)
        self._errors.start()

    def _read_stderr(self):
        for line in self.proc.stderr:
            self.lines.append("stderr: " + line.rstrip())

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())
            m = _LINE.match(line)
            if m:
                try:
                    event = json.loads(m.group(2))
                except ValueError:
                    continue
                event.setdefault("rank", int(m.group(1) or 0))
                self._queue.put(event)
        self._queue.put(None)  # end of output

    def send(self, message):
        self.proc.stdin.write(json.dumps(message) + "\n")
        self.proc.stdin.flush()

    def expect(self, predicate, timeout_s=60.0, what="an event"):
        """The first unseen event matching ``predicate`` (earlier ones are kept in ``events``);
        AssertionError with the child's output when the deadline passes or the child ends."""
        deadline = time.monotonic() + timeout_s
        for event in self.events:
            if not event.get("_taken") and predicate(event):
                event["_taken"] = True
                return event
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{self.name}: no {what} within {timeout_s} s; output:\n" + self.tail())
            try:
                event = self._queue.get(timeout=left)
            except queue.Empty:
                continue
            if event is None:
                self._queue.put(None)
                raise AssertionError(f"{self.name}: ended (rc {self.proc.poll()}) before {what}; output:\n"
                                     + self.tail())
            self.events.append(event)
            if predicate(event):
                event["_taken"] = True
                return event

    def tail(self, n=60):
        return "\n".join(self.lines[-n:])

    def wait(self, timeout_s=60.0):
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"{self.name} did not exit within {timeout_s} s; output:\n" + self.tail()) from None

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)


def launcher():
    """The `proxyep` CLI: $PROXYEP_RL_CLI, else the build's (next to python/ in the build tree)."""
    if os.environ.get("PROXYEP_RL_CLI"):
        return os.environ["PROXYEP_RL_CLI"]
    python_dir = next(p for p in sys.path if os.path.isfile(os.path.join(p, "proxyep", "__init__.py")))
    return os.path.join(os.path.dirname(os.path.abspath(python_dir)), "tools", "proxyep")
