"""The daemons: ``jobqueue worker`` (with ``--processes``, a supervisor of worker processes;
``--reload`` restarts it on code changes) and ``jobqueue scheduler``."""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import shlex
import signal
import sys
from typing import Any

import click

from jobqueue.cli.common import (
    FiniteFloat,
    State,
    load_app,
    pass_state,
)
from jobqueue.errors import (
    ConfigError,
)
from jobqueue.recurring.config import SchedulerConfig
from jobqueue.runtime import logs
from jobqueue.runtime import metrics as metrics_mod
from jobqueue.settings import Settings
from jobqueue.store.connection import redact
from jobqueue.store.keys import MAX_PARTITIONS, validate_queue_name
from jobqueue.worker.config import DEFAULT_CONCURRENCY, DEFAULT_GRACE_S
from jobqueue.worker.supervisor import SUPERVISED_ENV

# --metrics-port / --metrics-host, shared by the two daemons.
_metrics_port = click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    help="Serve Prometheus metrics on this port (0: any free port; needs prometheus-client, "
    "the metrics extra of jobqueue-redis).",
)


_metrics_host = click.option(
    "--metrics-host", default="127.0.0.1", show_default=True, help="Address for --metrics-port."
)


_connect_timeout = click.option(
    "--connect-timeout",
    type=FiniteFloat(0),
    help="Seconds to keep trying while Redis is unreachable at start, then exit 3. "
    "[default: for ever, with a log line per try]",
)


_queue_gauges = click.option(
    "--queue-gauges",
    is_flag=True,
    help="Also export the queue gauges (runs due, running, dead; lease expiries; pauses and "
    "limits) on --metrics-port. Every daemon would export the same values (they are the "
    "queues', not the daemon's): give this flag to one daemon only.",
)


def _dump_stacks_on_sigusr1() -> None:
    """`kill -USR1 PID` prints every thread's stack to stderr: what a daemon that seems stuck
    is doing, without stopping it."""
    # The process's own stderr (sys.stderr may be replaced, e.g. by a test runner's capture).
    stream = sys.__stderr__
    if stream is None:
        return
    with contextlib.suppress(ValueError, OSError):  # no file descriptor: nothing to dump to
        faulthandler.register(signal.SIGUSR1, file=stream, all_threads=True, chain=False)


class ProcessCount(click.IntRange):
    """A number of worker processes, 1 to 256, or ``auto``: one per CPU this process may
    run on (a Python process runs one core's worth of Python at a time)."""

    name = "integer or auto"

    def __init__(self) -> None:
        super().__init__(1, 256)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and value.strip().lower() == "auto":
            from jobqueue.worker.supervisor import cpu_count

            return min(cpu_count(), 256)
        return super().convert(value, param, ctx)


