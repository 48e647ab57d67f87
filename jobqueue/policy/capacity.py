"""The capacity model: what N recurring jobs need (Redis masters, memory, scheduler and worker
processes), from per-run costs measured on this machine by the benches, scaled by arithmetic.
``jobqueue capacity`` prints it and docs/operations.md quotes it (a test keeps the two equal).

Measured here (``MEASURED``, each with the bench that measures it; ``bench/cluster.py`` prints
the recorded figure next to the one it measures): the server CPU one run costs on a cluster
master (created by the scheduler's scripts, claimed and completed), what AOF adds to it, the
Redis memory of a pending run, a finished run and a recurring job, and what one scheduler and
one worker process do per second. Extrapolated: everything past this machine's 2 shared cores,
i.e. that a master with a core of its own runs 1e6 / (us per run) runs a second and M masters
M times that, which holds while the partitions spread evenly (``jobqueue.store.keys``:
Placement). The planning rules on top (``HEADROOM``, ``IMBALANCE``, ``MIN_SCHEDULERS``) are
choices, stated as such.

The arithmetic is pure; ``jobqueue.ops.capacity`` measures a finished run's memory on a
private server for ``jobqueue capacity --measure``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any


@dataclass(frozen=True)
class Measured:
    """Per-run costs measured on this machine (2 cores shared by servers and clients,
    redis-server 7.0.15), and the bench that measures each."""

    # Each CPU cost is the highest of the rounds its bench measured, the worker's rate below
    # the lowest: the model plans for the worst seen. The benches, their rounds and ranges:
    # docs/performance.md, "The figures the capacity model records".
    # Server CPU per run, us: created by the scheduler (bench/scheduler.py), and its
    # claim + batched complete on cluster masters (bench/cluster.py).
    sched_us: float = 14.5
    claim_complete_us: float = 40.5
    # Server CPU per run with AOF, over none (bench/cluster.py).
    aof_everysec: float = 1.30
    aof_always: float = 1.59
    # Redis memory of a scheduled run pending and finished, and of a recurring job with its
    # counters (bench/cluster.py).
    bytes_pending: float = 452.0
    bytes_finished: float = 563.0
    bytes_job: float = 366.0
    # One scheduler process's CPU per run it plans (bench/scheduler.py).
    scheduler_us: float = 2.1
    # One worker process draining no-op runs (bench/worker.py; the slower phase).
    worker_runs_per_s: float = 15_000.0


MEASURED = Measured()

# Plan masters at half the CPU their measured cost allows: bursts, replication to replicas,
# failovers (a promoted replica takes its master's load), rewrites of the AOF.
HEADROOM = 0.5
# The busiest master's share over a fair one: at most 1.25 with the spread placement and
# P (and K) = 4 x masters (tests/test_placement.py, 200 queue names over 3-15 masters).
IMBALANCE = 1.25
# Schedulers stand by for each other: one that dies is replaced by another within its lease.
MIN_SCHEDULERS = 2
# Partitions per master the plan recommends (queues' P and the scheduler's K).
PARTITIONS_PER_MASTER = 4
PERSISTENCE = ("none", "everysec", "always")


def fmt(n: float) -> str:
    """Numbers as the capacity lines print them: rounded, thousands separated by commas."""
    return f"{round(n):,}"


def gb(n: float) -> str:
    """Bytes as GB (one decimal), or MB under 1 GB."""
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{fmt(n / 1e6)} MB"


@dataclass(frozen=True)
class CapacityInputs:
    jobs: int
    every_s: int
    row_bytes: int = 300
    retention_s: int = 24 * 3600
    jitter_window_s: int = 60
    lookahead_s: int = 60  # the scheduler creates a herd at least this long before it fires
    master_gb: float = 16.0  # memory each master may use
    persistence: str = "everysec"  # none, everysec, always
    task_seconds: float = 0.0  # how long a task runs (0: no-op)
    concurrency: int = 16  # runs one worker process runs at once


@dataclass(frozen=True)
class CapacityResult:
    inputs: CapacityInputs
    runs_per_day: float
    runs_per_second: float
    herd_without_jitter: int
    herd_with_jitter_per_s: float
    row_gb_per_day: float
    redis_bytes_per_run: float
    redis_gb_retained: float
    measured_now: bool  # bytes per run measured by this call, not the recorded figure
    used: Measured = field(default_factory=Measured)
    # The fleet.
    us_per_run: float = 0.0  # server CPU per run, scheduling + claim + complete, with AOF
    runs_per_master: float = 0.0  # planned: headroom and imbalance included
    create_per_s: float = 0.0  # the herd created within the lookahead
    claim_per_s: float = 0.0  # the herd claimed within the jitter window
    masters_by_cpu: int = 1
    memory_bytes: float = 0.0  # definitions + finished runs retained + the pending herd
    masters_by_memory: int = 1
    masters: int = 1
    schedulers: int = MIN_SCHEDULERS
    workers: int = 1
    backlog_s: float = 0.0  # without jitter: the herd's claims drained by `masters`

    def lines(self) -> list[str]:
        i, m = self.inputs, self.used
        aof = {"none": "no AOF", "everysec": "AOF everysec", "always": "AOF always"}
        defs, kept = i.jobs * m.bytes_job, self.runs_per_second * i.retention_s
        pending = i.jobs * m.bytes_pending
        task = "no-op runs" if not i.task_seconds else f"{i.task_seconds:g} s tasks"
        return [
            f"runs/day {fmt(self.runs_per_day)}; average {fmt(self.runs_per_second)} runs/s",
            f"if every job fires at minute 0: {fmt(self.herd_without_jitter)} runs in one second",
            f"with jitter over {i.jitter_window_s} s: about {fmt(self.herd_with_jitter_per_s)}"
            " runs/s at the top of the period",
            f"run rows/day at {i.row_bytes} bytes each: {fmt(self.row_gb_per_day)} GB",
            f"jobqueue in Redis: {fmt(self.redis_bytes_per_run)} bytes per finished run "
            f"(measured{' now' if self.measured_now else ''}); "
            f"{i.retention_s / 3600:g} h retention keeps {fmt(kept)} runs = "
            f"{self.redis_gb_retained:.1f} GB",
            f"server CPU per run: {m.sched_us:g} us created by the scheduler + "
            f"{m.claim_complete_us:g} us claimed and completed, x{self._aof():.2f} with "
            f"{aof[i.persistence]} = {self.us_per_run:.1f} us (measured)",
            f"per master: {fmt(self.runs_per_master)} runs/s (a core of its own, planned at "
            f"{HEADROOM:.0%} CPU, the busiest master at {IMBALANCE:g}x its share)",
            f"top of the period: the herd created within the {i.lookahead_s} s lookahead "
            f"({fmt(self.create_per_s)} runs/s) and claimed within the {i.jitter_window_s} s "
            f"jitter window ({fmt(self.claim_per_s)} runs/s): {self.masters_by_cpu} master(s)",
            f"memory: {gb(defs)} of definitions + {gb(kept * m.bytes_finished)} of finished "
            f"runs + {gb(pending)} for the herd pending = {gb(self.memory_bytes)}; the "
            f"busiest master at {IMBALANCE:g}x its share: {self.masters_by_memory} master(s) "
            f"of {i.master_gb:g} GB",
            f"=> {self.masters} master(s), each with a replica; queue and scheduler partitions "
            f"P = K = {PARTITIONS_PER_MASTER * self.masters}",
            f"=> {self.schedulers} scheduler process(es) (one plans "
            f"{fmt(1e6 / m.scheduler_us * HEADROOM)} runs/s at {HEADROOM:.0%} CPU; "
            f"{MIN_SCHEDULERS} at least, to take over from one that dies)",
            f"=> {self.workers} worker process(es) for {task} at the top of the period "
            f"({fmt(self.claim_per_s)} runs/s)",
            f"without jitter: all {fmt(i.jobs)} due in one second, a backlog the "
            f"{self.masters} master(s) claim in about {fmt(self.backlog_s)} s",
            "measured here: per-run server CPU, AOF cost, memory, process rates (bench/); "
            f"extrapolated: {self.masters} master(s) and the processes, each with a core",
        ]

    def _aof(self) -> float:
        return aof_factor(self.inputs.persistence, self.used)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def aof_factor(persistence: str, used: Measured = MEASURED) -> float:
    return {"none": 1.0, "everysec": used.aof_everysec, "always": used.aof_always}[persistence]


def masters_for(cpu_us_per_s: float) -> int:
    """Masters whose planned CPU covers ``cpu_us_per_s`` of server CPU each second."""
    return max(1, math.ceil(cpu_us_per_s * IMBALANCE / (1e6 * HEADROOM)))


def estimate(
    inputs: CapacityInputs, bytes_per_run: float | None = None, used: Measured = MEASURED
) -> CapacityResult:
    """The model. ``bytes_per_run``: a finished run's memory measured now (the recorded
    figure otherwise)."""
    if inputs.persistence not in PERSISTENCE:
        raise ValueError(f"persistence is one of {', '.join(PERSISTENCE)}")
    if bytes_per_run is not None:
        used = replace(used, bytes_finished=bytes_per_run)
    per_day = inputs.jobs * 86400 / inputs.every_s
    per_s = per_day / 86400
    aof = aof_factor(inputs.persistence, used)
    us = (used.sched_us + used.claim_complete_us) * aof
    create_per_s = inputs.jobs / max(inputs.lookahead_s, 1)
    claim_per_s = inputs.jobs / max(inputs.jitter_window_s, 1)
    # Creation comes before the fire time, claims after it (due = fire + jitter): the two
    # loads do not overlap, the larger decides.
    peak_cpu = max(create_per_s * used.sched_us, claim_per_s * used.claim_complete_us) * aof
    steady_cpu = per_s * us
    by_cpu = masters_for(max(peak_cpu, steady_cpu))
    kept = per_s * inputs.retention_s
    memory = (
        inputs.jobs * used.bytes_job + kept * used.bytes_finished + inputs.jobs * used.bytes_pending
    )
    by_memory = max(1, math.ceil(memory * IMBALANCE / (inputs.master_gb * 1e9)))
    masters = max(by_cpu, by_memory)
    schedulers = max(
        MIN_SCHEDULERS, math.ceil(create_per_s * used.scheduler_us / (1e6 * HEADROOM))
    )
    per_worker = used.worker_runs_per_s
    if inputs.task_seconds > 0:
        per_worker = min(per_worker, inputs.concurrency / inputs.task_seconds)
    workers = max(1, math.ceil(max(claim_per_s, per_s) / (per_worker * HEADROOM)))
    backlog = inputs.jobs * used.claim_complete_us * aof * IMBALANCE / (masters * 1e6 * HEADROOM)
    return CapacityResult(
        inputs=inputs,
        runs_per_day=per_day,
        runs_per_second=per_s,
        herd_without_jitter=inputs.jobs,
        herd_with_jitter_per_s=inputs.jobs / max(inputs.jitter_window_s, 1),
        row_gb_per_day=per_day * inputs.row_bytes / 1e9,
        redis_bytes_per_run=used.bytes_finished,
        redis_gb_retained=kept * used.bytes_finished / 1e9,
        measured_now=bytes_per_run is not None,
        used=used,
        us_per_run=us,
        runs_per_master=1e6 * HEADROOM / (us * IMBALANCE),
        create_per_s=create_per_s,
        claim_per_s=claim_per_s,
        masters_by_cpu=by_cpu,
        memory_bytes=memory,
        masters_by_memory=by_memory,
        masters=masters,
        schedulers=schedulers,
        workers=workers,
        backlog_s=backlog,
    )
