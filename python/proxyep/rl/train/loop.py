"""The trainer's loop in a GRPO run, on every rank of the trainer group (job.py starts it).

Iteration i takes the policy from version i to i + 1:
1. rollout: rank 0 pops B scored groups from the experience buffer (the trainer's wait for the
   pool) and deals the sequences to the ranks (broadcast over the trainer's gloo group; an error
   on rank 0 is broadcast instead, so every rank stops with it rather than hanging);
2. train: GRPOTrainer.step on every rank (EP forward/backward, gradient sync, Adam);
3. sync: the buffer moves to version i + 1 (tokens of i + 1 may now arrive), the EP state is
   gathered to rank 0 and published; once committed on the live workers the coordinator moves
   to i + 1 (new leases record it);
4. metrics: one JSON line in metrics.jsonl (docs/RL.md section 7);
5. checkpoint every ``checkpoint_every`` iterations and after the last: every rank's model and
   optimiser state (gathered to rank 0), the buffer, the pool, the controller's counters.

On resume the run goes back to its newest complete checkpoint: metrics.jsonl keeps the
iterations up to it and the lines of later ones (trained, then lost with the trainer) move to
metrics-rolled-back.jsonl, so metrics.jsonl has each iteration once, in order.
"""

import json
import logging
import os
import time

import torch
import torch.distributed as dist

from ..coordinator.protocol import RLError
from .checkpoint import CheckpointWriter
from .trainer import GRPOTrainer

log = logging.getLogger("proxyep.rl.train")


def _broadcast(obj):
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def checkpoint_store(config, run_dir):
    from .object_store import DirectoryStore, S3Store

    if config.checkpoint_s3:
        return S3Store(**config.checkpoint_s3)
    return DirectoryStore(config.checkpoint_dir or os.path.join(run_dir, "checkpoints"))


def build_trainer_model(config, group):
    """(model, the deep_ep Buffer or None): TinyMoELM over ``group`` with its exchange through
    deep_ep, or through all_to_all_single (config.trainer.exchange = "a2a")."""
    from proxyep.moe.model import TinyMoELM

    kwargs = config.model.model_kwargs()
    if config.trainer.exchange == "a2a":
        from proxyep.moe.a2a_exchange import AllToAllExchange

        return TinyMoELM(group=group, exchange=AllToAllExchange(group), **kwargs), None
    import deep_ep

    buffer = deep_ep.Buffer(group, num_nvl_bytes=1 << 22, num_rdma_bytes=1 << 22, explicitly_destroy=True)
    return TinyMoELM(group=group, buffer=buffer, **kwargs), buffer


