"""The ``jobqueue`` command: daemons and the operator's window onto runs and leases.

Exit codes: 0 ok, 1 operation refused (or not found), 2 bad input or usage error, 3 Redis
unreachable or credentials refused, 130 interrupted. A user's mistake is one line on stderr,
never a traceback.
"""

from __future__ import annotations

import signal
import sys
import threading


def _interrupted_while_starting(signum: int, frame: object) -> None:
    raise SystemExit(130)  # a Ctrl-C before the CLI is ready: no traceback of the imports


# Until this module's imports are done (redis-py and the rest take a few hundred ms), a Ctrl-C
# exits 130 quietly; the previous handler is restored at the end of this module.
_MAIN_THREAD = threading.current_thread() is threading.main_thread()
_previous_sigint = (
    signal.signal(signal.SIGINT, _interrupted_while_starting) if _MAIN_THREAD else None
)

import contextlib  # noqa: E402
import faulthandler  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import shlex  # noqa: E402
from datetime import datetime  # noqa: E402
from typing import IO, Any  # noqa: E402

import click  # noqa: E402

from jobqueue.cli.common import (  # noqa: E402
    EXIT_INTERRUPTED,
    FiniteFloat,
    State,
    echo_handle,
    json_arg,
    load_app,
    ms_to_text,
    one_line,
    pass_state,
    warn_anomalies,
    yes_option,
)
from jobqueue.cli.format import rate as rate_text  # noqa: E402
from jobqueue.cli.format import when  # noqa: E402
from jobqueue.cli.ops import confirm, progress  # noqa: E402
from jobqueue.cli.root import main as main  # noqa: E402  # the command, with every subcommand
from jobqueue.client.base import Request  # noqa: E402
from jobqueue.client.sync import JobQueue  # noqa: E402
from jobqueue.errors import (  # noqa: E402
    ConfigError,
    InvalidRunId,
    JobQueueError,
    OperationRefused,
    PayloadError,
    UnknownTask,
)
from jobqueue.models import PRIORITY_MAX, DependencyState, Run  # noqa: E402
from jobqueue.policy.timeutil import instants_shown  # noqa: E402
from jobqueue.recurring.config import SchedulerConfig  # noqa: E402
from jobqueue.runtime import logs  # noqa: E402
from jobqueue.runtime import metrics as metrics_mod  # noqa: E402
from jobqueue.settings import Settings  # noqa: E402
from jobqueue.store.connection import redact  # noqa: E402
from jobqueue.store.keys import MAX_PARTITIONS, validate_queue_name  # noqa: E402
from jobqueue.tasks import Dedupe  # noqa: E402
from jobqueue.worker.config import DEFAULT_CONCURRENCY, DEFAULT_GRACE_S  # noqa: E402
from jobqueue.worker.supervisor import SUPERVISED_ENV  # noqa: E402

# Runs per enqueue_many call of `enqueue --from-file` (enqueue_many pipelines its script
# calls): one progress step each.
ENQUEUE_CHUNK = 1000

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


