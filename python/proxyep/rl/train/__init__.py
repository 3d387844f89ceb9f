"""The trainer job of a GRPO run (docs/RL.md sections 2, 4, 6): ``python3 -m proxyep.rl.train.job``
(job.py), its loop (loop.py), the EP train step (trainer.py), GRPO's arithmetic (grpo.py); what
its rank 0 hosts (host.py): the controller (controller.py), the experience buffer (experience.py),
the rewards (tasks.py); checkpoints (checkpoint.py) to a directory or S3 (object_store.py)."""
