"""The GRPO loop's controller, on the trainer's rank 0 (docs/RL.md sections 1-4): it feeds the
rollout pool and the experience buffer between training steps.

A background thread (``run``) keeps doing three things, each a few milliseconds:
- submit: new prompt groups while admission control allows (ExperienceBuffer.allowed with the
  coordinator's version), each registered with the buffer at the version rollouts start from;
- collect: complete groups from the coordinator (take_completed), scored by the task's rule
  (the reward phase, timed), put into the buffer (the DAPO filter may drop them; they are then
  refilled by new prompts, as are failed groups);
- watch: groups the coordinator marked failed (out of attempts) are settled in the buffer so it
  stops waiting for them, and replaced.
The trainer's main thread calls ``next_batch(version)``: pop_batch (the trainer's wait), then the
GRPO advantages per group and the sequences dealt round-robin to the trainer ranks.

Everything is counted for the per-iteration metrics (``take_window``): tokens generated, reward
seconds, groups completed/filtered/failed/refilled, and the staleness of what was consumed.
"""

import logging
import threading
import time
from typing import List

from ..coordinator.protocol import GroupSpec, GroupState, RLError, SamplingParams
from .experience import ExperienceBuffer, ScoredGroup
from .grpo import group_advantages
from .trainer import TrainSequence

log = logging.getLogger("proxyep.rl.controller")


class Controller:
    def __init__(self, config, coordinator, buffer: ExperienceBuffer, task, trainer_ranks, next_prompt=0,
                 poll_s=0.005):
        self.config, self.coordinator, self.buffer, self.task = config, coordinator, buffer, task
        self.trainer_ranks, self.next_prompt, self.poll_s = trainer_ranks, next_prompt, poll_s
        self.in_flight = {}  # group id -> prompt index, submitted and not yet settled
        self.error = None  # the exception that stopped the thread, raised to the trainer
        self._lock = threading.Lock()
        # Held for each round of step(): a checkpoint holds it to snapshot the buffer and the pool at
        # one moment (a group taken from the pool but not yet in the buffer would be in neither).
        self.paused = threading.RLock()
        self._stop = threading.Event()
        self._window = self._empty_window()
        # Over the whole run (the accounting of run.py's summary): groups submitted, collected from
        # the pool, dropped by the DAPO filter, failed there.
        self.totals = {"submitted": 0, "collected": 0, "filtered": 0, "failed": 0}
        self._last_failed_check = 0.0
        self._thread = None

    @staticmethod
    def _empty_window():
        return {"tokens": 0, "samples": 0, "groups": 0, "reward_s": 0.0, "filtered": 0, "failed": 0, "refilled": 0,
                "rewards": [], "exact": 0}

    # ---- the background thread ----

    def start(self):
        self._thread = threading.Thread(target=self._run, name="rl-controller", daemon=True)
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _run(self):
        try:
            while not self._stop.is_set():
                self.step()
                self._stop.wait(self.poll_s)
        except Exception as e:  # noqa: BLE001 - handed to the trainer thread, which raises it
            log.exception("controller stopped")
            self.error = e

    def step(self, submit=True):
        """One round of collect, watch and (unless ``submit`` is False: the run is ending) submit."""
        with self.paused:
            self._collect()
            now = time.monotonic()
            if now - self._last_failed_check > 0.25:
                self._last_failed_check = now
                self._watch_failed()
            if submit:
                self._submit()

    def _spec(self, index):
        g = self.config.grpo
        return GroupSpec(group_id=f"p{index}", prompt=self.task.prompt(index), num_samples=g.group_size,
                         sampling=SamplingParams(max_new_tokens=self.task.max_new_tokens(), temperature=g.temperature,
                                                 stop_token=self.task.stop_token),
                         metadata={"index": index})

    def _submit(self):
        version = self.coordinator.version()
        while self.buffer.allowed(version) > 0:
            spec = self._spec(self.next_prompt)
            self.buffer.submitted(spec, version)
            self.coordinator.submit(spec)
            with self._lock:
                self.in_flight[spec.group_id] = self.next_prompt
                self.totals["submitted"] += 1
            self.next_prompt += 1

    def _collect(self):
        for group in self.coordinator.take_completed():
            gid = group.spec.group_id
            index = group.spec.metadata["index"]
            t0 = time.perf_counter()
            rewards = [self.task.reward(index, s.output.tokens) for s in group.samples]
            scored = ScoredGroup(group, rewards, self.task.reward_source)
            reward_s = time.perf_counter() - t0
            kept = self.buffer.put(scored)
            refills = self.buffer.take_refills()
            with self._lock:
                self.in_flight.pop(gid, None)
                w = self._window
                w["reward_s"] += reward_s
                w["groups"] += 1
                w["samples"] += len(group.samples)
                w["tokens"] += sum(len(s.output.tokens) for s in group.samples)
                w["rewards"] += rewards
                w["exact"] += sum(1 for r in rewards if r == 1.0)
                w["filtered"] += 0 if kept else 1
                w["refilled"] += len(refills)
                self.totals["collected"] += 1
                self.totals["filtered"] += 0 if kept else 1

    def _watch_failed(self):
        with self._lock:
            pending = list(self.in_flight)
        for gid in pending:
            if self.coordinator.group_state(gid) == GroupState.failed:
                self.buffer.failed(gid)
                self.buffer.take_refills()
                with self._lock:
                    self.in_flight.pop(gid, None)
                    self._window["failed"] += 1
                    self._window["refilled"] += 1
                    self.totals["failed"] += 1
                log.warning("group %s failed (out of attempts); a new prompt replaces it", gid)

    # ---- the trainer's calls ----

    def next_batch(self, version, timeout_s):
        """(per-rank lists of TrainSequence, the ScoredGroups, seconds waited). Raises the
        controller thread's error, or the buffer's BatchTimeout naming what it waited for."""
        if self.error is not None:
            raise RLError(f"controller: {self.error}") from self.error
        t0 = time.perf_counter()
        deadline = time.monotonic() + timeout_s
        while True:
            # Short pops so a controller failure is seen at once rather than at the deadline.
            try:
                groups = self.buffer.pop_batch(self.config.grpo.batch_groups, min(1.0, timeout_s), version)
                break
            except RLError as e:
                if self.error is not None:
                    raise RLError(f"controller: {self.error}") from self.error
                if time.monotonic() >= deadline or type(e).__name__ != "BatchTimeout":
                    raise
        waited = time.perf_counter() - t0
        seqs: List[TrainSequence] = []
        for scored in groups:
            adv = group_advantages(scored.rewards)
            for s, a in zip(scored.group.samples, adv.tolist()):
                seqs.append(TrainSequence(list(s.prompt), list(s.output.tokens), list(s.output.logprobs), a))
        shares = [seqs[r::self.trainer_ranks] for r in range(self.trainer_ranks)]
        return shares, groups, waited

    def take_window(self):
        """The counters since the last call (then reset)."""
        with self._lock:
            w, self._window = self._window, self._empty_window()
        return w

    def snapshot(self):
        with self._lock:
            return {"next_prompt": self.next_prompt, "in_flight": dict(self.in_flight), "totals": dict(self.totals)}

    def restore_totals(self, totals):
        with self._lock:
            self.totals.update(totals)
