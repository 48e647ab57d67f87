"""What runs cost in Redis memory, measured on a server (the arithmetic around it is
``jobqueue.policy.capacity``)."""

from __future__ import annotations

from typing import Any

from jobqueue.client.base import CREATE_RUN_CHUNK, ClientBase
from jobqueue.client.sync import JobQueue
from jobqueue.errors import JobQueueError
from jobqueue.store.embedded import EmbeddedServer
from jobqueue.store.io import Scripts, Steps, cmd, commands, raised
from jobqueue.store.runs import CLAIM, COMPLETE, CREATE_RUN, RunSpec
from jobqueue.store.scripts import Call


def measure_run_bytes(jq: JobQueue, samples: int = 2000) -> tuple[float, float]:
    """:func:`measure_run_bytes_steps` on a sync client."""
    return jq.run_steps(measure_run_bytes_steps(jq, samples))


def measure_run_bytes_steps(jq: ClientBase, samples: int = 2000) -> Steps[tuple[float, float]]:
    """On an empty server: the memory a scheduled run of a typical shape (run id
    ``job-N@<fire instant>``, a small payload and result) holds pending, then finished
    (record, index entry, expiry; no history when nothing notable happened)."""
    jq.declare_task("report.hourly")
    keys = jq.keys_for(jq.settings.default_queue, "x")
    lease_ms, retention_ms = jq.settings.default_lease_ms, jq.settings.done_retention_ms

    def used() -> Steps[int]:
        (info,) = raised((yield commands(cmd("info", "memory"))))
        return int(info["used_memory"])

    def run(call: Call) -> Steps[Any]:
        (reply,) = yield Scripts([call])
        return reply

    before = yield from used()
    specs = [
        RunSpec(
            f"job-{i}@2026-11-29T10:00:00Z",
            "report.hourly",
            '{"args":[12345],"kwargs":{"region":"eu-west"}}',
            job_id=f"job-{i}",
        )
        for i in range(samples)
    ]
    for start in range(0, samples, CREATE_RUN_CHUNK):
        yield from run(CREATE_RUN.call(keys, specs[start : start + CREATE_RUN_CHUNK]))
    pending = yield from used()
    done = 0
    while done < samples:
        claim = CLAIM.call(keys, CREATE_RUN_CHUNK, "w", lease_ms, 1)
        claimed = CLAIM.parse((yield from run(claim)))
        items = [(r.run_id, r.fence, '"ok"') for r in claimed.runs]
        yield from run(COMPLETE.call(keys, items, retention_ms))
        done += len(items)
    after = yield from used()
    return max(pending - before, 0) / samples, max(after - before, 0) / samples


def measure_bytes_per_run(samples: int = 2000) -> float | None:
    """A finished run's memory (``measure_run_bytes``) on a private server, or None when
    none can start."""
    try:
        server = EmbeddedServer().start()
    except JobQueueError:
        return None
    try:
        jq = JobQueue.from_url(server.url)
        finished = measure_run_bytes(jq, samples)[1]
        jq.close()
        return finished
    finally:
        server.stop()