@click.command()
@click.option("--app", "app_spec", required=True, help="module:attribute of your JobQueue.")
@click.option(
    "--queue",
    "queues",
    multiple=True,
    help="Queue to serve, in priority order (repeat for several). Default: the queues the "
    "app's tasks name.",
)
@click.option(
    "--concurrency",
    default=DEFAULT_CONCURRENCY,
    show_default=True,
    type=click.IntRange(1, 10_000),
)
@click.option(
    "--lease",
    type=FiniteFloat(0.1),
    help="Lease in seconds; heartbeats every lease/3.  [default: the app's "
    f"Settings.default_lease_s, {Settings().default_lease_s:g}]",
)
@click.option(
    "--grace",
    default=DEFAULT_GRACE_S,
    show_default=True,
    type=FiniteFloat(0),
    help="Seconds in-flight runs get to finish on SIGTERM before release.",
)
@click.option(
    "--processes",
    default="1",
    show_default=True,
    type=ProcessCount(),
    help="Worker processes under one supervisor that restarts dead children; auto: one per "
    "CPU this process may run on.",
)
@click.option(
    "--max-runs-per-child",
    type=click.IntRange(1),
    metavar="K",
    help="Recycle a worker process once it has finished this many runs: it stops claiming, "
    "lets its runs finish and commit, exits, and the supervisor starts a new one at once "
    "(for task code that leaks). Implies a supervisor (--processes 1 unless given).",
)
@click.option(
    "--max-memory-per-child",
    type=FiniteFloat(0, min_open=True),
    metavar="MB",
    help="Recycle a worker process as above once its resident memory exceeds this many MB "
    "after a run finished (checked at most every 0.1 s; Linux: current RSS, elsewhere the "
    "peak). Implies a supervisor (--processes 1 unless given).",
)
@_metrics_port
@_metrics_host
@click.option(
    "--burst",
    is_flag=True,
    help="Run what is due, then exit 0 once nothing is due and no run is held (tests, CI, "
    "cron-style batches).",
)
@click.option(
    "--reload",
    is_flag=True,
    help="Development: restart the worker when a file under the current directory changes "
    "(needs the reload extra: watchfiles).",
)
@_queue_gauges
@_connect_timeout
@pass_state
def worker(
    state: State,
    app_spec: str,
    queues: tuple[str, ...],
    concurrency: int,
    lease: float | None,
    grace: float,
    processes: int,
    max_runs_per_child: int | None,
    max_memory_per_child: float | None,
    metrics_port: int | None,
    metrics_host: str,
    burst: bool,
    reload: bool,
    queue_gauges: bool,
    connect_timeout: float | None,
) -> None:
    """Run a worker: claim runs, execute them, heartbeat leases, commit with fences."""
    from jobqueue.worker.daemon import Worker

    if burst and processes > 1:
        raise ConfigError("--burst drains in one process: use it with --processes 1")
    recycling = max_runs_per_child is not None or max_memory_per_child is not None
    if burst and recycling:
        given = "--max-runs-per-child" if max_runs_per_child is not None else (
            "--max-memory-per-child"
        )
        raise ConfigError(
            f"{given} recycles the supervised processes of a worker that runs until stopped; "
            "--burst exits once nothing is due: not both"
        )
    if reload:
        _reload_worker(burst, processes)
        return
    if metrics_port is not None and processes > 1:
        # Every child would bind the same port: refused before any child is started.
        raise ConfigError("--metrics-port serves one process: use it with --processes 1")
    if queue_gauges and metrics_port is None:
        raise ConfigError("--queue-gauges exports on --metrics-port: give both")
    # Until the worker installs its draining handler it holds no run: a SIGTERM while the app
    # imports or Redis connects is a clean exit, not a death by signal.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    _dump_stacks_on_sigusr1()
    for name in queues:
        validate_queue_name(name)  # as enqueue --queue does: before anything connects
    app = load_app(app_spec)
    jq = state.jq(app, patient=True, timeout=connect_timeout)
    if (processes > 1 or recycling) and not os.environ.get(SUPERVISED_ENV):
        from jobqueue.worker.supervisor import supervise

        sys.exit(supervise(processes, sys.argv, jq.url or "", grace=grace))
    logging.getLogger("jobqueue").info("connected to %s", redact(jq.url or ""))
    served: list[str] = []
    m = metrics_mod.for_daemon(
        "worker", metrics_port, metrics_host, jq, lambda: served, queue_gauges
    )
    # JSON logs: what tasks print becomes log lines, so the stream stays JSON (docs/operations)
    restore = logs.capture_task_output() if logs.json_configured() else None
    try:
        daemon = Worker(
            jq, queues or None, concurrency=concurrency, lease=lease, grace=grace, metrics=m,
            burst=burst, max_runs=max_runs_per_child, max_memory_mb=max_memory_per_child,
        )
        served.extend(daemon.queues)
        code = daemon.run()
        if daemon.recycled is not None:
            from jobqueue.worker.recycling import report_to_supervisor

            report_to_supervisor(daemon.recycled)
    finally:
        if restore is not None:
            restore()
    m.close()
    sys.exit(code)


def _reload_worker(burst: bool, processes: int) -> None:
    """Run this same command without --reload in a child process, restarted whenever a Python
    file under the current directory changes (watchfiles' PythonFilter: a log file written
    there must not restart it)."""
    try:
        import watchfiles
    except ImportError:
        raise ConfigError(
            "--reload needs watchfiles: pip install watchfiles (or the reload extra: "
            "pip install '.[reload]' in a clone)"
        ) from None
    if burst:
        raise ConfigError("--reload restarts a worker that runs until stopped: not with --burst")
    command = [sys.executable, "-m", "jobqueue.cli", *(a for a in sys.argv[1:] if a != "--reload")]
    click.echo(f"reloading on changes under {os.getcwd()}", err=True)
    watchfiles.run_process(
        os.getcwd(),
        target=shlex.join(command),
        target_type="command",
        watch_filter=watchfiles.PythonFilter(),
    )