@click.command()
@click.argument("task")
@click.option("--args", "args_json", default="[]", help="Positional arguments, a JSON array.")
@click.option("--kwargs", "kwargs_json", default="{}", help="Keyword arguments, a JSON object.")
@click.option("--run-id", help="Idempotency key: a second enqueue with it creates nothing.")
@click.option("--delay", type=FiniteFloat(0), help="Seconds from now (server clock).")
@click.option("--at", "at_text", help="ISO 8601 instant with a zone, e.g. 2026-12-01T09:00Z.")
@click.option("--queue", help="Queue (default: the task's, else 'default').")
@click.option("--max-attempts", type=click.IntRange(1), default=None)
@click.option(
    "--priority",
    type=click.IntRange(0, PRIORITY_MAX),
    default=None,
    help=f"0 (the default) to {PRIORITY_MAX}: among due runs, higher is claimed first.",
)
@click.option(
    "--dedupe-key",
    help="At most one run per key in the queue at a time (see --dedupe-mode, --dedupe-ttl).",
)
@click.option(
    "--dedupe-mode",
    type=click.Choice(["throttle", "debounce"]),
    default="throttle",
    show_default=True,
    help="throttle: drop this run while the key is held; debounce: give the held run, still "
    "pending, these arguments and due time.",
)
@click.option(
    "--dedupe-ttl",
    type=FiniteFloat(0.001),
    help="Seconds the key is held after its run's enqueue (default: until its first claim).",
)
@click.option(
    "--limit-key",
    help="The key the queue's per-key caps and rates count this run under, e.g. customer:42.",
)
@click.option("--app", "app_spec", help="module:attribute, to use its task options.")
@click.option(
    "--from-file",
    "from_file",
    # Bytes, decoded line by line: a line that is not UTF-8 is then an error naming it, not
    # a UnicodeDecodeError from deep inside the file iterator.
    type=click.File("rb"),
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
    priority: int | None,
    dedupe_key: str | None,
    dedupe_mode: str,
    dedupe_ttl: float | None,
    limit_key: str | None,
    app_spec: str | None,
    from_file: IO[bytes] | None,
    as_json: bool,
) -> None:
    """Enqueue one run of TASK (or one per line of --from-file, with a progress bar)."""
    if from_file is not None and (args_json != "[]" or kwargs_json != "{}" or run_id):
        raise click.UsageError("--from-file takes args, kwargs and run ids from the file")
    if dedupe_key is None and (dedupe_mode != "throttle" or dedupe_ttl is not None):
        raise click.UsageError("--dedupe-mode and --dedupe-ttl go with --dedupe-key")
    if dedupe_key is not None and (from_file is not None or run_id):
        raise click.UsageError("--dedupe-key is for one run, without --run-id or --from-file")
    dedupe = None if dedupe_key is None else Dedupe(dedupe_key, dedupe_mode, dedupe_ttl)
    args = json_arg(args_json, "--args", list)
    kwargs = json_arg(kwargs_json, "--kwargs", dict)
    at = None
    if at_text:
        try:
            at = datetime.fromisoformat(at_text.replace("Z", "+00:00"))
        except ValueError:
            raise click.BadParameter(
                f"not an ISO 8601 instant: {at_text!r}", param_hint="--at"
            ) from None
    jq = state.jq(load_app(app_spec) if app_spec else None)
    if app_spec and task not in jq.registry:
        # The app is the list of tasks its workers run: a run of any other name would only
        # ever be handed back by them, then buried.
        raise UnknownTask(f"task {task!r} is not registered in {app_spec}")
    if app_spec and max_attempts is not None:
        raise click.UsageError("--max-attempts is for tasks not in --app (the app's task sets it)")
    unchecked = task not in jq.registry
    if unchecked:
        jq.declare_task(task, queue=queue, max_attempts=max_attempts)
    if from_file is not None:
        _enqueue_file(jq, task, from_file, delay, at, queue, as_json, priority, limit_key)
    else:
        options = jq.resolve_task(task).with_options(
            run_id=run_id, delay=delay, at=at, queue=queue, priority=priority, dedupe=dedupe,
            limit_key=limit_key,
        )
        handle = jq.enqueue(options, *args, **kwargs)
        echo_handle(handle, as_json)
    if unchecked:  # after the outcome, so that a refusal stays the one line on stderr
        click.echo(
            f"note: task {task!r} is not checked (no --app) and its declared defaults (queue, "
            "max attempts, timeout) are not applied: pass --app module:jq to use them",
            err=True,
        )


_LINE_KEYS = frozenset({"args", "kwargs", "run_id"})


