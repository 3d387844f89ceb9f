"""The rollout coordinator on Redis (redis-server 7, redis-py): interface.py's semantics, the
same as MemoryCoordinator's (memory.py: its checks, error texts and snapshot format
are shared), with the state in Redis so that a coordinator process can be replaced (a new
RedisCoordinator on the same server and prefix continues where the old one stopped) and, with
the server's append-only file, a redis-server restart keeps it too.

Queue: a STREAM per priority level (``<prefix>:q:<priority>``, consumer group ``rollout``), one
entry per sample with the id ``<admission seq>-<sample index>``, so ids are admission order. The
consumer group's pending entries list (PEL) is the set of samples out of the stream: an entry
owned by a worker's consumer is a lease outstanding; an entry owned by the reserved consumer
``proxyep:requeued`` is a remainder waiting to be leased again (a release or expiry moves it
there with XCLAIM). A level's next sample is its oldest parked entry (XPENDING for that consumer,
oldest first), else the next undelivered one (XREADGROUP ``>``): parked entries were delivered
before, so their ids are older than any undelivered one, which is what keeps a requeued remainder
in its group's place. Levels are read highest first (a sorted set of the levels in use), which
gives priority across streams. Completion, failure and abort XACK and XDEL an entry. Entries of a
group held back by its policy lag are parked too (and skipped while it lasts).

State: per group a hash ``<prefix>:g:<id>`` (its spec as JSON, state, counters), per sample a
hash ``:s:<id>:<index>`` and its progress as a list of JSON chunks ``:p:<id>:<index>`` (one per
report, so Lua never parses a float), per lease a hash ``:l:<lease id>`` and its deadline in the
sorted set ``:deadlines``, counters in ``:stats``, version and sequences in ``:meta``.

Atomicity: every call is one Lua script (registered with redis-py, reloaded after a server
restart), which first requeues the leases past their deadline and then does the call's whole
transition, so a complete racing an expiry or an abort is counted exactly once. Deadlines use the
Redis server's clock (TIME) unless a clock is injected (tests). Keys are built inside the scripts
from the prefix: a single (non-cluster) server.
"""

import json

import redis

from .interface import Coordinator
from .memory import (COUNTERS, RESERVED_WORKER, SNAPSHOT_FORMAT, check_capacity, check_finish_reason,
                     check_group, check_group_id, check_lease_id, check_lease_ids, check_max_groups,
                     check_options, check_progress, check_reason, check_version, check_worker,
                     duplicate_group, lease_number, over_budget, parse_snapshot, routed_mismatch,
                     stale_lease, too_many_tokens, unknown_group, unknown_lease, wrong_worker)
from .protocol import CompletedGroup, GroupSpec, GroupState, Lease, Progress, ReleaseReason, RLError, Sample