# The scheduler's defaults (its options' defaults): SchedulerConfig is their one source.
_SCHEDULER = SchedulerConfig()


@click.command()
@click.option("--app", "app_spec", help="module:attribute of your JobQueue (optional).")
@click.option(
    "--lookahead",
    default=_SCHEDULER.lookahead,
    show_default=True,
    type=FiniteFloat(0),
    help="Create runs this many seconds before their fire time.",
)
@click.option(
    "--interval", default=_SCHEDULER.interval, show_default=True, type=FiniteFloat(0.01)
)
@click.option(
    "--misfire-grace",
    default=_SCHEDULER.misfire_grace,
    show_default=True,
    type=FiniteFloat(0),
    help="A fire time later than this (at least 2 x --interval) is a misfire (its job's "
    "policy decides).",
)
@click.option(
    "--batch", default=_SCHEDULER.batch, show_default=True, type=click.IntRange(1, 100_000)
)
@click.option(
    "--partitions",
    type=click.IntRange(1, MAX_PARTITIONS),
    help="Scheduler partitions K (default: what Redis records, else 1 on a single server and "
    "4 x the masters on a cluster; change it with `jobqueue schedules repartition`).",
)
@click.option(
    "--partition-lease",
    default=_SCHEDULER.partition_lease,
    show_default=True,
    type=FiniteFloat(0.1),
    help="Seconds a scheduler's lease on each scheduler partition it owns lasts unrenewed: "
    "how soon the others take over the partitions of one that died.",
)
@click.option(
    "--max-lookahead",
    type=FiniteFloat(0),
    help="How far the lookahead may grow so that a herd is created before it fires, at the "
    "creation rate measured.  [default: 10 x --lookahead]",
)
@click.option(
    "--create-rate",
    default=_SCHEDULER.create_rate,
    show_default=True,
    type=FiniteFloat(1),
    help="Runs/s assumed until this scheduler has measured its own creation rate.",
)
@click.option(
    "--prune",
    is_flag=True,
    help="At start, remove the schedules declared in code (--app) that are no longer "
    "declared; schedules added at run time are never removed.",
)
@_metrics_port
@_metrics_host
@_queue_gauges
@_connect_timeout
@pass_state
def scheduler(
    state: State,
    app_spec: str | None,
    lookahead: float,
    interval: float,
    misfire_grace: float,
    batch: int,
    partitions: int | None,
    partition_lease: float,
    max_lookahead: float | None,
    create_rate: float,
    prune: bool,
    metrics_port: int | None,
    metrics_host: str,
    queue_gauges: bool,
    connect_timeout: float | None,
) -> None:
    """Run a scheduler: turn recurring jobs into runs. Run several: they share the scheduler
    partitions (each owns some, under a lease; the others take over those of one that
    stops). Schedules the app declares in code (@jq.task(cron=...), jq.declare_schedule) are
    written at start."""
    from jobqueue.recurring.daemon import Scheduler

    if prune and not app_spec:
        raise click.UsageError("--prune needs --app: the app's declarations say what to keep")
    # Until the scheduler installs its own handler (in run) a SIGTERM while the app imports
    # or Redis connects is a clean exit, not a death by signal.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    _dump_stacks_on_sigusr1()
    jq = state.jq(
        load_app(app_spec) if app_spec else None, patient=True, timeout=connect_timeout
    )
    logging.getLogger("jobqueue").info("connected to %s", redact(jq.url or ""))
    m = metrics_mod.for_daemon(
        "scheduler", metrics_port, metrics_host, jq, lambda: jq.queues(), queue_gauges
    )
    config = SchedulerConfig(
        lookahead=lookahead,
        interval=interval,
        misfire_grace=misfire_grace,
        batch=batch,
        partitions=partitions,
        partition_lease=partition_lease,
        max_lookahead=max_lookahead,
        create_rate=create_rate,
        prune=prune,
    )
    daemon = Scheduler(jq, config, metrics=m)
    sys.exit(daemon.run())