def _file_requests(
    jq: JobQueue,
    task: str,
    lines: IO[bytes],
    delay: float | None,
    at: datetime | None,
    queue: str | None,
    priority: int | None = None,
    limit_key: str | None = None,
) -> list[Request]:
    """Every line parsed and validated (payload size, run id) before anything is written:
    a bad line 40,000 is one error line naming it (exit 2), not 39,999 runs and a
    traceback."""
    out = []
    for number, raw in enumerate(lines, 1):
        # click.File opens a path with its name; only stdin may come without one.
        where = f"{getattr(lines, 'name', '<stdin>')} line {number}"
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise PayloadError(
                f"{where}: not valid UTF-8 ({exc.reason} at byte {exc.start + 1})"
            ) from None
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError as exc:
            raise PayloadError(f"{where}: not valid JSON: {exc}") from None
        except RecursionError:
            raise PayloadError(f"{where}: JSON nested too deeply") from None
        if not isinstance(item, dict) or not _LINE_KEYS.issuperset(item):
            raise PayloadError(f"{where}: expected an object with only args, kwargs, run_id")
        args, kwargs, run_id = item.get("args", []), item.get("kwargs", {}), item.get("run_id")
        if not isinstance(args, list) or not isinstance(kwargs, dict):
            raise PayloadError(f"{where}: args must be a JSON array, kwargs an object")
        if run_id is not None and not isinstance(run_id, str):
            raise InvalidRunId(f"{where}: run_id must be a string")
        req = Request(
            task, args, kwargs, run_id=run_id, delay=delay, at=at, queue=queue, priority=priority,
            limit_key=limit_key,
        )
        try:
            jq.prepare(req)
        except JobQueueError as exc:
            # The same kind of error (so the same exit code), said of this line.
            raise type(exc)(f"{where}: {exc}") from None
        out.append(req)
    return out


def _enqueue_file(
    jq: JobQueue,
    task: str,
    lines: IO[bytes],
    delay: float | None,
    at: datetime | None,
    queue: str | None,
    as_json: bool,
    priority: int | None = None,
    limit_key: str | None = None,
) -> None:
    requests = _file_requests(jq, task, lines, delay, at, queue, priority, limit_key)
    created = written = 0
    try:
        with progress(len(requests), f"enqueueing {len(requests):,} runs") as advance:
            for start in range(0, len(requests), ENQUEUE_CHUNK):
                chunk = requests[start : start + ENQUEUE_CHUNK]
                created += sum(h.created for h in jq.enqueue_many(chunk))
                written += len(chunk)
                advance(len(chunk))
    except KeyboardInterrupt:
        # A chunk in flight may or may not have been written: `created` counts the confirmed.
        note = f" ({written - created:,} of them existed already)" if written > created else ""
        click.echo(
            f"\ninterrupted: {written:,} of {len(requests):,} created{note}; a re-run skips "
            "the lines whose run_id exists, but creates lines without run_id again",
            err=True,
        )
        sys.exit(EXIT_INTERRUPTED)
    existed = len(requests) - created
    if as_json:
        click.echo(json.dumps({"runs": len(requests), "created": created, "existed": existed}))
    else:
        click.echo(f"{len(requests):,} runs: {created:,} created, {existed:,} existed already")