# ARGV[1..5] of every script: prefix, now ('' = the server's TIME), lease timeout, max attempts,
# lease tokens (0 = no bound); the call's own arguments follow.
_PRELUDE = """
local P, GROUP, PARK = ARGV[1], 'rollout', '%(park)s'
local TIMEOUT, MAX_ATTEMPTS, LEASE_TOKENS = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local now
if ARGV[2] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
else
  now = tonumber(ARGV[2])
end

local function fmt(x) return string.format('%%.17g', x) end
local function k(...) return table.concat({P, ...}, ':') end
local function incr(field, n) if n ~= 0 then redis.call('HINCRBY', k('stats'), field, n) end end

local function group(gid)
  local v = redis.call('HMGET', k('g', gid), 'prio', 'seq', 'state', 'n', 'max_new', 'stop', 'lag', 'minv')
  if not v[1] then return nil end
  return {gid = gid, prio = v[1], seq = v[2], state = v[3], n = tonumber(v[4]), max_new = tonumber(v[5]),
          stop = v[6], lag = v[7], minv = tonumber(v[8])}
end

local function entry(g, i) return g.seq .. '-' .. i end

local function ensure_level(prio)
  if not redis.call('ZSCORE', k('levels'), prio) then
    redis.call('XGROUP', 'CREATE', k('q', prio), GROUP, '0', 'MKSTREAM')
    redis.call('ZADD', k('levels'), prio, prio)
  end
end

-- The sample's stream entry is done with: out of the PEL and the stream.
local function unqueue(g, i)
  local q = k('q', g.prio)
  redis.call('XACK', q, GROUP, entry(g, i))
  redis.call('XDEL', q, entry(g, i))
end

local function finish(g, i, reason)
  redis.call('HSET', k('s', g.gid, i), 'finish', reason, 'status', 'd')
  unqueue(g, i)
  incr('samples_completed', 1)
  if redis.call('HINCRBY', k('g', g.gid), 'done', 1) == g.n then
    redis.call('HSET', k('g', g.gid), 'state', 'complete')
    redis.call('ZREM', k('pending'), g.gid)
    redis.call('ZADD', k('done'), g.seq, g.gid)
    incr('completed_groups', 1)
  end
end

-- A pending group ends as failed or aborted: its leases go stale, its entries leave the queue,
-- its output is dropped.
local function drop(g, state)
  redis.call('HSET', k('g', g.gid), 'state', state)
  redis.call('ZREM', k('pending'), g.gid)
  if state == 'failed' then incr('failed_groups', 1) else incr('aborted_groups', 1) end
  for i = 0, g.n - 1 do
    local s = redis.call('HMGET', k('s', g.gid, i), 'status', 'lease')
    if s[2] and s[2] ~= '' then
      redis.call('DEL', k('l', s[2]))
      redis.call('ZREM', k('deadlines'), s[2])
    end
    if s[1] == 'q' then redis.call('HINCRBY', k('queued'), g.prio, -1) end
    if s[1] ~= 'd' then unqueue(g, i) end
    redis.call('DEL', k('s', g.gid, i), k('p', g.gid, i))
  end
end

local function content_finish(g, ntok, last)
  if ntok >= g.max_new then return 'length' end
  if g.stop ~= '' and ntok > 0 and last == g.stop then return 'stop' end
  return nil
end

-- Back in line in its place: the entry (in the PEL) goes to the parking consumer.
local function park(g, i)
  redis.call('XCLAIM', k('q', g.prio), GROUP, PARK, 0, entry(g, i), 'JUSTID')
  redis.call('HSET', k('s', g.gid, i), 'status', 'q')
  redis.call('HINCRBY', k('queued'), g.prio, 1)
end

local function requeue(g, i, charged)
  local s = redis.call('HMGET', k('s', g.gid, i), 'ntok', 'last')
  local fin = content_finish(g, tonumber(s[1]), s[2])
  if fin then finish(g, i, fin) return end
  if charged and redis.call('HINCRBY', k('s', g.gid, i), 'failures', 1) >= MAX_ATTEMPTS then
    drop(g, 'failed')
    return
  end
  incr('requeued', 1)
  park(g, i)
end

local function end_lease(lid, gid, i)
  redis.call('DEL', k('l', lid))
  redis.call('ZREM', k('deadlines'), lid)
  redis.call('HSET', k('s', gid, i), 'lease', '')
end

-- Every lease past its deadline (now > deadline), in (deadline, lease number) order.
local function reap()
  local found = redis.call('ZRANGEBYSCORE', k('deadlines'), '-inf', '(' .. fmt(now), 'WITHSCORES')
  local due = {}
  for j = 1, #found, 2 do
    due[#due + 1] = {found[j], tonumber(found[j + 1]), tonumber(string.sub(found[j], 2))}
  end
  table.sort(due, function(a, b) if a[2] ~= b[2] then return a[2] < b[2] end return a[3] < b[3] end)
  local n = 0
  for _, d in ipairs(due) do
    local L = redis.call('HMGET', k('l', d[1]), 'g', 'i')
    if L[1] then  -- not ended by an earlier one failing its group
      n = n + 1
      incr('expired', 1)
      end_lease(d[1], L[1], L[2])
      requeue(group(L[1]), L[2], true)
    end
  end
  return n
end

local function held(lid, num, worker)
  local L = redis.call('HMGET', k('l', lid), 'g', 'i', 'w', 'used', 'budget')
  if not L[1] then
    local issued = tonumber(redis.call('HGET', k('meta'), 'lease_seq') or '0')
    if num == 0 or num > issued then return nil, {'unknown'} end
    return nil, {'stale'}
  end
  if L[3] ~= worker then return nil, {'wrong', L[3]} end
  return {lid = lid, gid = L[1], i = L[2], used = tonumber(L[4]), budget = tonumber(L[5])}, nil
end

local function check_append(L, g, n, routed)
  local s = redis.call('HMGET', k('s', L.gid, L.i), 'ntok', 'routed')
  local have = tonumber(s[1])
  if have + n > g.max_new then return {'too_many', have, g.max_new} end
  if L.used + n > L.budget then return {'budget', L.used, L.budget} end
  if n > 0 and have > 0 and s[2] ~= routed then return {'routed'} end
  return nil
end

local function append(L, n, chunk, last, routed)
  if n == 0 then return end
  local sk = k('s', L.gid, L.i)
  redis.call('RPUSH', k('p', L.gid, L.i), chunk)
  redis.call('HINCRBY', sk, 'ntok', n)
  redis.call('HSET', sk, 'last', last, 'routed', routed)
  redis.call('HINCRBY', k('l', L.lid), 'used', n)
  incr('tokens_reported', n)
end

-- The lease calls' common start: ARGV[6..12] = lease id, its number, worker, n, chunk, last, routed.
local function lease_call()
  reap()
  local L, err = held(ARGV[6], tonumber(ARGV[7]), ARGV[8])
  if err then return nil, nil, err end
  return L, group(L.gid), nil
end
""" % {"park": RESERVED_WORKER}

