"""Rollout workers (docs/RL.md section 3): batched sampling on the EP model (generation.py), the
worker's lease / generate / report loop over its EP group (loop.py), stop notices for Spot
draining (spot.py) and the worker process, ``python3 -m proxyep.rl.rollout.worker`` (worker.py)."""
