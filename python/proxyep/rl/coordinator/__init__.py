"""The rollout coordinator (docs/RL.md section 3): the lease protocol's vocabulary (protocol.py) and
interface (interface.py), its two stores (memory.py, embedded; redis.py, on Redis), the RPC service
that serves a store to other processes (service.py), a URL to a store (open.py), and the private
redis-server that ``proxyep rl run`` and the tests start for the Redis store (redis_server.py)."""