_SCRIPTS = {
    "submit": """
reap()
local gid, prio, n = ARGV[6], ARGV[8], tonumber(ARGV[9])
if redis.call('EXISTS', k('g', gid)) == 1 then return {'dup'} end
local seq = redis.call('HINCRBY', k('meta'), 'seq', 1)
ensure_level(prio)
redis.call('HSET', k('g', gid), 'spec', ARGV[7], 'prio', prio, 'seq', seq, 'admitted', fmt(now), 'state', 'pending',
           'taken', '0', 'n', n, 'max_new', ARGV[10], 'stop', ARGV[11], 'lag', ARGV[12], 'minv', ARGV[13], 'done', 0)
redis.call('ZADD', k('groups'), seq, gid)
redis.call('ZADD', k('pending'), seq, gid)
for i = 0, n - 1 do
  redis.call('HSET', k('s', gid, i), 'ntok', 0, 'last', '', 'routed', '', 'failures', 0, 'finish', '', 'lease', '',
             'status', 'q')
  redis.call('XADD', k('q', prio), seq .. '-' .. i, 'g', gid, 'i', i)
end
redis.call('HINCRBY', k('queued'), prio, n)
incr('submitted', 1)
return {'ok'}
""",
    "lease": """
reap()
local worker, cap = ARGV[6], tonumber(ARGV[7])
local version = tonumber(redis.call('HGET', k('meta'), 'version') or '0')
local out = {}
local function leasable(g) return g.lag == '' or version - g.minv <= tonumber(g.lag) end
local function issue(g, i)
  local lid = 'L' .. redis.call('HINCRBY', k('meta'), 'lease_seq', 1)
  local sk = k('s', g.gid, i)
  local s = redis.call('HMGET', sk, 'ntok', 'failures')
  local budget = g.max_new - tonumber(s[1])
  if LEASE_TOKENS > 0 and LEASE_TOKENS < budget then budget = LEASE_TOKENS end
  local deadline = fmt(now + TIMEOUT)
  redis.call('HSET', k('l', lid), 'g', g.gid, 'i', i, 'w', worker, 'used', 0, 'budget', budget)
  redis.call('ZADD', k('deadlines'), deadline, lid)
  redis.call('HSET', sk, 'lease', lid, 'status', 'l')
  redis.call('HINCRBY', k('queued'), g.prio, -1)
  incr('leases_issued', 1)
  out[#out + 1] = {lid, g.gid, tonumber(i), deadline, tonumber(s[2]) + 1, version, budget,
                   redis.call('HGET', k('g', g.gid), 'spec'), redis.call('LRANGE', k('p', g.gid, i), 0, -1)}
end
-- An entry whose group is gone (never expected: groups clean up their entries) leaves the queue.
local function live(q, id, gid)
  local g = gid and group(gid)
  if g and g.state == 'pending' then return g end
  redis.call('XACK', q, GROUP, id)
  redis.call('XDEL', q, id)
  return nil
end
for _, prio in ipairs(redis.call('ZREVRANGE', k('levels'), 0, -1)) do
  if #out >= cap then break end
  if tonumber(redis.call('HGET', k('queued'), prio) or '0') > 0 then
    local q = k('q', prio)
    -- Remainders first (oldest id first), then entries never delivered.
    local start = '-'
    while #out < cap do
      local pend = redis.call('XPENDING', q, GROUP, start, '+', 100, PARK)
      if #pend == 0 then break end
      for _, p in ipairs(pend) do
        start = '(' .. p[1]
        if #out < cap then
          local e = redis.call('XRANGE', q, p[1], p[1])
          local g = live(q, p[1], e[1] and e[1][2][2])
          if g and leasable(g) then
            redis.call('XCLAIM', q, GROUP, worker, 0, p[1], 'JUSTID')
            issue(g, e[1][2][4])
          end
        end
      end
    end
    while #out < cap do
      local r = redis.call('XREADGROUP', 'GROUP', GROUP, worker, 'COUNT', cap - #out, 'STREAMS', q, '>')
      if not r or #r[1][2] == 0 then break end
      for _, e in ipairs(r[1][2]) do
        local g = live(q, e[1], e[2][2])
        if g then
          if leasable(g) then issue(g, e[2][4])
          else redis.call('XCLAIM', q, GROUP, PARK, 0, e[1], 'JUSTID') end
        end
      end
    end
  end
end
return out
""",
    "heartbeat": """
reap()
local worker, out = ARGV[6], {}
local deadline = fmt(now + TIMEOUT)
for j = 7, #ARGV do
  if redis.call('HGET', k('l', ARGV[j]), 'w') == worker then
    redis.call('ZADD', k('deadlines'), deadline, ARGV[j])
    out[#out + 1] = ARGV[j]
  end
end
return out
""",
    "report_partial": """
local L, g, err = lease_call()
if err then return err end
local n = tonumber(ARGV[9])
err = check_append(L, g, n, ARGV[12])
if err then return err end
append(L, n, ARGV[10], ARGV[11], ARGV[12])
redis.call('ZADD', k('deadlines'), fmt(now + TIMEOUT), L.lid)
return {'ok'}
""",
    "complete": """
local L, g, err = lease_call()
if err then return err end
local n = tonumber(ARGV[9])
err = check_append(L, g, n, ARGV[12])
if err then return err end
append(L, n, ARGV[10], ARGV[11], ARGV[12])
end_lease(L.lid, L.gid, L.i)
finish(g, L.i, ARGV[13])
return {'ok'}
""",
    "release": """
local L, g, err = lease_call()
if err then return err end
local reason = ARGV[13]
if reason == 'aborted' then
  drop(g, 'aborted')
  return {'ok'}
end
local n = tonumber(ARGV[9])
err = check_append(L, g, n, ARGV[12])
if err then return err end
append(L, n, ARGV[10], ARGV[11], ARGV[12])
if reason == 'interrupted' then incr('interrupted', 1)
elseif reason == 'draining' then incr('drained', 1)
else incr('errors', 1) end
end_lease(L.lid, L.gid, L.i)
requeue(g, L.i, reason == 'error')
return {'ok'}
""",
    "abort": """
reap()
if ARGV[7] == '1' then
  local g = group(ARGV[6])
  if not g then return {'unknown_group'} end
  if g.state ~= 'pending' then return {'ok', 0} end
  drop(g, 'aborted')
  return {'ok', 1}
end
local ids = redis.call('ZRANGE', k('pending'), 0, -1)
for _, gid in ipairs(ids) do drop(group(gid), 'aborted') end
return {'ok', #ids}
""",
    "reap": """
return reap()
""",
    "take_completed": """
reap()
local max = tonumber(ARGV[6])
local out = {}
for _, gid in ipairs(redis.call('ZRANGE', k('done'), 0, max - 1)) do
  local g = group(gid)
  local gh = redis.call('HMGET', k('g', gid), 'spec', 'admitted')
  local samples = {}
  for i = 0, g.n - 1 do
    local s = redis.call('HMGET', k('s', gid, i), 'finish', 'failures')
    samples[#samples + 1] = {s[1], tonumber(s[2]) + 1, redis.call('LRANGE', k('p', gid, i), 0, -1)}
    redis.call('DEL', k('s', gid, i), k('p', gid, i))
  end
  redis.call('HSET', k('g', gid), 'taken', '1')
  redis.call('ZREM', k('done'), gid)
  out[#out + 1] = {gh[1], gh[2], samples}
end
return out
""",
    "group_state": """
reap()
local state = redis.call('HGET', k('g', ARGV[6]), 'state')
if not state then return {'unknown_group'} end
return {'ok', state}
""",
    "set_version": """
reap()
local current = tonumber(redis.call('HGET', k('meta'), 'version') or '0')
if tonumber(ARGV[6]) < current then return {'lower', current} end
redis.call('HSET', k('meta'), 'version', ARGV[6])
return {'ok'}
""",
    "version": """
reap()
return tonumber(redis.call('HGET', k('meta'), 'version') or '0')
""",
    "stats": """
reap()
local queued = 0
for _, v in ipairs(redis.call('HVALS', k('queued'))) do queued = queued + tonumber(v) end
return {redis.call('HGETALL', k('stats')), redis.call('ZCARD', k('deadlines')), queued}
""",
    "snapshot": """
reap()
local meta = redis.call('HMGET', k('meta'), 'version', 'seq', 'lease_seq')
local groups = {}
for _, gid in ipairs(redis.call('ZRANGE', k('groups'), 0, -1)) do
  local gh = redis.call('HMGET', k('g', gid), 'spec', 'admitted', 'seq', 'state', 'taken', 'n')
  local samples = {}
  if redis.call('EXISTS', k('s', gid, 0)) == 1 then  -- output kept: pending, or complete and not taken
    for i = 0, tonumber(gh[6]) - 1 do
      local s = redis.call('HMGET', k('s', gid, i), 'failures', 'finish', 'lease')
      samples[#samples + 1] = {s[1], s[2], s[3], redis.call('LRANGE', k('p', gid, i), 0, -1)}
    end
  end
  groups[#groups + 1] = {gh[1], gh[2], gh[3], gh[4], gh[5], samples}
end
return {meta, redis.call('HGETALL', k('stats')), groups}
""",
    "restore": """
local st = cjson.decode(ARGV[6])
-- What is there now goes, found through the index structures (no key pattern to escape).
local lease_seq = tonumber(redis.call('HGET', k('meta'), 'lease_seq') or '0')
for _, gid in ipairs(redis.call('ZRANGE', k('groups'), 0, -1)) do
  local n = tonumber(redis.call('HGET', k('g', gid), 'n') or '0')
  for i = 0, n - 1 do redis.call('DEL', k('s', gid, i), k('p', gid, i)) end
  redis.call('DEL', k('g', gid))
end
for _, lid in ipairs(redis.call('ZRANGE', k('deadlines'), 0, -1)) do redis.call('DEL', k('l', lid)) end
for _, prio in ipairs(redis.call('ZRANGE', k('levels'), 0, -1)) do redis.call('DEL', k('q', prio)) end
redis.call('DEL', k('meta'), k('stats'), k('groups'), k('pending'), k('done'), k('levels'), k('queued'),
           k('deadlines'))
-- Lease ids issued here before stay stale: the counter never goes back.
if st.lease_seq > lease_seq then lease_seq = st.lease_seq end
redis.call('HSET', k('meta'), 'version', st.version, 'seq', st.next_seq - 1, 'lease_seq', lease_seq)
for name, v in pairs(st.counters) do redis.call('HSET', k('stats'), name, v) end
local leased = {}
for _, g in ipairs(st.groups) do
  redis.call('HSET', k('g', g.gid), 'spec', g.spec, 'prio', g.prio, 'seq', g.seq, 'admitted', g.admitted,
             'state', g.state, 'taken', g.taken, 'n', g.n, 'max_new', g.max_new, 'stop', g.stop, 'lag', g.lag,
             'minv', g.minv, 'done', 0)
  redis.call('ZADD', k('groups'), g.seq, g.gid)
  if g.state == 'pending' then redis.call('ZADD', k('pending'), g.seq, g.gid) end
  if g.state == 'complete' and g.taken == '0' then redis.call('ZADD', k('done'), g.seq, g.gid) end
  local done = 0
  for j, s in ipairs(g.samples) do
    local i = j - 1
    local status = 'q'
    if s.finish ~= '' then status = 'd' end
    redis.call('HSET', k('s', g.gid, i), 'ntok', s.ntok, 'last', s.last, 'routed', s.routed, 'failures', s.failures,
               'finish', s.finish, 'lease', '', 'status', status)
    if s.chunk ~= '' then redis.call('RPUSH', k('p', g.gid, i), s.chunk) end
    if s.finish ~= '' then
      done = done + 1
    elseif g.state == 'pending' then
      ensure_level(g.prio)
      redis.call('XADD', k('q', g.prio), g.seq .. '-' .. i, 'g', g.gid, 'i', i)
      redis.call('HINCRBY', k('queued'), g.prio, 1)
      if s.leased == 1 then leased[#leased + 1] = {g.gid, i} end
    end
  end
  redis.call('HSET', k('g', g.gid), 'done', done)
end
-- Leases outstanding at snapshot time died with it: their remainders are requeued.
for _, x in ipairs(leased) do
  local g = group(x[1])
  local s = redis.call('HMGET', k('s', g.gid, x[2]), 'ntok', 'last')
  local fin = content_finish(g, tonumber(s[1]), s[2])
  if fin then
    redis.call('HINCRBY', k('queued'), g.prio, -1)
    finish(g, x[2], fin)
  else
    incr('requeued', 1)
  end
end
return {'ok'}
""",
}


