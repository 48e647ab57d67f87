"""The app bench/rate_limit.py runs its worker process with: ``call`` records when its code
starts (the host's clock, which the server on loopback shares), as a rate-limited API would
see the call arrive."""

from __future__ import annotations

import os
import time

import redis

from jobqueue import JobQueue

STARTS = "rate:starts"
jq = JobQueue()
_redis = redis.Redis.from_url(os.environ["BENCH_TASK_URL"])


@jq.task(max_attempts=1)
def call(i: int) -> None:
    started_ms = time.time() * 1000
    _redis.rpush(STARTS, f"{i} {started_ms:.3f}")
