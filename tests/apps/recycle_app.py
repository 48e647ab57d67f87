"""The app of the recycling tests in tests/test_worker_processes.py (``jobqueue worker --app
recycle_app:jq --max-runs-per-child K`` / ``--max-memory-per-child MB``, this directory on
PYTHONPATH): each run counts its executions by run id, and the worker process that ran it."""

from __future__ import annotations

import os
from typing import Any

from jobqueue import JobQueue
from jobqueue.context import RunContext

jq = JobQueue.from_url()  # the CLI points it at --redis-url before first use

EXECUTIONS, PIDS = "recycle:executions", "recycle:pids"
# What ``leak`` keeps for the life of its process, as leaky task code does.
_KEPT: list[bytes] = []


def _record(ctx: RunContext) -> int:
    pid = os.getpid()
    pipe = jq.redis.pipeline(transaction=False)
    pipe.hincrby(EXECUTIONS, ctx.run_id, 1)
    pipe.sadd(PIDS, pid)
    pipe.execute()
    return pid


@jq.task(max_attempts=5)
def record(ctx: RunContext) -> int:
    return _record(ctx)


@jq.task(max_attempts=5)
def leak(mb: int, ctx: RunContext) -> dict[str, Any]:
    _KEPT.append(b"\x01" * (mb * 1024 * 1024))  # written: resident, not just reserved
    return {"pid": _record(ctx), "kept_mb": mb * len(_KEPT)}