def _text(x):
    """Replies as str whether or not the client decodes responses."""
    if isinstance(x, bytes):
        return x.decode()
    if isinstance(x, list):
        return [_text(v) for v in x]
    return x


def _chunk(progress):
    """(n, chunk, last, routed) script arguments for appending ``progress``."""
    n = len(progress.tokens)
    if not n:
        return ["0", "", "", "0"]
    return [str(n), json.dumps(progress.to_dict()), str(progress.tokens[-1]),
            "1" if progress.routed_experts is not None else "0"]


def _progress(chunks):
    p = Progress()
    for chunk in chunks:
        p.extend(Progress.from_dict(json.loads(chunk)))
    return p


class RedisCoordinator(Coordinator):
    """``url``: redis://host:port/db, or a redis.Redis client (not closed by close()).
    ``prefix``: the key namespace (several coordinators can share one server). ``clock``: None
    for the server's clock, else a callable (tests). ``timeout_s``: the socket deadline of every
    call made through a client created here."""

    def __init__(self, url, prefix="proxyep:rl", lease_timeout_s=30.0, lease_tokens=None, max_attempts=3,
                 clock=None, timeout_s=10.0):
        check_options(lease_timeout_s, lease_tokens, max_attempts)
        if clock is not None and not callable(clock):
            raise RLError("clock must be None or callable")
        if not isinstance(prefix, str) or not prefix:
            raise RLError(f"prefix must be a non-empty string, got {prefix!r}")
        if isinstance(url, redis.Redis):
            self._redis, self._own = url, False
            kw = url.connection_pool.connection_kwargs
            self._where = f"redis://{kw.get('host', '?')}:{kw.get('port', '?')}/{kw.get('db', 0)}"
        elif isinstance(url, str):
            try:
                self._redis = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
            except ValueError as e:
                raise RLError(f"redis coordinator: bad URL {url!r} ({e})") from e
            self._own, self._where = True, url
        else:
            raise RLError(f"RedisCoordinator takes a redis:// URL or a redis.Redis client, got {type(url).__name__}")
        self.prefix = prefix
        self._clock = clock
        self._common = [prefix, repr(float(lease_timeout_s)), str(max_attempts), str(lease_tokens or 0)]
        self._scripts = {name: self._redis.register_script(_PRELUDE + body) for name, body in _SCRIPTS.items()}

    def _run(self, name, *args):
        now = "" if self._clock is None else repr(float(self._clock()))
        argv = [self._common[0], now] + self._common[1:] + list(args)
        try:
            return _text(self._scripts[name](keys=[], args=argv))
        except redis.RedisError as e:
            raise RLError(f"redis coordinator at {self._where} (prefix {self.prefix}): {name}: {e}") from e

    @staticmethod
    def _refused(reply, lease_id=None, worker_id=None, n=0):
        """Raises what a script's status says; returns the rest of an 'ok' reply."""
        status = reply[0]
        if status == "ok":
            return reply[1:]
        if status == "unknown":
            raise unknown_lease(lease_id)
        if status == "stale":
            raise stale_lease(lease_id)
        if status == "wrong":
            raise wrong_worker(lease_id, reply[1], worker_id)
        if status == "too_many":
            raise too_many_tokens(lease_id, reply[1], n, reply[2])
        if status == "budget":
            raise over_budget(lease_id, reply[1], n, reply[2])
        if status == "routed":
            raise routed_mismatch(lease_id)
        raise RLError(f"redis coordinator: unexpected reply {reply!r}")

    def _lease_call(self, name, lease_id, worker_id, progress, *extra):
        args = [lease_id, str(lease_number(lease_id) or 0), worker_id] + _chunk(progress) + list(extra)
        self._refused(self._run(name, *args), lease_id, worker_id, len(progress.tokens))

    # -- the interface --

    def submit(self, group):
        spec = check_group(group)
        s = spec.sampling
        reply = self._run("submit", spec.group_id, json.dumps(spec.to_dict()), str(spec.priority),
                          str(spec.num_samples), str(s.max_new_tokens), "" if s.stop_token is None else str(s.stop_token),
                          "" if spec.max_policy_lag is None else str(spec.max_policy_lag), str(spec.min_version))
        if reply[0] == "dup":
            raise duplicate_group(spec.group_id)
        self._refused(reply)

    def lease(self, worker_id, capacity):
        check_worker(worker_id)
        check_capacity(capacity)
        leases = []
        for lid, gid, index, deadline, attempt, version, budget, spec, chunks in self._run("lease", worker_id,
                                                                                          str(capacity)):
            spec = GroupSpec.from_dict(json.loads(spec))
            leases.append(Lease(lid, gid, index, worker_id, spec.prompt, _progress(chunks), spec.sampling, budget,
                                float(deadline), attempt, version))
        return leases

    def heartbeat(self, worker_id, lease_ids):
        check_worker(worker_id)
        return self._run("heartbeat", worker_id, *check_lease_ids(lease_ids))

    def report_partial(self, lease_id, worker_id, progress):
        check_lease_id(lease_id)
        check_worker(worker_id)
        self._lease_call("report_partial", lease_id, worker_id, check_progress(progress))

    def complete(self, lease_id, worker_id, progress, finish_reason):
        check_lease_id(lease_id)
        check_worker(worker_id)
        progress = check_progress(progress)
        check_finish_reason(finish_reason)
        self._lease_call("complete", lease_id, worker_id, progress, finish_reason)

    def release(self, lease_id, worker_id, reason, progress=None):
        check_lease_id(lease_id)
        check_worker(worker_id)
        reason = check_reason(reason)
        progress = check_progress(progress) if progress is not None else Progress()
        if reason is ReleaseReason.aborted:
            progress = Progress()  # the group is dropped: its tokens are not checked or kept
        self._lease_call("release", lease_id, worker_id, progress, reason.value)

    def abort(self, group_id=None):
        check_group_id(group_id, allow_none=True)
        reply = self._run("abort", group_id or "", "0" if group_id is None else "1")
        if reply[0] == "unknown_group":
            raise unknown_group(group_id)
        return self._refused(reply)[0]

    def reap(self):
        return self._run("reap")

    def take_completed(self, max_groups=None):
        check_max_groups(max_groups)
        out = []
        for spec, admitted, samples in self._run("take_completed", str(max_groups or 0)):
            spec = GroupSpec.from_dict(json.loads(spec))
            out.append(CompletedGroup(spec, [
                Sample(spec.group_id, i, list(spec.prompt), _progress(chunks), finish, attempts)
                for i, (finish, attempts, chunks) in enumerate(samples)], float(admitted)))
        return out

    def group_state(self, group_id):
        check_group_id(group_id)
        reply = self._run("group_state", group_id)
        if reply[0] == "unknown_group":
            raise unknown_group(group_id)
        return GroupState(self._refused(reply)[0])

    def set_version(self, version):
        check_version(version, 0)
        reply = self._run("set_version", str(version))
        if reply[0] == "lower":
            check_version(version, reply[1])  # raises the shared text
        self._refused(reply)

    def version(self):
        return self._run("version")

    def stats(self):
        counters, running, queued = self._run("stats")
        out = dict.fromkeys(COUNTERS, 0)
        out.update((k, int(v)) for k, v in zip(counters[::2], counters[1::2]))
        return dict(out, running=running, queued=queued)

    def snapshot(self):
        meta, counters, groups = self._run("snapshot")
        version, seq, lease_seq = (int(x or 0) for x in meta)
        state = {"format": SNAPSHOT_FORMAT, "version": version, "next_seq": seq + 1, "lease_counter": lease_seq,
                 "counters": dict.fromkeys(COUNTERS, 0), "groups": []}
        state["counters"].update((k, int(v)) for k, v in zip(counters[::2], counters[1::2]))
        for spec, admitted, gseq, gstate, taken, samples in groups:
            state["groups"].append({
                "spec": json.loads(spec), "admitted_at": float(admitted), "seq": int(gseq), "state": gstate,
                "taken": taken == "1",
                "samples": [{"progress": _progress(chunks).to_dict(), "failures": int(failures),
                             "finish_reason": finish or None, "leased": bool(lease)}
                            for failures, finish, lease, chunks in samples]})
        return state

    def restore(self, state):
        version, next_seq, lease_counter, counters, groups = parse_snapshot(state)
        payload = {"version": version, "next_seq": next_seq, "lease_seq": lease_counter, "counters": counters,
                   "groups": []}
        for g in groups:
            spec = g["spec"]
            s = spec.sampling
            payload["groups"].append({
                "gid": spec.group_id, "spec": json.dumps(spec.to_dict()), "prio": str(spec.priority),
                "n": spec.num_samples, "max_new": s.max_new_tokens,
                "stop": "" if s.stop_token is None else str(s.stop_token),
                "lag": "" if spec.max_policy_lag is None else str(spec.max_policy_lag), "minv": spec.min_version,
                "admitted": repr(g["admitted_at"]), "seq": g["seq"], "state": g["state"].value,
                "taken": "1" if g["taken"] else "0",
                "samples": [dict(zip(("ntok", "chunk", "last", "routed"), _restored(progress)), failures=failures,
                                 finish=finish or "", leased=1 if leased else 0)
                            for progress, failures, finish, leased in g["samples"]]})
        self._refused(self._run("restore", json.dumps(payload)))

    def close(self):
        if self._own:
            self._redis.close()


def _restored(progress):
    """(ntok, chunk, last, routed) of a restored sample: its whole progress as one chunk."""
    n, chunk, last, routed = _chunk(progress)
    return int(n), chunk, last, routed if int(n) else ""
