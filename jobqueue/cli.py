"""The ``jobqueue`` command: daemons and the operator's window onto runs and leases.

Exit codes: 0 ok, 1 operation refused (or not found), 2 usage error, 3 Redis unreachable or
credentials refused. A user's mistake is one line on stderr, never a traceback.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import re
import signal
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import IO, Any

import click
import redis

from . import logs
from . import metrics as metrics_mod
from .base import Request
from .cli_format import when
from .cli_ops import COMMANDS, confirm, progress, table
from .cli_repartition import repartition
from .cli_top import top
from .client import JobQueue
from .connection import redact
from .cron import fire_times_between
from .dashboard.cli import dashboard
from .errors import (
    ConfigError,
    ConnectionFailed,
    InvalidRunId,
    JobQueueError,
    OperationRefused,
    PayloadError,
    RunNotFound,
    UnknownTask,
)
from .recurring import MAX_BACKFILL, ScheduleInfo
from .supervisor import SUPERVISED_ENV
from .timeutil import instant_to_ms

# --metrics-port / --metrics-host, shared by the two daemons.
_metrics_port = click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    help="Serve Prometheus metrics on this port (0: any free port; needs jobqueue[metrics]).",
)
_metrics_host = click.option(
    "--metrics-host", default="127.0.0.1", show_default=True, help="Address for --metrics-port."
)

EXIT_REFUSED, EXIT_USAGE, EXIT_UNREACHABLE = 1, 2, 3

# Runs per enqueue_many call of `enqueue --from-file` (enqueue_many pipelines its script
# calls), and per backfill call of `schedules backfill`: one progress step each.
ENQUEUE_CHUNK = 1000
BACKFILL_CHUNK = 500


def _exit_code(exc: JobQueueError) -> int:
    if isinstance(exc, ConnectionFailed):
        return EXIT_UNREACHABLE
    if isinstance(exc, ConfigError | PayloadError | InvalidRunId | UnknownTask):
        return EXIT_USAGE
    if isinstance(exc, OperationRefused | RunNotFound):
        return EXIT_REFUSED
    return EXIT_REFUSED


class _Group(click.Group):
    """Turns jobqueue's typed errors into one line and an exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except JobQueueError as exc:
            click.echo(f"error: {exc}", err=True)
            ctx.exit(_exit_code(exc))
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
            # The server went away after the first PING (restart, failover, network).
            click.echo(f"error: lost the connection to Redis: {exc}", err=True)
            ctx.exit(EXIT_UNREACHABLE)


class State:
    """ctx.obj: the URL, and the JobQueue once connected. A caller may pass one in (tests do,
    with a JobQueue over fakeredis: ``CliRunner().invoke(main, args, obj=State(None, jq))``)."""

    def __init__(self, url: str | None, jq: JobQueue | None = None) -> None:
        self.url = url
        self._jq: JobQueue | None = jq

    def jq(self, app: JobQueue | None = None) -> JobQueue:
        if app is not None:
            if self.url:
                app.use_url(self.url)
            self._jq = app
        if self._jq is None:
            self._jq = JobQueue.from_url(self.url)
        self._jq.connect()
        return self._jq


pass_state = click.make_pass_decorator(State)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--redis-url",
    envvar="JOBQUEUE_REDIS_URL",
    help="redis://, rediss://, unix:// or redis+cluster:// URL (env JOBQUEUE_REDIS_URL). "
    "Without one, a private embedded server is started.",
)
@click.option(
    "--log-level",
    default="INFO",
    show_default=True,
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
)
@click.option(
    "--log-format",
    envvar="JOBQUEUE_LOG_FORMAT",
    default="text",
    show_default=True,
    type=click.Choice(["text", "json"]),
    help="json: one object per line (ts, level, logger, msg; run_id, fence, attempt on runs).",
)
@click.version_option(package_name="jobqueue")
@click.pass_context
def main(ctx: click.Context, redis_url: str | None, log_level: str, log_format: str) -> None:
    """jobqueue: a Redis-backed distributed job scheduler and task queue."""
    logs.configure(log_level, "json" if log_format == "json" else "text")
    if not isinstance(ctx.obj, State):
        ctx.obj = State(redis_url)


