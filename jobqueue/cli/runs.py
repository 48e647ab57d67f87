"""Runs, one at a time and by state: ``jobqueue enqueue``, ``show``, ``cancel``, ``requeue``,
``runs`` (a page of runs by state and filters, whose options ``jobqueue dead list`` shares) and
``leases`` (which worker holds which run)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from datetime import datetime
from typing import IO, Any

import click

from jobqueue.cli.common import (
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
from jobqueue.cli.format import abs_time, duration, when
from jobqueue.cli.format import rate as rate_text
from jobqueue.cli.output import confirm, emit, json_option, progress
from jobqueue.client.base import Request
from jobqueue.client.sync import JobQueue
from jobqueue.errors import (
    InvalidRunId,
    JobQueueError,
    OperationRefused,
    PayloadError,
    UnknownTask,
)
from jobqueue.models import PRIORITY_MAX, DependencyState, Run
from jobqueue.ops import queries
from jobqueue.ops.listing import RunPage, RunQuery, runs_page
from jobqueue.policy.timeutil import instants_shown, when_to_ms
from jobqueue.tasks import Dedupe

# Runs per enqueue_many call of `enqueue --from-file` (enqueue_many pipelines its script
# calls): one progress step each.
ENQUEUE_CHUNK = 1000


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


@click.command()
@click.option("--queue", help="Only this queue.")
@click.option("--expired", is_flag=True, help="Only leases past their expiry.")
@click.option("--worker", help="Only leases held by this worker id (or id prefix).")
@click.option("--limit", default=1000, show_default=True, type=click.IntRange(1, 100_000))
@json_option
@pass_state
def leases(
    state: Any, queue: str | None, expired: bool, worker: str | None, limit: int, as_json: bool
) -> None:
    """Which worker holds which run, and for how long still."""
    found = queries.leases(state.jq(), queue, expired_only=expired, worker=worker, limit=limit)
    rows = [
        [
            lease.run_id,
            lease.task,
            lease.owner,
            lease.host or "?",
            lease.pid or "?",
            lease.fence,
            lease.attempt,
            duration(lease.remaining_ms) + (" EXPIRED" if lease.expired else ""),
            abs_time(lease.lease_until_ms),
            duration(lease.running_for_ms),
        ]
        for lease in found
    ]
    emit(
        as_json,
        [lease.to_dict() for lease in found],
        rows,
        [
            "RUN",
            "TASK",
            "OWNER",
            "HOST",
            "PID",
            "FENCE",
            "ATTEMPT",
            "LEASE LEFT",
            "LEASE UNTIL (UTC)",
            "RUNNING FOR",
        ],
        "no leases",
        found,
    )


def listing_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The filters and paging every run listing takes (``runs``, ``dead list``, and the
    ``--all`` of ``dead retry`` and ``dead purge``)."""
    for option in reversed(
        [
            click.option("--queue"),
            click.option("--task", help="Runs of this task."),
            click.option("--job", help="Runs of this recurring job (run ids job@...)."),
            click.option("--prefix", help="Runs whose id starts with this."),
            click.option("--contains", help="Runs whose id holds this."),
            click.option("--error", "error_text", help="Runs whose error holds this text "
                         "(any case)."),
            click.option("--since", help="From this time on: 10m (ago), 2h, 1d, or an ISO "
                         "time (UTC unless it says). The time each listing is sorted by."),
            click.option("--until", help="Up to this time (the same forms as --since)."),
        ]
    ):
        fn = option(fn)
    return fn


def paging_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(
        [
            click.option("--order", type=click.Choice(["asc", "desc"]),
                         help="Oldest or newest first (default: pending, running and "
                         "waiting runs oldest first; dead and finished newest first)."),
            click.option("--limit", default=50, show_default=True,
                         type=click.IntRange(1, 10_000)),
            click.option("--cursor", help="Where the previous page ended (it prints it)."),
        ]
    ):
        fn = option(fn)
    return fn


def run_query(jq: Any, state: str | None, filters: dict[str, Any]) -> RunQuery:
    """The query of a listing's options (``filters``: the options' values by name)."""
    now = jq.server_time_ms() if filters.get("since") or filters.get("until") else 0
    return RunQuery(
        state=state,
        queue=filters.get("queue"),
        task=filters.get("task"),
        job=filters.get("job"),
        prefix=filters.get("prefix"),
        contains=filters.get("contains"),
        error=filters.get("error_text"),
        since_ms=when_to_ms(filters["since"], now, "--since") if filters.get("since") else None,
        until_ms=when_to_ms(filters["until"], now, "--until") if filters.get("until") else None,
        order=filters.get("order"),
    )


def page_footer(page: RunPage, as_json: bool) -> None:
    """Under a table, what the page is of the whole and the cursor of the next one. Beside
    JSON (whose stdout stays the list of runs) only the cursor, on stderr, when there is a
    next page."""
    cursor = f"next page: --cursor {page.next_cursor}" if page.next_cursor else ""
    if as_json:
        if cursor:
            click.echo(cursor, err=True)
        return
    click.echo("\n" + page.summary() + ("\n" + cursor if cursor else ""))


@click.command()
@click.option(
    "--state",
    "state_filter",
    type=click.Choice(["pending", "running", "waiting", "done", "dead", "cancelled"]),
)
@listing_options
@paging_options
@json_option
@pass_state
def runs(
    state: Any, /, state_filter: str | None, limit: int, cursor: str | None, as_json: bool,
    **filters: Any,
) -> None:
    """Runs by state and filters, a page at a time.

    Running, pending, waiting, dead, then finished runs; the last lines say how many the
    listing holds and give the next page's --cursor."""
    jq = state.jq()
    page = runs_page(jq, run_query(jq, state_filter, filters), cursor=cursor, limit=limit)
    now = jq.server_time_ms()
    rows = [
        [
            r.run_id,
            r.queue,
            r.task,
            r.state,
            f"{r.attempt}/{r.max_attempts}",
            r.fence,
            when(r.due_ms, now),
            when(r.finished_ms, now),
            (r.error or "").strip().splitlines()[-1][:60] if (r.error or "").strip() else "",
        ]
        for r in page
    ]
    emit(
        as_json,
        [r.to_dict() for r in page],
        rows,
        [
            "RUN",
            "QUEUE",
            "TASK",
            "STATE",
            "ATTEMPT",
            "FENCE",
            "DUE (UTC)",
            "FINISHED (UTC)",
            "ERROR",
        ],
        "no runs" + (" on this page" if page.next_cursor else ""),
        page,
    )
    page_footer(page, as_json)
