"""Capacity arithmetic for N recurring jobs and what our data model costs in Redis memory.

The arithmetic is pure; the bytes per run are measured on a private embedded server by
creating and finishing sample runs, so the figure follows the real encoding of this version.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


def fmt(n: float) -> str:
    """Numbers as the capacity lines print them: rounded, thousands separated by commas."""
    return f"{round(n):,}"


@dataclass(frozen=True)
class CapacityInputs:
    jobs: int
    every_s: int
    row_bytes: int = 300
    retention_s: int = 24 * 3600
    jitter_window_s: int = 60


@dataclass(frozen=True)
class CapacityResult:
    inputs: CapacityInputs
    runs_per_day: float
    runs_per_second: float
    herd_without_jitter: int
    herd_with_jitter_per_s: float
    row_gb_per_day: float
    redis_bytes_per_run: float | None
    redis_gb_retained: float | None

    def lines(self) -> list[str]:
        i = self.inputs
        out = [
            f"runs/day {fmt(self.runs_per_day)}; average {fmt(self.runs_per_second)} runs/s",
            f"if every job fires at minute 0: {fmt(self.herd_without_jitter)} runs in one second",
            f"with jitter over {i.jitter_window_s} s: about {fmt(self.herd_with_jitter_per_s)}"
            " runs/s at the top of the period",
            f"run rows/day at {i.row_bytes} bytes each: {fmt(self.row_gb_per_day)} GB",
        ]
        if self.redis_bytes_per_run is not None and self.redis_gb_retained is not None:
            out.append(
                f"jobqueue in Redis: {fmt(self.redis_bytes_per_run)} bytes per finished run "
                f"(measured); {i.retention_s / 3600:g} h retention keeps "
                f"{fmt(self.runs_per_second * i.retention_s)} runs = "
                f"{self.redis_gb_retained:.1f} GB"
            )
        return out

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def estimate(inputs: CapacityInputs, bytes_per_run: float | None = None) -> CapacityResult:
    if bytes_per_run is None:
        bytes_per_run = measure_bytes_per_run()
    per_day = inputs.jobs * 86400 / inputs.every_s
    per_s = per_day / 86400
    return CapacityResult(
        inputs=inputs,
        runs_per_day=per_day,
        runs_per_second=per_s,
        herd_without_jitter=inputs.jobs,
        herd_with_jitter_per_s=inputs.jobs / max(inputs.jitter_window_s, 1),
        row_gb_per_day=per_day * inputs.row_bytes / 1e9,
        redis_bytes_per_run=bytes_per_run,
        redis_gb_retained=None
        if bytes_per_run is None
        else per_s * inputs.retention_s * bytes_per_run / 1e9,
    )


def measure_bytes_per_run(samples: int = 2000) -> float | None:
    """Create, claim and complete ``samples`` runs of a typical shape on a private server and
    return the memory each finished run holds (record, history, index entry)."""
    from jobqueue.client.sync import JobQueue
    from jobqueue.errors import JobQueueError
    from jobqueue.store.embedded import EmbeddedServer
    from jobqueue.store.runs import CLAIM, COMPLETE, CREATE_RUN, RunSpec

    try:
        server = EmbeddedServer().start()
    except JobQueueError:
        return None
    try:
        jq = JobQueue.from_url(server.url)
        jq.declare_task("report.hourly")
        keys = jq.keys_for("default", "x")
        before = int(jq.redis.info("memory")["used_memory"])
        specs = [
            RunSpec(
                f"job-{i}@2026-11-29T10:00:00Z",
                "report.hourly",
                '{"args":[12345],"kwargs":{"region":"eu-west"}}',
                job_id=f"job-{i}",
            )
            for i in range(samples)
        ]
        for start in range(0, samples, 500):
            jq.scripts.run(CREATE_RUN.call(keys, specs[start : start + 500]))
        done = 0
        while done < samples:
            claimed = CLAIM.parse(jq.scripts.run(CLAIM.call(keys, 500, "w", 30000, 1)))
            items = [(r.run_id, r.fence, '"ok"') for r in claimed.runs]
            jq.scripts.run(COMPLETE.call(keys, items, 86_400_000))
            done += len(items)
        after = int(jq.redis.info("memory")["used_memory"])
        jq.close()
        return max(after - before, 0) / samples
    finally:
        server.stop()
