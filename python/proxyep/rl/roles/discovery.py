"""Where the trainer's weight publisher is, kept in the coordinator's Redis store, so that rollout
workers on other machines find it without a shared file (``endpoints.json`` only works on one
machine).

The trainer's rank 0 announces ``<prefix>:publisher`` (JSON: the advertised ``host:port``, the
version published at start, who announced it and when) once its publisher is up, and withdraws it
when it closes, only if the key still holds its own announcement (a restarted trainer may have
replaced it meanwhile). A worker waits for the key, with a deadline.
"""

import json
import socket
import time

from ..coordinator.protocol import RLError

# RedisCoordinator's default key namespace: the announcement lives next to the pool's keys.
DEFAULT_PREFIX = "proxyep:rl"

# Deletes KEYS[1] only when it still holds ARGV[1]: atomic on the server, so a withdraw never
# removes the announcement of a trainer that replaced this one.
_WITHDRAW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def publisher_key(prefix=DEFAULT_PREFIX):
    return f"{prefix}:publisher"


def _client(url, timeout_s):
    import redis  # redis-py only where a Redis store is used

    return redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)


def announce_publisher(url, address, version, prefix=DEFAULT_PREFIX, timeout_s=10.0):
    """Writes the announcement; returns the value written (what ``withdraw_publisher`` takes)."""
    import redis

    value = json.dumps({"address": address, "version": version, "host": socket.gethostname(),
                        "time": time.time()}, sort_keys=True)
    client = _client(url, timeout_s)
    try:
        client.set(publisher_key(prefix), value)
    except redis.exceptions.RedisError as e:
        raise RLError(f"announcing the weight publisher {address} in {url} (key {publisher_key(prefix)}): "
                      f"{type(e).__name__}: {e}") from e
    finally:
        client.close()
    return value


def withdraw_publisher(url, value, prefix=DEFAULT_PREFIX, timeout_s=5.0):
    """Removes the announcement if it is still ``value``. Best effort: the trainer is stopping,
    and a stale announcement only makes a worker fail to reach it and retry."""
    import redis

    client = _client(url, timeout_s)
    try:
        client.eval(_WITHDRAW, 1, publisher_key(prefix), value)
    except redis.exceptions.RedisError:
        pass
    finally:
        client.close()


def wait_for_publisher(url, timeout_s, prefix=DEFAULT_PREFIX, poll_s=0.2, budget_s=None):
    """The announced publisher's ``host:port``; waits for the announcement (and for the store
    itself, which may still be starting) at most ``timeout_s``. ``budget_s``: the whole wait this
    call is a slice of, for the error's message (default ``timeout_s``)."""
    import redis

    key = publisher_key(prefix)
    deadline = time.monotonic() + timeout_s
    last = "no announcement yet"
    client = _client(url, min(5.0, max(0.5, timeout_s)))
    try:
        while True:
            try:
                raw = client.get(key)
                if raw is not None:
                    address = json.loads(raw)["address"]
                    host, _, port = str(address).rpartition(":")
                    if not host or not port.isdigit():
                        raise RLError(f"waiting for weights: {url} key {key} holds a malformed address {address!r}")
                    return address
            except redis.exceptions.RedisError as e:
                last = f"{type(e).__name__}: {e}"
            except (ValueError, KeyError, TypeError) as e:
                raise RLError(f"waiting for weights: {url} key {key} is not a publisher announcement: {e}") from e
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RLError(f"waiting for weights: no trainer announced its weight publisher in {url} (key {key}) "
                              f"within {budget_s or timeout_s:g} s ({last}); is the trainer running against this coordinator?")
            time.sleep(min(poll_s, remaining))
    finally:
        client.close()