class TrainerRun:
    def __init__(self, config, run_dir, resume, publish=None):
        self.config, self.run_dir, self.publish = config, run_dir, publish
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        if self.world != config.trainer.ranks:
            raise RLError(f"trainer: launched with {self.world} ranks, the config says trainer.ranks = "
                          f"{config.trainer.ranks}")
        self.model, self.ep_buffer = build_trainer_model(config, dist.group.WORLD)
        g = config.grpo
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=g.lr)
        from .tasks import AdditionTask

        self.trainer = GRPOTrainer(self.model, self.optimizer, dist.group.WORLD, g.loss, g.temperature,
                                   pad_token=AdditionTask.stop_token)
        self.writer = CheckpointWriter(checkpoint_store(config, run_dir), keep=3)
        self.resume_parts = None
        self._last_pool = None  # the pool's counters at the previous iteration (per-iteration deltas)
        self.state = {"version": 0, "next_prompt": 0, "started": time.time(), "consumed": []}
        if resume:
            self._resume()

    def _resume(self):
        # Rank 0 finds the newest complete checkpoint; every rank loads that one.
        step = _broadcast(self.writer.latest() if self.rank == 0 else None)
        if step is None:
            log.info("resume: no complete checkpoint, starting from version 0")
            return
        ckpt = self.writer.load(step)
        self.model.load_state_dict(ckpt.parts[f"policy.rank{self.rank}"])
        self.optimizer.load_state_dict(ckpt.parts[f"optimizer.rank{self.rank}"])
        self.state = dict(ckpt.parts["driver"])
        self.resume_parts = ckpt.parts
        if self.rank == 0:
            self._roll_back_metrics(self.state["version"])
        log.info("resume: checkpoint %d (version %d)", step, self.state["version"])

    def _roll_back_metrics(self, version):
        path = os.path.join(self.run_dir, "metrics.jsonl")
        if not os.path.exists(path):
            return
        with open(path) as f:
            lines = f.readlines()
        keep, later = [], []
        for line in lines:
            if not line.endswith("\n"):
                later.append(line + "\n")  # torn by the kill: kept aside, never parsed as a record
                continue
            (keep if json.loads(line)["iteration"] <= version else later).append(line)
        if later:
            with open(os.path.join(self.run_dir, "metrics-rolled-back.jsonl"), "a") as f:
                f.writelines(later)
        tmp = f"{path}.tmp.{os.getpid()}"
        with open(tmp, "w") as f:
            f.writelines(keep)
        os.replace(tmp, path)
        log.info("resume: metrics.jsonl rolled back to iteration %d (%d later lines kept aside)", version,
                 len(later))

    def run(self):
        from proxyep.moe.training import gather_ep_state

        from .host import TrainHost

        host = TrainHost(self.config, self.run_dir, self.state, self.resume_parts,
                         publish=self.publish) if self.rank == 0 else None
        try:
            dense, experts = gather_ep_state(self.model)
            if host is not None:
                host.start(dense, experts)
            version = self.state["version"]
            while version < self.config.grpo.iterations:
                version = self._iteration(host, version)
            if self.ep_buffer is not None:
                self.ep_buffer.destroy()  # collective: while every rank is still here
                self.ep_buffer = None
            if host is not None:
                # The controller first: it would otherwise go on submitting after the abort (the
                # buffer admits the next version's groups), and those would never end.
                host.controller.stop()
                host.coordinator.abort(None)  # surplus rollouts: nothing more is needed
                host.wait_for_workers(self.config.rollout.drain_budget_s + 20)
                summary = host.summary(self.state.get("consumed", []))
                with open(os.path.join(self.run_dir, "summary.json"), "w") as f:
                    json.dump(summary, f, indent=1, sort_keys=True)
            return 0
        finally:
            if host is not None:
                host.close()

    def _iteration(self, host, version):
        from proxyep.moe.training import gather_ep_state

        g = self.config.grpo
        t0 = time.perf_counter()
        message = None
        if host is not None:
            try:
                shares, groups, waited = host.controller.next_batch(version, g.pop_timeout_s)
                message = {"shares": shares, "waited": waited}
            except Exception as e:  # noqa: BLE001 - every rank must hear it
                message = {"error": f"rollout phase (iteration {version}): {type(e).__name__}: {e}"}
        message = _broadcast(message)
        if "error" in message:
            raise RLError(message["error"])
        t1 = time.perf_counter()
        stats = self.trainer.step(message["shares"][self.rank])
        t2 = time.perf_counter()
        version += 1
        if host is not None:
            host.buffer.set_version(version)
        dense, experts = gather_ep_state(self.model)
        publish = None
        if host is not None:
            publish = host.publisher.publish(version, dense, experts)
            host.coordinator.set_version(version)
        t3 = time.perf_counter()
        if host is not None:
            self.state.setdefault("consumed", []).extend(s.group_id for s in groups)
            self._record(host, version, groups, stats, publish, {"rollout": t1 - t0, "train": t2 - t1, "sync": t3 - t2,
                                                                  "wait": message["waited"]})
        every = self.config.checkpoint_every
        if every and (version % every == 0 or version == g.iterations):
            self._checkpoint(host, version)
        return version

    def _record(self, host, version, groups, stats, publish, phases):
        window = host.controller.take_window()
        pool = host.coordinator.stats()
        now = time.time()
        last, self._last_pool = self._last_pool, pool
        iteration_s = phases["rollout"] + phases["train"] + phases["sync"]
        lags = {}
        for scored in groups:
            oldest = scored.oldest_version
            lag = (version - 1) - (oldest if oldest is not None else version - 1)
            lags[lag] = lags.get(lag, 0) + 1
        rewards = [r for s in groups for r in s.rewards]
        sent = sum(publish.bytes.values()) if publish is not None else 0
        sync_s = phases["sync"]
        delta = {k: pool.get(k, 0) - (last.get(k, 0) if last else 0)
                 for k in ("requeued", "interrupted", "expired", "failed_groups", "errors")}
        record = {
            "iteration": version, "time": now, "iteration_s": iteration_s,
            "rollout_s": phases["rollout"], "reward_s": window["reward_s"], "train_s": phases["train"],
            "sync_s": sync_s, "trainer_wait_s": phases["wait"],
            "rollout_tokens": window["tokens"], "rollout_tokens_per_s": window["tokens"] / iteration_s,
            "groups_completed": window["groups"], "samples_completed": window["samples"],
            "reward_mean": sum(rewards) / len(rewards), "exact_fraction": sum(1 for r in rewards if r == 1.0) / len(rewards),
            "rollout_reward_mean": (sum(window["rewards"]) / len(window["rewards"])) if window["rewards"] else None,
            "loss": stats["loss"], "clip_fraction": stats["clip_fraction"], "logprob_gap": stats["logprob_gap"],
            "kl": stats["kl"], "train_tokens": stats["tokens"],
            "weight_sync": {"bytes": sent, "seconds": publish.seconds if publish else {},
                            "gbps": sent / sync_s / 1e9 if sync_s > 0 else 0.0,
                            "committed": len(publish.committed) if publish else 0,
                            "dropped": publish.dropped if publish else {}},
            "staleness": {str(k): v for k, v in sorted(lags.items())},
            "buffer_depth": host.buffer.metrics().get("depth"),
            "filtered": window["filtered"], "failed_groups": window["failed"], "refilled": window["refilled"],
            "pool": delta, "pool_running": pool.get("running"), "pool_queued": pool.get("queued"),
        }
        with open(os.path.join(self.run_dir, "metrics.jsonl"), "a") as f:
            f.write(json.dumps(record) + "\n")

    def _checkpoint(self, host, version):
        mine = (self.model.state_dict(), self.optimizer.state_dict())
        states = [None] * self.world if self.rank == 0 else None
        dist.gather_object(mine, states, dst=0)
        if host is None:
            return
        parts = {}
        for r, (model_state, optim_state) in enumerate(states):
            parts[f"policy.rank{r}"] = model_state
            parts[f"optimizer.rank{r}"] = optim_state
        with host.controller.paused:  # the buffer, the pool and the controller at one moment
            parts["buffer"] = host.buffer.snapshot()
            parts["pool"] = host.coordinator.snapshot()
            snap = host.controller.snapshot()
        parts["controller"] = {"in_flight": snap["in_flight"], "totals": snap["totals"]}
        parts["driver"] = {"version": version, "next_prompt": snap["next_prompt"], "started": self.state["started"],
                           "consumed": list(self.state.get("consumed", []))}
        t0 = time.perf_counter()
        self.writer.save(version, parts)
        log.info("checkpoint %d written in %.2f s", version, time.perf_counter() - t0)
