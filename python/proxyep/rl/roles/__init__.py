"""The roles of a GRPO run as programs of their own (``python3 -m proxyep.rl coordinator |
trainer | worker``), for runs across machines (deploy/kubernetes/rl) and for ``proxyep rl run``,
which starts its trainer and workers through them. flags.json lists each role's command-line
flags for the offline manifest check (tests/deploy); a test keeps it equal to the parsers."""
