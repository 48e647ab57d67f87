"""Capacity arithmetic for N recurring jobs and what our data model costs in Redis memory.

The arithmetic is pure; the bytes per run it is given are measured on a private embedded server
by creating and finishing sample runs (``jobqueue.client.capacity``), so the figure follows the
real encoding of this version.
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


def estimate(inputs: CapacityInputs, bytes_per_run: float | None) -> CapacityResult:
    """The arithmetic; ``bytes_per_run`` None (not measured) leaves the memory line out."""
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