@click.command()
@click.argument("run_id")
@click.option("--queue", help="Look only in this queue.")
@click.option("--json", "as_json", is_flag=True)
@pass_state
def show(state: State, run_id: str, queue: str | None, as_json: bool) -> None:
    """Everything about one run, with its history of attempts, owners and errors."""
    jq = state.jq()
    run = jq.get_run(run_id, queue=queue)
    if as_json:
        warn_anomalies(run.anomalies)
        click.echo(json.dumps(run.to_dict(), default=str))
        return
    now = jq.server_time_ms()
    rows = [
        ("run", run.run_id),
        ("queue", f"{run.queue} (partition {run.partition}){_flow(jq, run.queue)}"),
        ("state", run.state),
        ("task", run.task),
        ("priority", str(run.priority)),
        *(() if run.dedupe_key is None else [("dedupe key", run.dedupe_key)]),
        *(() if run.limit_key is None else [("limit key", run.limit_key)]),
        *(() if run.parked is None else [("held back", f"waiting for a slot of {run.parked}")]),
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
        *(() if run.progress is None else [("progress", progress_text(run, now))]),
        *((f"meta {k}", v) for k, v in sorted(run.meta.items())),
        *(("anomaly", str(a)) for a in run.anomalies),
    ]
    warn_anomalies(run.anomalies)
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        click.echo(f"{key.ljust(width)}  {value}")
    click.echo("history:")
    for ms, text in run.timeline():
        # the scripts write instants as epoch ms; show them like the rest
        text = instants_shown(text, ms_to_text)
        click.echo(f"  {ms_to_text(ms) if ms is not None else '?'}  {text}")
    for kept in run.tracebacks:
        attempt = kept["attempt"] if kept["attempt"] is not None else "?"
        click.echo(f"traceback of attempt {attempt}:")
        for line in kept["traceback"].splitlines():
            click.echo(f"  {line}")
    _show_workflow(jq, run)


def _show_workflow(jq: JobQueue, run: Run) -> None:
    """A workflow step: its workflow, and the tree of runs it waits on (each with what the
    run above heard of it and its state now), bounded in depth and size."""
    if run.flow is None and not run.dependents:
        return
    deps = jq.dependencies(run.run_id, queue=run.queue)
    heard = sum(d.outcome is not None for d in deps)
    click.echo(f"workflow {run.flow or '-'}: waits on {len(deps)} runs, {heard} heard of"
               + (f", {len(run.dependents)} wait on it" if run.dependents else ""))
    _show_dependencies(jq, deps, 1, {run.run_id}, MAX_TREE_NODES)
    if run.dependents:
        _show_dependents(jq, run)


def _show_dependents(jq: JobQueue, run: Run) -> None:
    """The runs waiting on ``run``, a level up: each with its state now and how many of its
    dependencies it has not heard of yet."""
    click.echo("waited on by:")
    shown = run.dependents[:MAX_DEPENDENCIES_SHOWN]
    for queue, parent in shown:
        try:
            found = jq.find_run(parent, queue=queue)
        except JobQueueError as exc:  # foreign data, a queue no longer usable
            click.echo(f"  {parent} ({queue}): {one_line(str(exc))}")
            continue
        if found is None:
            click.echo(f"  {parent} ({queue}): missing (expired, or never created)")
        elif found.state == "waiting":
            click.echo(f"  {parent} ({queue}): now waiting, on {found.dependencies_left} "
                       "more runs")
        else:
            click.echo(f"  {parent} ({queue}): now {found.state}")
    if len(run.dependents) > len(shown):
        click.echo(f"  ... and {len(run.dependents) - len(shown)} more")


def _show_dependencies(
    jq: JobQueue, deps: list[DependencyState], depth: int, seen: set[str], budget: int
) -> int:
    """Print ``deps`` and the trees below them, at most ``budget`` lines of runs; returns
    the budget left."""
    shown = deps[: min(MAX_DEPENDENCIES_SHOWN, max(budget, 0))]
    budget -= len(shown)
    by_queue: dict[str, list[str]] = {}
    for d in shown:
        by_queue.setdefault(d.queue, []).append(d.run_id)
    states = {s.run_id: s.state for q, ids in by_queue.items() for s in jq.run_states(ids, q)}
    indent = "  " * depth
    for d in shown:
        outcome = d.outcome or "not finished"
        detail = f": {d.error[:120]}" if d.error else ""
        state = states.get(d.run_id, "missing")
        click.echo(f"{indent}{d.run_id} ({d.queue}, on failure {d.policy}) {outcome}{detail}"
                   f"; now {state}")
        if d.run_id in seen or state in ("missing", "not a run record"):
            continue  # a run reached twice (a diamond) is expanded once
        seen.add(d.run_id)
        try:
            below = jq.dependencies(d.run_id, queue=d.queue) if depth < MAX_TREE_DEPTH else []
        except JobQueueError as exc:  # gone meanwhile, or foreign data in its keys
            click.echo(f"{indent}  ({one_line(str(exc))})")
            continue
        budget = _show_dependencies(jq, below, depth + 1, seen, budget)
    if len(deps) > len(shown):
        click.echo(f"{indent}... and {len(deps) - len(shown)} more")
    return budget


