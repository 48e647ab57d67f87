"""``bin/demo``: a real worker process serving a few runs on a private Redis, then a summary.

Also the demo's app (``jobqueue.demo:jq``), so the worker process can load the same tasks.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from typing import Any

from jobqueue.client.sync import JobQueue
from jobqueue.context import RunContext
from jobqueue.handles import RunHandle
from jobqueue.store.connection import redact
from jobqueue.store.embedded import resolve_url

jq = JobQueue.from_url()


@jq.task
def add(a: int, b: int) -> int:
    return a + b


@jq.task
async def greet(name: str) -> str:
    await asyncio.sleep(0.01)
    return f"hello, {name}"


@jq.task(max_attempts=3, backoff=0.1)
def flaky(ctx: RunContext) -> str:
    if ctx.attempt == 1:
        raise RuntimeError("the first attempt fails on purpose")
    return f"succeeded on attempt {ctx.attempt}"


def main() -> int:
    url = resolve_url(None)
    jq.use_url(url)
    print(f"Redis: {redact(url)}")
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jobqueue.cli",
            "--redis-url",
            url,
            "--log-level",
            "WARNING",
            "worker",
            "--app",
            "jobqueue.demo:jq",
            "--concurrency",
            "4",
            "--grace",
            "5",
        ]
    )
    try:
        first = add.with_options(run_id="demo-add").enqueue(2, 3)
        again = add.with_options(run_id="demo-add").enqueue(2, 3)
        print(f"enqueue add(2, 3) run_id=demo-add -> created={first.created}")
        print(f"enqueue add(2, 3) run_id=demo-add -> created={again.created} (idempotent)")
        handles: list[RunHandle[Any]] = [
            first,
            jq.enqueue(greet, "world"),
            jq.enqueue(flaky),
            add.with_options(delay=0.5).enqueue(40, 2),
        ]
        doomed = add.with_options(delay=3600).enqueue(0, 0)
        print(f"cancel a run due in an hour -> was {jq.cancel(doomed.run_id)}")
        started = time.monotonic()
        runs = [h.wait(timeout=30) for h in handles] + [doomed.refresh()]
        print(f"\n{'run id':34} {'task':6} {'state':9} {'attempts':8} result / error")
        for run in runs:
            outcome = run.result if run.state == "done" else run.error
            print(f"{run.run_id:34} {run.task:6} {run.state:9} {run.attempt:<8} {outcome!r}")
        print(f"\nall finished in {time.monotonic() - started:.2f} s")
        ok = [r.state for r in runs] == ["done", "done", "done", "done", "cancelled"]
    finally:
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(timeout=30)
        print(f"worker drained and exited with {code}")
    return 0 if ok and code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
