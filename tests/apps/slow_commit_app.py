"""An app whose client is slow to answer pipelines, which is how the worker sends commits and
heartbeats (claims go one call at a time): a Redis that is slow to take commits, for
tests/test_worker_processes.py. Run with ``jobqueue worker --app slow_commit_app:jq`` and
$SLOW_COMMIT_URL set (no --redis-url: this JobQueue is connected already)."""

from __future__ import annotations

import os
import random
import time
from typing import Any

import redis

from jobqueue import JobQueue

COMMIT_DELAY_S = float(os.environ.get("SLOW_COMMIT_DELAY_S", "0.03"))


class SlowPipelines(redis.Redis):
    """Every pipeline (the worker's commits) is held back COMMIT_DELAY_S before it is sent."""

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Any:
        pipe = super().pipeline(transaction, shard_hint)
        execute = pipe.execute

        def slow_execute(raise_on_error: bool = True) -> Any:
            time.sleep(COMMIT_DELAY_S)  # the slow commit itself
            return execute(raise_on_error)

        pipe.execute = slow_execute  # type: ignore[method-assign]
        return pipe


jq = JobQueue(SlowPipelines.from_url(os.environ["SLOW_COMMIT_URL"], decode_responses=True))


@jq.task
def brief(max_ms: float) -> None:
    """Up to max_ms of work: slots free one at a time, not all at once."""
    time.sleep(random.uniform(0, max_ms) / 1000)  # the work: a real duration