MAX_DEPENDENCIES_SHOWN = 20  # per run of the tree
MAX_TREE_DEPTH = 4  # levels of dependencies below the run shown
MAX_TREE_NODES = 60  # lines of the tree in all


def progress_text(run: Run, now: int) -> str:
    text = f"{run.progress:g}% (attempt {run.progress_attempt}, {when(run.progress_at_ms, now)})"
    return f"{text}: {run.progress_message}" if run.progress_message else text


def _flow(jq: JobQueue, queue: str) -> str:
    """What holds back the runs of a queue: paused, its concurrency and rate limits."""
    notes = []
    if jq.queue_paused(queue):
        notes.append("paused: not claimed until resumed")
    limits = jq.queue_limits(queue)
    if limits.concurrency is not None:
        notes.append(f"at most {limits.concurrency} running at once")
    if limits.rate is not None:
        notes.append(f"at most {rate_text(*limits.rate)} claimed")
    if limits.key_concurrency is not None:
        notes.append(f"at most {limits.key_concurrency} running at once per key")
    if limits.key_rate is not None:
        notes.append(f"at most {rate_text(*limits.key_rate)} claimed per key")
    for task, cap in limits.task_caps.items():
        notes.append(f"at most {cap} of {task} running at once")
    return "".join(f" - {n}" for n in notes)


@click.command()
@click.argument("run_id")
@click.option("--queue")
@click.option("--reason", default="cancelled from the CLI", show_default=True)
@yes_option
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


@click.command()
@click.argument("run_id")
@click.option("--queue")
@click.option("--force", is_flag=True, help="Requeue a done run too (it runs again).")
@click.option("--yes", is_flag=True, help="Do not ask before requeueing a done run (as --force).")
@pass_state
def requeue(state: State, run_id: str, queue: str | None, force: bool, yes: bool) -> None:
    """Put a dead or cancelled run back to pending, attempts reset. A done run runs again:
    asked first (no answer refuses), unless --force or --yes.

    Idempotent: an already pending run exits 0; a running one is refused (exit 1)."""
    jq = state.jq()
    force = force or yes
    if not force:
        run = jq.find_run(run_id, queue)
        if run is not None and run.state == "done":
            # No answer (a script) refuses: a done run runs again only when asked for.
            confirm(f"{run_id} is done: requeue it to run again?", False, "--force")
            force = True
    try:
        previous = jq.requeue(run_id, queue=queue, force=force)
    except OperationRefused:
        run = jq.find_run(run_id, queue)
        if run is None or run.state != "pending":
            raise
        click.echo(f"{run_id} is already pending (nothing to do)")
        return
    click.echo(f"requeued {run_id} (was {previous})")


# -- recurring jobs: the scheduler daemon, `schedule ...` and `jitter` ----------------------

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
    "--grace",
    default=_SCHEDULER.grace,
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
    grace: float,
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
        grace=grace,
        batch=batch,
        partitions=partitions,
        partition_lease=partition_lease,
        max_lookahead=max_lookahead,
        create_rate=create_rate,
        prune=prune,
    )
    daemon = Scheduler(jq, config, metrics=m)
    sys.exit(daemon.run())




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


if _MAIN_THREAD:
    signal.signal(signal.SIGINT, _previous_sigint)


if __name__ == "__main__":  # pragma: no cover
    main()
