"""The ``jobqueue`` command: daemons and the operator's window onto runs and leases.

Exit codes: 0 ok, 1 operation refused (or not found), 2 usage error, 3 Redis unreachable or
credentials refused. A user's mistake is one line on stderr, never a traceback.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import signal
import sys
from datetime import UTC, datetime
from typing import Any

import click

from .cli_ops import COMMANDS
from .client import JobQueue
from .connection import redact
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
from .supervisor import SUPERVISED_ENV

EXIT_REFUSED, EXIT_USAGE, EXIT_UNREACHABLE = 1, 2, 3


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


class State:
    def __init__(self, url: str | None) -> None:
        self.url = url
        self._jq: JobQueue | None = None

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
@click.version_option(package_name="jobqueue")
@click.pass_context
def main(ctx: click.Context, redis_url: str | None, log_level: str) -> None:
    """jobqueue: a Redis-backed distributed job scheduler and task queue."""
    logging.basicConfig(
        level=log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
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


def _ms_to_text(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


def _json_arg(text: str, what: str, kind: type) -> Any:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise click.BadParameter(f"not valid JSON: {exc}", param_hint=what) from None
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
@pass_state
def worker(
    state: State,
    app_spec: str,
    queues: tuple[str, ...],
    concurrency: int,
    lease: float,
    grace: float,
    processes: int,
) -> None:
    """Run a worker: claim runs, execute them, heartbeat leases, commit with fences."""
    from .worker import Worker

    # Until the worker installs its draining handler it holds no run: a SIGTERM while the app
    # imports or Redis connects is a clean exit, not a death by signal.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    app = load_app(app_spec)
    jq = state.jq(app)
    if processes > 1 and not os.environ.get(SUPERVISED_ENV):
        from .supervisor import supervise

        sys.exit(supervise(processes, sys.argv, jq.url or ""))
    logging.getLogger("jobqueue").info("connected to %s", redact(jq.url or ""))
    code = Worker(jq, queues or None, concurrency=concurrency, lease=lease, grace=grace).run()
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
    as_json: bool,
) -> None:
    """Enqueue one run of TASK."""
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
    handle = jq.enqueue(task, *args, run_id=run_id, delay=delay, at=at, queue=queue, **kwargs)
    if as_json:
        click.echo(
            json.dumps({"run_id": handle.run_id, "queue": handle.queue, "created": handle.created})
        )
    elif handle.created:
        click.echo(f"created {handle.run_id} in queue {handle.queue}")
    else:
        click.echo(f"exists  {handle.run_id} in queue {handle.queue} (nothing written)")


@main.command()
@click.argument("run_id")
@click.option("--queue", help="Look only in this queue.")
@click.option("--json", "as_json", is_flag=True)
@pass_state
def show(state: State, run_id: str, queue: str | None, as_json: bool) -> None:
    """Everything about one run, with its history of attempts, owners and errors."""
    run = state.jq().get_run(run_id, queue=queue)
    if as_json:
        click.echo(json.dumps(run.to_dict(), default=str))
        return
    rows = [
        ("run", run.run_id),
        ("queue", f"{run.queue} (partition {run.partition})"),
        ("state", run.state),
        ("task", run.task),
        ("attempt", f"{run.attempt}/{run.max_attempts}"),
        ("fence", str(run.fence)),
        ("owner", run.owner or "-"),
        ("due", _ms_to_text(run.due_ms)),
        ("lease until", _ms_to_text(run.lease_until_ms)),
        ("created", _ms_to_text(run.created_ms)),
        ("started", _ms_to_text(run.started_ms)),
        ("finished", _ms_to_text(run.finished_ms)),
        ("payload", run.payload),
        ("result", run.result_json or "-"),
        ("error", run.error or "-"),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        click.echo(f"{key.ljust(width)}  {value}")
    click.echo("history:")
    for line in run.history:
        stamp, _, text = line.partition(" ")
        click.echo(f"  {_ms_to_text(int(stamp)) if stamp.isdigit() else stamp}  {text}")


@main.command()
@click.argument("run_id")
@click.option("--queue")
@click.option("--reason", default="cancelled from the CLI", show_default=True)
@pass_state
def cancel(state: State, run_id: str, queue: str | None, reason: str) -> None:
    """Cancel a pending or running run (a running worker is fenced out)."""
    previous = state.jq().cancel(run_id, queue=queue, reason=reason)
    click.echo(f"cancelled {run_id} (was {previous})")


@main.command()
@click.argument("run_id")
@click.option("--queue")
@pass_state
def requeue(state: State, run_id: str, queue: str | None) -> None:
    """Put a dead, cancelled or done run back to pending, attempts reset."""
    previous = state.jq().requeue(run_id, queue=queue)
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
@pass_state
def scheduler(
    state: State,
    app_spec: str | None,
    lookahead: float,
    interval: float,
    grace: float,
    batch: int,
    partitions: int | None,
) -> None:
    """Run a scheduler: turn recurring jobs into runs (any number of instances)."""
    from .recurring import Recurring
    from .scheduler import Scheduler

    jq = state.jq(load_app(app_spec) if app_spec else None)
    logging.getLogger("jobqueue").info("connected to %s", redact(jq.url or ""))
    store = Recurring(jq, partitions) if partitions else None
    daemon = Scheduler(
        jq, lookahead=lookahead, interval=interval, grace=grace, batch=batch, store=store
    )
    sys.exit(daemon.run())


@main.group(cls=_Group)
def schedule() -> None:
    """Recurring jobs: add (upsert), remove, pause, resume, trigger, backfill, list, show."""


def _schedule_line(info: Any) -> str:
    d = info.to_dict()
    when = d["cron"] if d["cron"] is not None else f"every {d['every_s']:g}s"
    state = "paused" if d["paused"] else f"next {d['next_fire'] or '-'}"
    return (
        f"{d['job_id']}  {d['task']}  [{when} {d['tz']}]  {state}  fired {d['fired']}, "
        f"missed {d['missed']}, skipped {d['skipped_by_overlap']}, dropped {d['dropped_by_cap']}"
    )


@schedule.command("add")
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
    """Create or update the recurring job JOB_ID running TASK."""
    args = _json_arg(args_json, "--args", list)
    kwargs = _json_arg(kwargs_json, "--kwargs", dict)
    info = state.jq().schedule(
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
    click.echo(json.dumps(info.to_dict()) if as_json else f"scheduled {_schedule_line(info)}")


@schedule.command("remove")
@click.argument("job_id")
@pass_state
def schedule_remove(state: State, job_id: str) -> None:
    """Remove a recurring job (runs already created stay)."""
    if not state.jq().unschedule(job_id):
        raise OperationRefused(f"no recurring job {job_id!r}")
    click.echo(f"removed {job_id}")


@schedule.command("pause")
@click.argument("job_id")
@pass_state
def schedule_pause(state: State, job_id: str) -> None:
    """Stop firing a recurring job until resumed."""
    click.echo(f"paused {_schedule_line(state.jq().pause_schedule(job_id))}")


@schedule.command("resume")
@click.argument("job_id")
@pass_state
def schedule_resume(state: State, job_id: str) -> None:
    """Fire again from the next fire time (those missed while paused are not fired)."""
    click.echo(f"resumed {_schedule_line(state.jq().resume_schedule(job_id))}")


@schedule.command("trigger")
@click.argument("job_id")
@pass_state
def schedule_trigger(state: State, job_id: str) -> None:
    """Run a recurring job now, with its own run id; its schedule is untouched."""
    handle = state.jq().trigger(job_id)
    click.echo(f"created {handle.run_id} in queue {handle.queue}")


def _cli_instant(text: str, what: str) -> datetime:
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise click.BadParameter(f"not an ISO 8601 instant: {text!r}", param_hint=what) from None
    if value.tzinfo is None:
        raise click.BadParameter(f"{text!r} has no time zone (add Z or +hh:mm)", param_hint=what)
    return value


@schedule.command("backfill")
@click.argument("job_id")
@click.option("--start", "start_text", required=True, help="ISO 8601 instant with a zone.")
@click.option("--end", "end_text", required=True, help="ISO 8601 instant with a zone.")
@pass_state
def schedule_backfill(state: State, job_id: str, start_text: str, end_text: str) -> None:
    """Create the runs of every fire time in [start, end] (existing ones are left alone)."""
    start, end = _cli_instant(start_text, "--start"), _cli_instant(end_text, "--end")
    handles = state.jq().backfill(job_id, start, end)
    created = sum(h.created for h in handles)
    click.echo(
        f"{len(handles)} fire times: {created} runs created, {len(handles) - created} existed"
    )


@schedule.command("list")
@click.option("--json", "as_json", is_flag=True)
@pass_state
def schedule_list(state: State, as_json: bool) -> None:
    """Every recurring job with its next fire time and counters."""
    infos = state.jq().list_schedules()
    if as_json:
        click.echo(json.dumps([i.to_dict() for i in infos]))
        return
    for info in infos:
        click.echo(_schedule_line(info))
    if not infos:
        click.echo("no recurring jobs")


@schedule.command("show")
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True)
@pass_state
def schedule_show(state: State, job_id: str, as_json: bool) -> None:
    """One recurring job: its definition, next fire time and counters."""
    info = state.jq().get_schedule(job_id)
    if info is None:
        raise OperationRefused(f"no recurring job {job_id!r}")
    data = info.to_dict()
    if as_json:
        click.echo(json.dumps(data))
        return
    width = max(len(k) for k in data)
    for key, value in data.items():
        click.echo(f"{key.ljust(width)}  {'-' if value is None else value}")


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


for _command in COMMANDS:
    main.add_command(_command)


if __name__ == "__main__":  # pragma: no cover
    main()
