"""Is the setup sound, and what will it take: ``jobqueue check`` (Redis's settings, workers for
every due run, the schedulers), ``jobqueue capacity`` (the model for N recurring jobs) and
``jobqueue jitter`` (how a herd spreads over a jitter window)."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from jobqueue.cli.common import EXIT_REFUSED, FiniteFloat, pass_state
from jobqueue.cli.output import json_option
from jobqueue.ops.capacity import measure_bytes_per_run
from jobqueue.ops.check import run as check_run
from jobqueue.policy.capacity import PERSISTENCE, CapacityInputs, estimate
from jobqueue.settings import Settings


@click.command()
@click.option("--jobs", default=5_000_000, show_default=True, type=click.IntRange(1))
@click.option(
    "--every",
    default=3600,
    show_default=True,
    type=click.IntRange(1),
    help="Seconds between runs of each job.",
)
@click.option(
    "--row-bytes",
    default=300,
    show_default=True,
    type=click.IntRange(1),
    help="Bytes per run row, for the run rows/day estimate.",
)
@click.option(
    "--retention",
    default=24 * 3600,
    show_default=True,
    type=click.IntRange(1),
    help="Seconds a finished run is kept.",
)
@click.option(
    "--jitter",
    default=60,
    show_default=True,
    type=click.IntRange(1),
    help="Jitter window of the jobs, seconds: their claims spread over it.",
)
@click.option(
    "--lookahead",
    default=60,
    show_default=True,
    type=click.IntRange(1),
    help="Seconds before its fire time a herd is created by (the schedulers' --lookahead).",
)
@click.option(
    "--master-gb",
    default=16.0,
    show_default=True,
    type=FiniteFloat(0.1),
    help="Memory each master may use, GB.",
)
@click.option(
    "--persistence",
    default="everysec",
    show_default=True,
    type=click.Choice(PERSISTENCE),
    help="AOF as configured on the masters (appendfsync).",
)
@click.option(
    "--task-seconds",
    default=0.0,
    show_default=True,
    type=FiniteFloat(0),
    help="How long a task runs (0: no-op runs), for the worker processes.",
)
@click.option(
    "--concurrency",
    default=16,
    show_default=True,
    type=click.IntRange(1),
    help="Runs one worker process runs at once (its --concurrency).",
)
@click.option(
    "--measure",
    is_flag=True,
    help="Measure a finished run's memory now on a private server instead of using the "
    "figure measured when this version was released.",
)
@json_option
def capacity(
    jobs: int,
    every: int,
    row_bytes: int,
    retention: int,
    jitter: int,
    lookahead: int,
    master_gb: float,
    persistence: str,
    task_seconds: float,
    concurrency: int,
    measure: bool,
    as_json: bool,
) -> None:
    """The capacity model for N recurring jobs (--jobs, each run every --every seconds): runs
    per day and at the top of the period, Redis memory, and how many masters, schedulers and
    worker processes they need. Per-run costs were measured here by bench/ (server CPU on
    cluster masters, AOF's cost, memory, process rates); the fleet is extrapolated from them
    (docs/operations.md, Capacity planning)."""
    inputs = CapacityInputs(
        jobs=jobs,
        every_s=every,
        row_bytes=row_bytes,
        retention_s=retention,
        jitter_window_s=jitter,
        lookahead_s=lookahead,
        master_gb=master_gb,
        persistence=persistence,
        task_seconds=task_seconds,
        concurrency=concurrency,
    )
    result = estimate(inputs, measure_bytes_per_run() if measure else None)
    if as_json:
        click.echo(json.dumps(result.to_dict()))
        return
    for line in result.lines():
        click.echo(line)


@click.command()
@click.option(
    "--lease",
    type=FiniteFloat(0.1),
    help="The shortest lease your workers (--lease) and tasks (lease=) use, in seconds, to "
    "compare with the cluster's failover time.  [default: the app's "
    f"Settings.default_lease_s, {Settings().default_lease_s:g}]",
)
@click.option(
    "--create-rate",
    type=FiniteFloat(1),
    help="Runs/s one scheduler creates, for the herd line while no scheduler has measured "
    "its own.  [default: 20000]",
)
@json_option
@pass_state
def check(state: Any, lease: float | None, create_rate: float | None, as_json: bool) -> None:
    """Is Redis set up as jobqueue's guarantees need? On a single server, or on every master
    and replica of a cluster: server version, maxmemory-policy, persistence, replicas and
    their lag, cluster-node-timeout against the lease, clock skew (host vs nodes, and between
    nodes), scripts; with recurring jobs, whether every scheduler partition has an owner while
    schedulers run and whether the largest herd can be created before it fires.
    docs/operations.md says what each line means and what to change.

    Exit code: 0 when every line is ok, 1 when any line warns, 3 when Redis is unreachable.
    """
    checks = check_run(state.jq(), lease, create_rate)
    warnings = sum(1 for c in checks if not c.ok)
    if as_json:
        click.echo(json.dumps([c.to_dict() for c in checks]))
    else:
        for c in checks:
            click.echo(c.line())
        if warnings:
            click.echo(f"{warnings} warning(s)")
    if warnings:
        sys.exit(EXIT_REFUSED)  # 1: something is not as the guarantees need


@click.command()
@click.option(
    "--jobs", default=100_000, show_default=True, type=click.IntRange(0, 10_000_000)
)
@click.option("--window", default=60, show_default=True, type=click.IntRange(0))
@click.option("--prefix", default="job-", show_default=True)
@click.option("--json", "as_json", is_flag=True)
def jitter(jobs: int, window: int, prefix: str, as_json: bool) -> None:
    """How a herd of JOBS job ids (<prefix>N) firing at once spreads over a WINDOW-second
    jitter."""
    from jobqueue.policy.jitter import herd_histogram

    counts = herd_histogram(jobs, window, prefix)
    low, high = min(counts), max(counts)
    if as_json:
        click.echo(json.dumps({"jobs": jobs, "window": window, "min": low, "max": high}))
        return
    if window <= 0:
        click.echo(f"no jitter: second 0 gets {jobs:,}")
        return
    click.echo(f"jitter = fnv1a(job_id) % {window}: min {low:,}/s, max {high:,}/s")
