"""One entry point from a URL to a Coordinator, so that a command line or a config file names the
store (and rollout workers the service) the same way everywhere:

- ``memory``: a MemoryCoordinator in this process (options: lease_timeout_s, lease_tokens,
  max_attempts, clock);
- ``tcp://host:port``: a CoordinatorClient of a CoordinatorServer (options: authkey, bytes or hex,
  else the ``PROXYEP_RL_AUTHKEY`` environment variable in hex; timeout_s);
- ``redis://host:port/db``: a RedisCoordinator (options: prefix and the store's options).
"""

import inspect
import os
import urllib.parse

from .memory import MemoryCoordinator
from .protocol import RLError
from .service import CoordinatorClient


def _construct(cls, url, *args, **options):
    """cls(*args, **options), with unknown options refused by name (not as a TypeError)."""
    accepted = set(inspect.signature(cls).parameters) - {"url", "address", "client"}
    unknown = sorted(set(options) - accepted)
    if unknown:
        raise RLError(f"open_coordinator({url!r}): unknown options {unknown} (accepted: {sorted(accepted)})")
    return cls(*args, **options)


def open_coordinator(url, **options):
    if not isinstance(url, str):
        raise RLError(f"coordinator URL must be a string, got {type(url).__name__}")
    if url == "memory":
        return _construct(MemoryCoordinator, url, **options)
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "tcp":
        try:
            host, port = parts.hostname, parts.port
        except ValueError as e:
            raise RLError(f"coordinator URL {url!r}: {e}") from e
        if not host or port is None or parts.path not in ("", "/"):
            raise RLError(f"coordinator URL {url!r}: expected tcp://host:port")
        options = dict(options)
        if options.get("authkey") is None:
            env = os.environ.get("PROXYEP_RL_AUTHKEY")
            if not env:
                raise RLError(f"coordinator URL {url!r}: needs the authkey option or PROXYEP_RL_AUTHKEY (hex)")
            options["authkey"] = env
        return _construct(CoordinatorClient, url, (host, port), **options)
    if parts.scheme == "redis":
        from .redis import RedisCoordinator  # redis-py only when asked for
        return _construct(RedisCoordinator, url, url, **options)
    raise RLError(f"coordinator URL {url!r}: unknown scheme (use memory, tcp://host:port or redis://host:port/db)")