def load_app(spec: str) -> JobQueue:
    """``module`` or ``module:attribute`` naming a JobQueue (the operator's own code)."""
    module_name, _, attr = spec.partition(":")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # like uvicorn/celery: apps next to where you run
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"cannot import app module {module_name!r}: {exc}") from None
    app = getattr(module, attr or "jq", None)
    if not isinstance(app, JobQueue):
        raise ConfigError(f"{spec!r} is not a JobQueue (expected module:attribute, e.g. app:jq)")
    return app


_EPOCH_MS = re.compile(r"((?:retry at|due=) ?)(\d{12,})")


def _ms_to_text(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


def _json_arg(text: str, what: str, kind: type) -> Any:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise click.BadParameter(f"not valid JSON: {exc}", param_hint=what) from None
    except RecursionError:
        raise click.BadParameter("JSON nested too deeply", param_hint=what) from None
    if not isinstance(value, kind):
        raise click.BadParameter(f"must be a JSON {kind.__name__}", param_hint=what)
    return value


@main.command()
@click.option("--app", "app_spec", required=True, help="module:attribute of your JobQueue.")
@click.option("--queue", "queues", multiple=True, help="Queue to serve, in priority order.")
@click.option("--concurrency", default=8, show_default=True, type=click.IntRange(1, 10_000))
@click.option(
    "--lease",
    default=30.0,
    show_default=True,
    type=click.FloatRange(0.1),
    help="Lease in seconds; heartbeats every lease/3.",
)
@click.option(
    "--grace",
    default=30.0,
    show_default=True,
    type=click.FloatRange(0),
    help="Seconds in-flight runs get to finish on SIGTERM before release.",
)
@click.option(
    "--processes",
    default=1,
    show_default=True,
    type=click.IntRange(1, 256),
    help="Worker processes under one supervisor that restarts dead children.",
)
@_metrics_port
@_metrics_host
@pass_state
def worker(
    state: State,
    app_spec: str,
    queues: tuple[str, ...],
    concurrency: int,
    lease: float,
    grace: float,
    processes: int,
    metrics_port: int | None,
    metrics_host: str,
) -> None:
    """Run a worker: claim runs, execute them, heartbeat leases, commit with fences."""
    from .worker import Worker

    if metrics_port is not None and processes > 1:
        # Every child would bind the same port: refused before any child is started.
        raise ConfigError("--metrics-port serves one process: use it with --processes 1")
    # Until the worker installs its draining handler it holds no run: a SIGTERM while the app
    # imports or Redis connects is a clean exit, not a death by signal.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    app = load_app(app_spec)
    jq = state.jq(app)
    if processes > 1 and not os.environ.get(SUPERVISED_ENV):
        from .supervisor import supervise

        sys.exit(supervise(processes, sys.argv, jq.url or ""))
    logging.getLogger("jobqueue").info("connected to %s", redact(jq.url or ""))
    served = list(queues) or [jq.settings.default_queue]
    m = metrics_mod.for_daemon("worker", metrics_port, metrics_host, jq, lambda: served)
    code = Worker(
        jq, queues or None, concurrency=concurrency, lease=lease, grace=grace, metrics=m
    ).run()
    m.close()
    sys.exit(code)


@main.command()
@click.argument("task")
@click.option("--args", "args_json", default="[]", help="Positional arguments, a JSON array.")
@click.option("--kwargs", "kwargs_json", default="{}", help="Keyword arguments, a JSON object.")
@click.option("--run-id", help="Idempotency key: a second enqueue with it creates nothing.")
@click.option("--delay", type=click.FloatRange(0), help="Seconds from now (server clock).")
@click.option("--at", "at_text", help="ISO 8601 instant with a zone, e.g. 2026-12-01T09:00Z.")
@click.option("--queue", help="Queue (default: the task's, else 'default').")
@click.option("--max-attempts", type=click.IntRange(1), default=None)
@click.option("--app", "app_spec", help="module:attribute, to use its task options.")
@click.option(
    "--from-file",
    "from_file",
    type=click.File("r", encoding="utf-8"),
    help='JSON Lines, one run per line: {"args": [..], "kwargs": {..}, "run_id": ".."} '
    "(each key optional); - reads stdin. Validated whole before anything is written.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@pass_state
def enqueue(
    state: State,
    task: str,
    args_json: str,
    kwargs_json: str,
    run_id: str | None,
    delay: float | None,
    at_text: str | None,
    queue: str | None,
    max_attempts: int | None,
    app_spec: str | None,
    from_file: IO[str] | None,
    as_json: bool,
) -> None:
    """Enqueue one run of TASK (or one per line of --from-file, with a progress bar)."""
    if from_file is not None and (args_json != "[]" or kwargs_json != "{}" or run_id):
        raise click.UsageError("--from-file takes args, kwargs and run ids from the file")
    args = _json_arg(args_json, "--args", list)
    kwargs = _json_arg(kwargs_json, "--kwargs", dict)
    at = None
    if at_text:
        try:
            at = datetime.fromisoformat(at_text.replace("Z", "+00:00"))
        except ValueError:
            raise click.BadParameter(
                f"not an ISO 8601 instant: {at_text!r}", param_hint="--at"
            ) from None
    jq = state.jq(load_app(app_spec) if app_spec else None)
    if task not in jq.registry:
        jq.declare_task(task, queue=queue, max_attempts=max_attempts)
    if from_file is not None:
        _enqueue_file(jq, task, from_file, delay, at, queue, as_json)
        return
    handle = jq.enqueue(task, *args, run_id=run_id, delay=delay, at=at, queue=queue, **kwargs)
    _echo_handle(handle, as_json)


def _echo_handle(handle: Any, as_json: bool, created_note: str = "") -> None:
    """What enqueue and trigger print: created, or already there (nothing written)."""
    if as_json:
        click.echo(
            json.dumps({"run_id": handle.run_id, "queue": handle.queue, "created": handle.created})
        )
    elif handle.created:
        click.echo(f"created {handle.run_id} in queue {handle.queue}{created_note}")
    else:
        click.echo(f"exists  {handle.run_id} in queue {handle.queue} (nothing written)")


_LINE_KEYS = frozenset({"args", "kwargs", "run_id"})


def _file_requests(
    jq: JobQueue,
    task: str,
    lines: IO[str],
    delay: float | None,
    at: datetime | None,
    queue: str | None,
) -> list[Request]:
    """Every line parsed and validated (payload size, run id) before anything is written:
    a bad line 40,000 is a usage error naming it, not 39,999 runs and a traceback."""
    out = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{getattr(lines, 'name', 'file')} line {number}"
        try:
            item = json.loads(line)
        except ValueError as exc:
            raise click.UsageError(f"{where}: not valid JSON: {exc}") from None
        if not isinstance(item, dict) or not _LINE_KEYS.issuperset(item):
            raise click.UsageError(f"{where}: expected an object with only args, kwargs, run_id")
        args, kwargs, run_id = item.get("args", []), item.get("kwargs", {}), item.get("run_id")
        if not isinstance(args, list) or not isinstance(kwargs, dict):
            raise click.UsageError(f"{where}: args must be a JSON array, kwargs an object")
        if run_id is not None and not isinstance(run_id, str):
            raise click.UsageError(f"{where}: run_id must be a string")
        req = Request(task, args, kwargs, run_id=run_id, delay=delay, at=at, queue=queue)
        try:
            jq.prepare(req)
        except JobQueueError as exc:
            raise click.UsageError(f"{where}: {exc}") from None
        out.append(req)
    return out


def _enqueue_file(
    jq: JobQueue,
    task: str,
    lines: IO[str],
    delay: float | None,
    at: datetime | None,
    queue: str | None,
    as_json: bool,
) -> None:
    requests = _file_requests(jq, task, lines, delay, at, queue)
    created = 0
    with progress(len(requests), f"enqueueing {len(requests):,} runs") as advance:
        for start in range(0, len(requests), ENQUEUE_CHUNK):
            chunk = requests[start : start + ENQUEUE_CHUNK]
            created += sum(h.created for h in jq.enqueue_many(chunk))
            advance(len(chunk))
    existed = len(requests) - created
    if as_json:
        click.echo(json.dumps({"runs": len(requests), "created": created, "existed": existed}))
    else:
        click.echo(f"{len(requests):,} runs: {created:,} created, {existed:,} existed already")


@main.command()
@click.argument("run_id")
@click.option("--queue", help="Look only in this queue.")
@click.option("--json", "as_json", is_flag=True)
@pass_state
def show(state: State, run_id: str, queue: str | None, as_json: bool) -> None:
    """Everything about one run, with its history of attempts, owners and errors."""
    jq = state.jq()
    run = jq.get_run(run_id, queue=queue)
    if as_json:
        click.echo(json.dumps(run.to_dict(), default=str))
        return
    now = jq.server_time_ms()
    rows = [
        ("run", run.run_id),
        ("queue", f"{run.queue} (partition {run.partition})"),
        ("state", run.state),
        ("task", run.task),
        ("attempt", f"{run.attempt}/{run.max_attempts}"),
        ("fence", str(run.fence)),
        ("owner", run.owner or "-"),
        ("due", when(run.due_ms, now)),
        ("lease until", when(run.lease_until_ms, now)),
        ("created", when(run.created_ms, now)),
        ("started", when(run.started_ms, now)),
        ("finished", when(run.finished_ms, now)),
        ("payload", run.payload),
        ("result", run.result_json or "-"),
        ("error", run.error or "-"),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        click.echo(f"{key.ljust(width)}  {value}")
    click.echo("history:")
    for ms, text in run.timeline():
        # the scripts write instants as epoch ms; show them like the rest
        text = _EPOCH_MS.sub(lambda m: m.group(1) + _ms_to_text(int(m.group(2))), text)
        click.echo(f"  {_ms_to_text(ms) if ms is not None else '?'}  {text}")


_yes_option = click.option(
    "--yes", is_flag=True, help="Accepted for scripts (this command changes one run; no prompt)."
)


@main.command()
@click.argument("run_id")
@click.option("--queue")
@click.option("--reason", default="cancelled from the CLI", show_default=True)
@_yes_option
@pass_state
def cancel(state: State, run_id: str, queue: str | None, reason: str, yes: bool) -> None:
    """Cancel a pending or running run (a running worker is fenced out).

    Idempotent: an already cancelled run exits 0; a done or dead one is refused (exit 1)."""
    jq = state.jq()
    try:
        previous = jq.cancel(run_id, queue=queue, reason=reason)
    except OperationRefused:
        run = jq.find_run(run_id, queue)
        if run is None or run.state != "cancelled":
            raise
        click.echo(f"{run_id} is already cancelled (nothing to do)")
        return
    click.echo(f"cancelled {run_id} (was {previous})")


@main.command()
@click.argument("run_id")
@click.option("--queue")
@_yes_option
@pass_state
def requeue(state: State, run_id: str, queue: str | None, yes: bool) -> None:
    """Put a dead, cancelled or done run back to pending, attempts reset.

    Idempotent: an already pending run exits 0; a running one is refused (exit 1)."""
    jq = state.jq()
    try:
        previous = jq.requeue(run_id, queue=queue)
    except OperationRefused:
        run = jq.find_run(run_id, queue)
        if run is None or run.state != "pending":
            raise
        click.echo(f"{run_id} is already pending (nothing to do)")
        return
    click.echo(f"requeued {run_id} (was {previous})")


# -- recurring jobs: the scheduler daemon, `schedule ...` and `jitter` ----------------------


@main.command()
@click.option("--app", "app_spec", help="module:attribute of your JobQueue (optional).")
@click.option(
    "--lookahead",
    default=60.0,
    show_default=True,
    type=click.FloatRange(0),
    help="Create runs this many seconds before their fire time.",
)
@click.option("--interval", default=1.0, show_default=True, type=click.FloatRange(0.01))
@click.option(
    "--grace",
    default=1.0,
    show_default=True,
    type=click.FloatRange(0),
    help="A fire time later than this is a misfire (its job's policy decides).",
)
@click.option("--batch", default=1000, show_default=True, type=click.IntRange(1, 100_000))
@click.option(
    "--partitions",
    type=click.IntRange(1, 16384),
    help="Scheduler partitions K (default: what Redis records, else 1).",
)
@click.option(
    "--prune",
    is_flag=True,
    help="At start, remove the schedules declared in code (--app) that are no longer "
    "declared; schedules added at run time are never removed.",
)
@_metrics_port
@_metrics_host
@pass_state
def scheduler(
    state: State,
    app_spec: str | None,
    lookahead: float,
    interval: float,
    grace: float,
    batch: int,
    partitions: int | None,
    prune: bool,
    metrics_port: int | None,
    metrics_host: str,
) -> None:
    """Run a scheduler: turn recurring jobs into runs (any number of instances). Schedules
    the app declares in code (@jq.task(cron=...), jq.declare_schedule) are written at start."""
    from .recurring import Recurring
    from .scheduler import Scheduler

    if prune and not app_spec:
        raise click.UsageError("--prune needs --app: the app's declarations say what to keep")
    jq = state.jq(load_app(app_spec) if app_spec else None)
    logging.getLogger("jobqueue").info("connected to %s", redact(jq.url or ""))
    store = Recurring(jq, partitions) if partitions else None
    m = metrics_mod.for_daemon("scheduler", metrics_port, metrics_host, jq, lambda: jq.queues())
    daemon = Scheduler(
        jq,
        lookahead=lookahead,
        interval=interval,
        grace=grace,
        batch=batch,
        store=store,
        metrics=m,
        prune=prune,
    )
    sys.exit(daemon.run())


@main.group(cls=_Group, invoke_without_command=True)
@click.pass_context
def schedules(ctx: click.Context) -> None:
    """Recurring jobs: list (the default), show, add (upsert), pause, resume, trigger,
    backfill, remove."""
    if ctx.invoked_subcommand is None:
        ctx.invoke(schedules_list)


def _when_text(info: ScheduleInfo) -> str:
    d = info.definition
    every = f"every {d.every_ms / 1000:g}s" if d.every_ms is not None else ""
    return f"{d.cron if d.cron is not None else every} {d.tz}"


def _next_text(info: ScheduleInfo, now: int) -> str:
    if info.definition.paused:
        return "paused"
    return "ended" if info.next_fire_ms is None else when(info.next_fire_ms, now)


def _schedule_line(info: ScheduleInfo, now: int) -> str:
    """One line for what a mutating command did: enough to see its effect at a glance."""
    s = info.state
    return (
        f"{info.job_id} ({info.definition.task}, {_when_text(info)}): "
        f"{'' if info.definition.paused else 'next '}{_next_text(info, now)}; "
        f"fired {s.fired}, missed {s.missed}, "
        f"skipped {s.skipped}, dropped {s.dropped}"
    )


def _require_schedule(jq: JobQueue, job_id: str) -> ScheduleInfo:
    info = jq.get_schedule(job_id)
    if info is None:
        raise OperationRefused(f"no recurring job {job_id!r} (never added, or removed)")
    return info


@schedules.command("add")
@click.argument("job_id")
@click.argument("task")
@click.option("--cron", help="5 fields, 6 with seconds first, or an alias like @daily.")
@click.option("--every", type=float, help="Fixed interval in seconds.")
@click.option("--tz", default="UTC", show_default=True)
@click.option("--args", "args_json", default="[]", help="Positional arguments, a JSON array.")
@click.option("--kwargs", "kwargs_json", default="{}", help="Keyword arguments, a JSON object.")
@click.option("--misfire", default="fire-once", show_default=True)
@click.option("--jitter", type=float, help="Jitter window in seconds (< the period).")
@click.option("--overlap", default="allow", show_default=True, help="allow, forbid or buffer-one.")
@click.option("--queue")
@click.option("--max-attempts", type=click.IntRange(1), default=None)
@click.option("--json", "as_json", is_flag=True)
@pass_state
def schedule_add(
    state: State,
    job_id: str,
    task: str,
    cron: str | None,
    every: float | None,
    tz: str,
    args_json: str,
    kwargs_json: str,
    misfire: str,
    jitter: float | None,
    overlap: str,
    queue: str | None,
    max_attempts: int | None,
    as_json: bool,
) -> None:
    """Create or update the recurring job JOB_ID running TASK (idempotent: an upsert)."""
    args = _json_arg(args_json, "--args", list)
    kwargs = _json_arg(kwargs_json, "--kwargs", dict)
    jq = state.jq()
    info = jq.schedule(
        job_id,
        task,
        cron=cron,
        every=every,
        tz=tz,
        args=args,
        kwargs=kwargs,
        misfire=misfire,
        jitter=jitter,
        overlap=overlap,
        queue=queue,
        max_attempts=max_attempts,
    )
    if as_json:
        click.echo(json.dumps(info.to_dict()))
    else:
        click.echo(f"scheduled {_schedule_line(info, jq.server_time_ms())}")


@schedules.command("remove")
@click.argument("job_id")
@click.option("--yes", is_flag=True, help="Do not ask.")
@pass_state
def schedule_remove(state: State, job_id: str, yes: bool) -> None:
    """Remove a recurring job and its counters (runs already created stay).

    A job that is not there is refused (exit 1): a typo must not look like success."""
    jq = state.jq()
    info = _require_schedule(jq, job_id)
    confirm(f"remove recurring job {job_id!r} (fired {info.state.fired} times)?", yes)
    if not jq.unschedule(job_id):
        raise OperationRefused(f"no recurring job {job_id!r} (removed meanwhile)")
    click.echo(f"removed {job_id}; runs it created stay")


@schedules.command("pause")
@click.argument("job_id")
@pass_state
def schedule_pause(state: State, job_id: str) -> None:
    """Stop firing a recurring job until resumed (idempotent)."""
    jq = state.jq()
    if _require_schedule(jq, job_id).definition.paused:
        click.echo(f"{job_id} is already paused (nothing to do)")
        return
    click.echo(f"paused {_schedule_line(jq.pause_schedule(job_id), jq.server_time_ms())}")


@schedules.command("resume")
@click.argument("job_id")
@pass_state
def schedule_resume(state: State, job_id: str) -> None:
    """Fire again from the next fire time; those missed while paused are not fired (backfill
    them if they matter). Idempotent."""
    jq = state.jq()
    info = _require_schedule(jq, job_id)
    if not info.definition.paused:
        click.echo(
            f"{job_id} is not paused (nothing to do): next {_next_text(info, jq.server_time_ms())}"
        )
        return
    click.echo(f"resumed {_schedule_line(jq.resume_schedule(job_id), jq.server_time_ms())}")


@schedules.command("trigger")
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True)
@pass_state
def schedule_trigger(state: State, job_id: str, as_json: bool) -> None:
    """Run a recurring job now, with its own run id (<job>@manual-<now>); its schedule and
    counters are untouched. Each call is a new manual run."""
    _echo_handle(state.jq().trigger(job_id), as_json, ", due now")


def _cli_instant(text: str, what: str) -> datetime:
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise click.BadParameter(f"not an ISO 8601 instant: {text!r}", param_hint=what) from None
    if value.tzinfo is None:
        raise click.BadParameter(f"{text!r} has no time zone (add Z or +hh:mm)", param_hint=what)
    return value


def _ms_instant(ms: int) -> datetime:
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms)


def _backfill_ranges(
    info: ScheduleInfo, start: datetime, end: datetime
) -> Iterator[tuple[datetime, datetime, int]]:
    """[start, end] cut into back-to-back ranges of BACKFILL_CHUNK fire times each (ranges
    cover every instant, so no fire can fall between two), with their fire counts. Anything
    jobqueue.recurring would refuse (too many fires, end before start) is one range: its
    backfill then raises the error it always did."""
    defn = info.definition
    start_ms, end_ms = instant_to_ms(start), instant_to_ms(end)
    fires = (
        fire_times_between(
            defn.schedule, start_ms - 1, end_ms, limit=MAX_BACKFILL + 1, anchor_ms=defn.start_ms
        )
        if end_ms >= start_ms
        else []
    )
    if not fires or len(fires) > MAX_BACKFILL:
        yield start, end, len(fires)
        return
    cuts = fires[BACKFILL_CHUNK::BACKFILL_CHUNK]
    lows = [start, *(_ms_instant(c) for c in cuts)]
    highs = [*(_ms_instant(c - 1) for c in cuts), end]
    counts = [BACKFILL_CHUNK] * len(cuts) + [len(fires) - BACKFILL_CHUNK * len(cuts)]
    yield from zip(lows, highs, counts, strict=True)


@schedules.command("backfill")
@click.argument("job_id")
@click.option("--start", "start_text", required=True, help="ISO 8601 instant with a zone.")
@click.option("--end", "end_text", required=True, help="ISO 8601 instant with a zone.")
@click.option("--json", "as_json", is_flag=True)
@pass_state
def schedule_backfill(
    state: State, job_id: str, start_text: str, end_text: str, as_json: bool
) -> None:
    """Create the runs of every fire time in [start, end], due now (idempotent: fire times
    that already have a run create nothing). A progress bar on a terminal."""
    start, end = _cli_instant(start_text, "--start"), _cli_instant(end_text, "--end")
    jq = state.jq()
    ranges = list(_backfill_ranges(_require_schedule(jq, job_id), start, end))
    fires = created = 0
    with progress(sum(n for _, _, n in ranges), f"backfilling {job_id}") as advance:
        for low, high, count in ranges:
            handles = jq.backfill(job_id, low, high)
            fires, created = fires + len(handles), created + sum(h.created for h in handles)
            advance(count)
    if as_json:
        click.echo(
            json.dumps({"fire_times": fires, "created": created, "existed": fires - created})
        )
    else:
        click.echo(f"{fires} fire times: {created} runs created, {fires - created} existed")


_SCHEDULE_HEADERS = [
    "JOB",
    "TASK",
    "QUEUE",
    "SCHEDULE",
    "MISFIRE",
    "OVERLAP",
    "JITTER",
    "NEXT FIRE (UTC)",
    "LAST FIRE (UTC)",
    "FIRED",
    "MISSED",
    "SKIPPED",
    "DROPPED",
]


@schedules.command("list")
@click.option("--limit", default=1000, show_default=True, type=click.IntRange(1, 1_000_000))
@click.option("--json", "as_json", is_flag=True)
@pass_state
def schedules_list(state: State, limit: int, as_json: bool) -> None:
    """Recurring jobs: schedule, policies, next and last fire, counters (missed by misfire
    policy, skipped by overlap policy, dropped by the fire-all cap)."""
    from .inspect import schedules as read_schedules

    jq = state.jq()
    infos = read_schedules(jq, limit=limit)
    if as_json:
        click.echo(json.dumps([_schedule_dict(i) for i in infos]))
        return
    if not infos:
        click.echo("no recurring jobs")
        return
    now = jq.server_time_ms()
    rows = [
        [
            i.job_id,
            i.definition.task,
            i.definition.queue,
            _when_text(i),
            i.definition.misfire,
            i.definition.overlap,
            f"{i.definition.jitter_ms / 1000:g}s",
            _next_text(i, now),
            when(i.state.last_fire_ms, now),
            i.state.fired,
            i.state.missed,
            i.state.skipped,
            i.state.dropped,
        ]
        for i in infos
    ]
    click.echo(table(rows, _SCHEDULE_HEADERS))


def _schedule_dict(info: ScheduleInfo) -> dict[str, Any]:
    """ScheduleInfo.to_dict plus the last fire in ms (to_dict has it only as text)."""
    return {**info.to_dict(), "last_fire_ms": info.state.last_fire_ms}


@schedules.command("show")
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True)
@pass_state
def schedule_show(state: State, job_id: str, as_json: bool) -> None:
    """One recurring job: its definition, next and last fire, policies and counters."""
    jq = state.jq()
    info = _require_schedule(jq, job_id)
    if as_json:
        click.echo(json.dumps(_schedule_dict(info)))
        return
    d, s, now = info.definition, info.state, jq.server_time_ms()
    rows = [
        ("job", d.job_id),
        ("task", d.task),
        ("queue", d.queue),
        ("schedule", _when_text(info)),
        ("state", "paused" if d.paused else "active" if info.next_fire_ms else "ended"),
        ("next fire", _next_text(info, now)),
        ("last fire", when(s.last_fire_ms, now)),
        ("misfire policy", d.misfire),
        ("overlap policy", d.overlap),
        ("jitter", f"{d.jitter_ms / 1000:g}s"),
        ("max attempts", str(d.max_attempts)),
        ("args", json.dumps(list(d.args))),
        ("kwargs", json.dumps(d.kwargs)),
        ("fired", str(s.fired)),
        ("missed", f"{s.missed} (misfire policy)"),
        ("skipped", f"{s.skipped} (overlap policy)"),
        ("dropped", f"{s.dropped} (fire-all cap)"),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        click.echo(f"{key.ljust(width)}  {value}")


# The older group name: same commands (one dict), hidden from --help so the docs show one name.
schedule = _Group(
    "schedule",
    commands=schedules.commands,
    hidden=True,
    invoke_without_command=True,
    callback=schedules.callback,
    help=schedules.help,
)
main.add_command(schedule)


@main.command()
@click.option("--jobs", default=100_000, show_default=True, type=click.IntRange(0))
@click.option("--window", default=60, show_default=True, type=click.IntRange(0))
@click.option("--prefix", default="job-", show_default=True)
@click.option("--json", "as_json", is_flag=True)
def jitter(jobs: int, window: int, prefix: str, as_json: bool) -> None:
    """How a herd of JOBS ids <prefix>0.. firing at once spreads over a WINDOW-second jitter."""
    from .jitter import herd_histogram

    counts = herd_histogram(jobs, window, prefix)
    low, high = min(counts), max(counts)
    if as_json:
        click.echo(json.dumps({"jobs": jobs, "window": window, "min": low, "max": high}))
        return
    if window <= 0:
        click.echo(f"no jitter: second 0 gets {jobs:,}")
        return
    click.echo(f"jitter = fnv1a(job_id) % {window}: min {low:,}/s, max {high:,}/s")


for _command in [*COMMANDS, top]:
    main.add_command(_command)
main.add_command(dashboard)
main.add_command(repartition)


if __name__ == "__main__":  # pragma: no cover
    main()
