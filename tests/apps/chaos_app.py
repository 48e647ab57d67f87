"""The app that tests/test_worker_processes.py runs in real worker processes
(``jobqueue worker --app chaos_app:jq`` with this directory on PYTHONPATH)."""

from __future__ import annotations

import json
import os
import random
import time
from typing import Any

from jobqueue import JobQueue
from jobqueue.context import RunContext

jq = JobQueue.from_url()  # the CLI points it at --redis-url before first use

# The idempotent side effect, keyed by run id: applied once whatever the number of
# executions. ``executions`` counts every attempt that reached it (at-least-once is visible).
_APPLY = """
redis.call('HINCRBY', KEYS[3], ARGV[1], 1)
if redis.call('SADD', KEYS[1], ARGV[1]) == 1 then
  redis.call('HINCRBY', KEYS[2], ARGV[1], 1)
  return 1
end
return 0
"""
APPLIED, EFFECTS, EXECUTIONS = "chaos:applied", "chaos:effects", "chaos:executions"


@jq.task(max_attempts=20)
def chaos(n: int, ctx: RunContext) -> dict[str, Any]:
    time.sleep(random.uniform(0, 0.05))  # the work: a real duration
    mine = {"fence": ctx.fence, "pid": os.getpid(), "n": n}
    if ctx.fenced_write(f"chaos:{ctx.run_id}", json.dumps(mine, sort_keys=True)):
        jq.redis.eval(_APPLY, 3, APPLIED, EFFECTS, EXECUTIONS, ctx.run_id)
    return mine


@jq.task
def stall(seconds: float, ctx: RunContext) -> dict[str, Any]:
    time.sleep(seconds)  # does not look at ctx.cancelled: a stalled process
    mine = {"fence": ctx.fence, "pid": os.getpid()}
    wrote = ctx.fenced_write(f"stall:{ctx.run_id}", json.dumps(mine, sort_keys=True))
    return {**mine, "wrote": wrote}


@jq.task(max_attempts=10)
def work(low: float, high: float) -> int:
    time.sleep(random.uniform(low, high))  # the work: a real duration
    return os.getpid()


@jq.task
def stuck_once(ctx: RunContext) -> int:
    if jq.redis.set(f"chaos:stuck:{ctx.run_id}", 1, nx=True):  # its first execution only
        time.sleep(120)  # ignores cancellation: only the process exiting ends it
    return os.getpid()



# Runs of ``capped`` in progress, all workers together: member -> when it stops counting (the
# server clock). A killed attempt's member stops counting ACTIVE_TTL_MS after it started,
# before its lease (2 s in the test, from the claim, which came first) expires: only then can
# the limit hand its slot to another worker.
_ENTER = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
local n = redis.call('ZCARD', KEYS[1])
if n > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], n) end
return n
"""
ACTIVE, MOST_ACTIVE, ACTIVE_TTL_MS = "capped:active", "capped:most", 1_500


@jq.task(max_attempts=20)
def capped(low: float, high: float, ctx: RunContext) -> int:
    member = f"{ctx.run_id}:{ctx.fence}"
    jq.redis.eval(_ENTER, 2, ACTIVE, MOST_ACTIVE, member, ACTIVE_TTL_MS)
    time.sleep(random.uniform(low, high))  # the work: a real duration
    jq.redis.zrem(ACTIVE, member)
    return os.getpid()


# The same count per limit_key (keycapped:active:<key>, the most in keycapped:most:<key>).
@jq.task(max_attempts=20)
def keycapped(key: str, low: float, high: float, ctx: RunContext) -> int:
    member = f"{ctx.run_id}:{ctx.fence}"
    active, most = f"keycapped:active:{key}", f"keycapped:most:{key}"
    jq.redis.eval(_ENTER, 2, active, most, member, ACTIVE_TTL_MS)
    time.sleep(random.uniform(low, high))  # the work: a real duration
    jq.redis.zrem(active, member)
    return os.getpid()


# A chord's steps (tests/test_workflow_processes.py): 1,000 leaves, then one gathering step
# that records each execution of its code.
@jq.task(max_attempts=20)
def leaf(i: int) -> int:
    time.sleep(random.uniform(0.02, 0.06))  # the work: a real duration
    return i


@jq.task(max_attempts=20)
def gather(results: list[int], ctx: RunContext) -> dict[str, Any]:
    jq.redis.hincrby("wf:gather", "executions", 1)
    return {"n": len(results), "in_order": results == list(range(len(results))),
            "fence": ctx.fence}
