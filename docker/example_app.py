"""The example app of the docker compose stack (docker/compose.yaml).

Two tasks and one recurring job. Workers run it with ``jobqueue worker --app example_app:jq``;
the scheduler container first runs ``python -m example_app`` to register the recurring job
(an upsert: running it again changes nothing), then ``jobqueue scheduler --app example_app:jq``.

Enqueue from anywhere that reaches the Redis service, for instance::

    docker compose -f docker/compose.yaml exec worker-1 \\
        jobqueue enqueue send_welcome_email --args '[42]' --kwargs '{"address": "a@example.com"}'
"""

from __future__ import annotations

import json
from typing import Any

from jobqueue import JobQueue
from jobqueue.context import RunContext
from jobqueue.errors import Fatal

# No URL here: the CLI's --redis-url or $JOBQUEUE_REDIS_URL (set by compose) decides.
# Nothing connects until first use, so importing this module is free.
jq = JobQueue.from_url()

SIGNUPS = "example:signups"  # a plain Redis counter standing in for the app's database


@jq.task(max_attempts=5, timeout=30)
def send_welcome_email(user_id: int, *, address: str) -> str:
    """Retried with backoff on any error, except a bad address, which no retry can fix."""
    if "@" not in address:
        raise Fatal(f"not an e-mail address: {address!r}")
    jq.redis.incr(SIGNUPS)
    return f"welcome mail for user {user_id} sent to {address}"


@jq.task(max_attempts=3, timeout=60)
def rollup_signups(ctx: RunContext) -> dict[str, Any]:
    """The recurring job's task: publishes a summary, through a fenced write, so that an
    attempt that stalled past its lease can never overwrite a newer attempt's summary."""
    summary = {"signups": int(jq.redis.get(SIGNUPS) or 0), "fire": ctx.run_id}
    written = ctx.fenced_write("example:signup-rollup", json.dumps(summary))
    return {**summary, "written": written}


def register_schedules() -> None:
    """Every minute, a misfire after downtime fires once, never two rollups at once."""
    jq.schedule(
        "signup-rollup",
        rollup_signups,
        cron="* * * * *",
        tz="UTC",
        misfire="fire-once",
        overlap="forbid",
        jitter=5,
    )


if __name__ == "__main__":
    register_schedules()
    print("registered recurring job signup-rollup")
