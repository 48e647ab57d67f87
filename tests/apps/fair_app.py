"""The app that tests/test_fair_shares_processes.py runs in real worker processes
(``jobqueue worker --app fair_app:jq`` with this directory on PYTHONPATH)."""

from __future__ import annotations

from jobqueue import JobQueue
from jobqueue.context import RunContext

jq = JobQueue.from_url()  # the CLI points it at --redis-url before first use

# Every start of a run: "<group> <run id> <fence> <attempt>" appended to STARTS (so the list
# is in start order), and the group's count of starts in STARTED.
STARTS, STARTED = "fair:starts", "fair:started"


@jq.task
def fair_start(group: str, ctx: RunContext) -> None:
    pipe = jq.redis.pipeline(transaction=True)
    pipe.rpush(STARTS, f"{group} {ctx.run_id} {ctx.fence} {ctx.attempt}")
    pipe.hincrby(STARTED, group, 1)
    pipe.execute()
