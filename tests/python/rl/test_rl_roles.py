"""The roles' own logic without starting a run (roles/: environment, trainer/worker command
lines, discovery, the coordinator process): the rank variables of an indexed Job, the config
overrides of the trainer's addresses, the worker's forwarded arguments, the flag list the manifest
check reads (flags.json) against the parsers, the publisher's announcement in a real
redis-server on loopback, and ``proxyep.rl coordinator`` started and stopped by SIGTERM.
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from proxyep.rl.coordinator.protocol import RLError
from proxyep.rl.roles import coordinator as coordinator_role
from proxyep.rl.roles import trainer as trainer_role
from proxyep.rl.roles import worker as worker_role
from proxyep.rl.roles.discovery import announce_publisher, publisher_key, wait_for_publisher, withdraw_publisher
from proxyep.rl.roles.environment import default_worker_id, require_authkey, trainer_rank_environment
from proxyep.rl.run_config import RunConfig

ROLES = {"coordinator": coordinator_role, "trainer": trainer_role, "worker": worker_role}


def flags_of(parser):
    return sorted(s for a in parser._actions for s in a.option_strings if s.startswith("--") and s != "--help")


def test_flag_list_matches_the_parsers():
    """tests/deploy/validate_k8s_rl.mjs checks manifests against flags.json: it must say what the
    parsers accept (the file sits in the source tree; the build links only .py files)."""
    here = os.path.dirname(os.path.realpath(coordinator_role.__file__))
    with open(os.path.join(here, "flags.json")) as f:
        listed = json.load(f)
    for role, module in ROLES.items():
        assert listed[role] == flags_of(module.build_parser()), role


def test_indexed_job_rank_environment():
    env = {"JOB_COMPLETION_INDEX": "2", "MASTER_ADDR": "trainer-0.svc", "MASTER_PORT": "29500"}
    assert trainer_rank_environment(env, 4) == {"RANK": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                                                "WORLD_SIZE": "4"}
    # A launcher's variables are kept as they are.
    launched = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    assert trainer_rank_environment(launched, 2) == {}
    with pytest.raises(RLError, match="MASTER_ADDR and MASTER_PORT not set"):
        trainer_rank_environment({"JOB_COMPLETION_INDEX": "0"}, 2)
    with pytest.raises(RLError, match="RANK is not set"):
        trainer_rank_environment({"MASTER_ADDR": "a", "MASTER_PORT": "1"}, 2)
    with pytest.raises(RLError, match="WORLD_SIZE is 3, the config says trainer.ranks = 2"):
        trainer_rank_environment(dict(launched, WORLD_SIZE="3"), 2)
    with pytest.raises(RLError, match="outside the world"):
        trainer_rank_environment(dict(env, JOB_COMPLETION_INDEX="4"), 4)


def test_worker_id_and_authkey():
    assert default_worker_id({"HOSTNAME": "rollout-7f9c"}) == f"rollout-7f9c-{os.getpid()}"
    # The ranks of one launched worker share their launcher's pid.
    assert default_worker_id({"HOSTNAME": "h", "WORLD_SIZE": "2"}) == f"h-{os.getppid()}"
    with pytest.raises(RLError, match="PROXYEP_RL_AUTHKEY .* not set"):
        require_authkey("trainer", {})
    with pytest.raises(RLError, match="at least 16 bytes"):
        require_authkey("trainer", {"PROXYEP_RL_AUTHKEY": "abcd"})
    assert require_authkey("trainer", {"PROXYEP_RL_AUTHKEY": "ab" * 32}) == "ab" * 32


def test_trainer_addresses_override_the_config():
    config = RunConfig.from_dict({"checkpoint_s3": {"bucket": "old", "endpoint_url": "http://127.0.0.1:9"}})
    trainer_role.apply_addresses(config, "redis://redis-0:6379/0", "s3://runs/grpo/exp1")
    assert config.coordinator == "redis://redis-0:6379/0"
    assert config.checkpoint_s3 == {"bucket": "runs", "prefix": "grpo/exp1", "endpoint_url": "http://127.0.0.1:9"}
    trainer_role.apply_addresses(config, None, "/ckpt")
    assert (config.checkpoint_dir, config.checkpoint_s3) == ("/ckpt", None)
    with pytest.raises(RLError, match="expected redis://"):
        trainer_role.apply_addresses(config, "tcp://a:1", None)
    publish = trainer_role.publish_address("trainer-0.proxyep-rl-trainer:29600", "0.0.0.0")
    assert (publish.bind, publish.port, publish.advertised(29600)) == ("0.0.0.0", 29600,
                                                                        "trainer-0.proxyep-rl-trainer:29600")
    with pytest.raises(RLError, match="expected HOST:PORT"):
        trainer_role.publish_address("trainer-0", None)


def test_worker_arguments_from_the_config():
    config = RunConfig.from_dict({"rollout": {"capacity": 8, "drain_budget_s": 45, "lease_timeout_s": 12},
                                  "coordinator": "redis://redis-0:6379/0", "seed": 5})
    args = worker_role.build_parser().parse_args(["--config", "{}", "--wait-for-weights-s", "30"])
    argv = worker_role.worker_argv(config, args)
    value = {argv[i]: argv[i + 1] for i in range(0, len(argv), 2)}
    assert value["--coordinator"] == "redis://redis-0:6379/0" and value["--weights-from"] == "coordinator"
    assert (value["--capacity"], value["--drain-budget-s"], value["--seed"]) == ("8", "45", "5")
    assert json.loads(value["--coordinator-options"])["lease_timeout_s"] == 12
    assert value["--wait-for-weights-s"] == "30.0" and "--worker-id" not in value
    memory = RunConfig.from_dict({})
    with pytest.raises(RLError, match="no coordinator address"):
        worker_role.worker_argv(memory, args)
    tcp = worker_role.build_parser().parse_args(["--config", "{}", "--coordinator", "tcp://127.0.0.1:1"])
    with pytest.raises(RLError, match="give --weights-from"):
        worker_role.worker_argv(memory, tcp)


def test_publisher_announcement_in_redis(tmp_path):
    import redis

    from proxyep.rl.coordinator.redis_server import RedisServer

    with RedisServer(str(tmp_path)) as server:
        started = time.monotonic()
        with pytest.raises(RLError, match=r"no trainer announced its weight publisher in redis://.* "
                                          r"\(key proxyep:rl:publisher\) within 0.3 s"):
            wait_for_publisher(server.url, 0.3)
        assert time.monotonic() - started < 5
        mine = announce_publisher(server.url, "trainer-0.svc:29600", 0)
        assert wait_for_publisher(server.url, 1.0) == "trainer-0.svc:29600"
        # A restarted trainer replaced the announcement: the old one's withdraw leaves it.
        newer = announce_publisher(server.url, "trainer-0.svc:29601", 10)
        withdraw_publisher(server.url, mine)
        assert wait_for_publisher(server.url, 1.0) == "trainer-0.svc:29601"
        withdraw_publisher(server.url, newer)
        client = redis.Redis.from_url(server.url)
        assert client.get(publisher_key()) is None
        client.close()


def test_coordinator_role_serves_until_sigterm(tmp_path):
    """The role prints the URL once redis answers, keeps the append-only file in --dir, and on
    SIGTERM stops redis and exits 0 (the redis process is gone too)."""
    import redis

    url_file = tmp_path / "url"
    proc = subprocess.Popen([sys.executable, "-m", "proxyep.rl", "coordinator", "--dir", str(tmp_path / "data"),
                             "--port", "0", "--url-file", str(url_file), "--config", '{"redis_appendfsync": "always"}'],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not url_file.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the coordinator wrote no URL within 30 s"
            time.sleep(0.05)
        url = url_file.read_text().strip()
        assert url.startswith("redis://127.0.0.1:")
        client = redis.Redis.from_url(url, socket_timeout=5)
        client.set("k", "v")
        assert client.config_get("appendfsync") == {"appendfsync": "always"}
        redis_pid = client.info("server")["process_id"]
        client.close()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert out.decode().strip() == url and b"SIGTERM" in err
        assert not os.path.exists(f"/proc/{redis_pid}") or open(f"/proc/{redis_pid}/stat").read().split()[2] == "Z"
        assert any(name.startswith("appendonly") for name in os.listdir(tmp_path / "data"))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
