"""The operator's commands: leases, runs, queues (alias stats), queue pause/resume, workers,
dead runs, capacity, check.

Every listing has ``--json``; human output is an aligned table with relative and absolute
times. Data comes from ``jobqueue.queries`` (the same functions any dashboard would use).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import click
from click.core import ParameterSource

from jobqueue.anomalies import Anomaly
from jobqueue.cli.common import (
    EXIT_REFUSED,
    FiniteFloat,
    anomaly_cell,
    one_line,
    warn_anomalies,
)
from jobqueue.cli.format import abs_time, duration, rate, when
from jobqueue.cli.format import table as table
from jobqueue.errors import OperationRefused
from jobqueue.ops import coverage, health, queries
from jobqueue.ops import workers as worker_registry
from jobqueue.ops.capacity import measure_bytes_per_run
from jobqueue.ops.listing import RunPage, RunQuery, iter_runs, runs_page
from jobqueue.ops.scheduler_checks import checks as scheduler_checks
from jobqueue.policy.capacity import PERSISTENCE, CapacityInputs, estimate
from jobqueue.policy.health import Limits
from jobqueue.policy.timeutil import when_to_ms
from jobqueue.settings import Settings
from jobqueue.store.keys import PartitionKeys, validate_queue_name

# Commands receive jobqueue.cli.State (ctx.obj) through click.pass_obj.
pass_state = click.pass_obj

# Runs per round trip of `dead retry` (one requeue call each): one progress step each.
BULK_CHUNK = 500


def emit(
    as_json: bool,
    data: list[dict[str, Any]],
    rows: list[list[Any]],
    headers: list[str],
    empty: str,
    found: Sequence[Any] = (),
) -> None:
    """A listing: JSON, or a table. ``found``: the rows as read (a Listing, one per row);
    every anomaly goes to stderr, and when rows carry some, the table gets an ANOMALY column
    marking them."""
    warn_anomalies(queries.all_anomalies(found))
    if getattr(found, "truncated", False):
        click.echo(f"note: more than {len(data):,} exist: only the first {len(data):,} are "
                   "shown (raise --limit)", err=True)
    if as_json:
        click.echo(json.dumps(data, default=str))
    elif not rows:
        click.echo(empty)
    else:
        marks = [anomaly_cell(_row_anomalies(item)) for item in found] if found else []
        if any(marks):
            rows = [[*row, mark] for row, mark in zip(rows, marks, strict=True)]
            headers = [*headers, "ANOMALY"]
        click.echo(table(rows, headers))


def _row_anomalies(item: Any) -> tuple[Anomaly, ...]:
    anomalies: tuple[Anomaly, ...] = getattr(item, "anomalies", ())
    return anomalies


def stdout_is_terminal() -> bool:
    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):
        return False


@contextmanager
def progress(length: int, label: str) -> Iterator[Callable[[int], None]]:
    """A progress bar (click's) on a terminal; silence in a pipe, a file or CI, where a bar
    is only noise in a log. Yields ``advance(n)``."""
    if length < 2 or not stdout_is_terminal():
        yield lambda n: None
        return
    with click.progressbar(length=length, label=label, file=sys.stdout) as bar:
        yield bar.update


def confirm(what: str, yes: bool, skip: str = "--yes") -> None:
    """Ask before a destructive or bulk change unless --yes. 'No', or no answer at all (end of
    input, which click turns into Abort), is a refusal: one ``error:`` line, exit 1, nothing
    changed."""
    if yes:
        return
    try:
        answered = click.confirm(what, default=False)
    except click.Abort:
        answered = False
    if not answered:
        raise OperationRefused(f"not confirmed: nothing changed ({skip} skips the question)")


json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")


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


@click.command()
@click.option("--queue", help="Only this queue.")
@json_option
@pass_state
def queues(state: Any, queue: str | None, as_json: bool) -> None:
    """Per queue and partition: due now, later, running, expired leases, dead, done in the
    last minute and hour, how late the oldest due run is, whether it is paused, its
    concurrency limit and its rate limit, how many due runs are held back by a per-key or
    per-task cap (counted in DUE NOW or LATER too), and those limits; with --json also
    the workflow runs waiting for their dependencies ('waiting'). (Alias: stats.)

    DONE counts runs that left through the done index: completed or cancelled."""
    found = queries.stats(state.jq(), queue)
    rows = [
        [
            s.queue,
            s.partition,
            s.due_now,
            s.scheduled_later,
            s.running,
            s.expired_leases,
            s.dead,
            s.done_last_minute,
            s.done_last_hour,
            "-"
            if s.oldest_due_age_ms is None
            else f"{duration(s.oldest_due_age_ms)} (due {abs_time(s.oldest_due_ms)})",
            _paused_cell(s),
            s.held_back,
            _key_task_cell(s),
            "-" if s.concurrency_limit is None else s.concurrency_limit,
            rate(s.rate_limit, s.rate_window_ms),
        ]
        for s in found
    ]
    emit(
        as_json,
        [s.to_dict() for s in found],
        rows,
        [
            "QUEUE",
            "PART",
            "DUE NOW",
            "LATER",
            "RUNNING",
            "EXPIRED",
            "DEAD",
            "DONE/1M",
            "DONE/1H",
            "OLDEST DUE (UTC)",
            "PAUSED",
            "HELD",
            "KEY/TASK",
            "LIMIT",
            "RATE",
        ],
        "no queues yet",
        found,
    )
    if not as_json and any(s.node for s in found):
        _master_table(state.jq(), found)


def _key_task_cell(s: queries.PartitionStats) -> str:
    """The per-key and per-task limits of a partition, e.g. 'key 3, key 10/1s, export 2'."""
    parts = []
    if s.key_concurrency_limit is not None:
        parts.append(f"key {s.key_concurrency_limit}")
    if s.key_rate_limit is not None:
        parts.append(f"key {rate(s.key_rate_limit, s.key_rate_window_ms)}")
    parts += [f"{task} {cap}" for task, cap in s.task_caps.items()]
    return ", ".join(parts) or "-"


def _paused_cell(s: queries.PartitionStats) -> str:
    if not s.paused:
        return "-"
    return "yes" if s.paused_since_ms is None else f"since {abs_time(s.paused_since_ms)}"


@click.group()
def queue() -> None:
    """Pause or resume a queue's claims; limit how many of its runs run at once, and how many
    start per time window."""


@queue.command("pause")
@click.argument("name")
@pass_state
def queue_pause(state: Any, name: str) -> None:
    """Stop workers claiming from queue NAME, on every partition, until `queue resume`.

    Enqueues go on (runs wait, pending), and so do the runs already running: heartbeats and
    commits are accepted. A lease that expires meanwhile is taken back after the resume.
    Idempotent: a paused queue exits 0."""
    _note_if_new(state.jq(), name)
    if state.jq().pause_queue(name):
        click.echo(f"paused queue {name}: workers claim none of its runs until resumed")
    else:
        click.echo(f"queue {name} is already paused (nothing to do)")


@queue.command("resume")
@click.argument("name")
@pass_state
def queue_resume(state: Any, name: str) -> None:
    """Let workers claim from queue NAME again; idle workers are woken at once.

    Idempotent: a queue that is not paused exits 0."""
    if state.jq().resume_queue(name):
        click.echo(f"resumed queue {name}")
    else:
        click.echo(f"queue {name} is not paused (nothing to do)")


def _note_if_new(jq: Any, name: str) -> None:
    """A queue is configured before its first run (allowed), but a typo would do the same
    silently: say so on stderr (after the name itself is checked)."""
    validate_queue_name(name)
    if name not in jq.queues():
        click.echo(f"note: queue {name} had no runs nor configuration: recorded now", err=True)


def _limit_value(limit: str) -> int | None:
    """LIMIT of `queue concurrency` / `queue rate`: a count, or None for 'none'."""
    if limit.lower() == "none":
        return None
    if limit.isascii() and limit.isdigit():
        return int(limit)
    raise click.BadParameter(f"{limit!r} is not a whole number or 'none'", param_hint="LIMIT")


@queue.command("events")
@click.argument("name")
@click.option("--on/--off", "enabled", default=None,
              help="Write events for this queue, or not (waits then read the records).")
@click.option("--maxlen", type=click.IntRange(100, 10_000_000),
              help="Keep about this many events per partition (default 10000).")
@click.option("--max-age", "max_age", type=FiniteFloat(1, 30 * 86400),
              help="Keep the events of the last this many seconds (default 86400).")
@click.option("--default", "to_default", is_flag=True,
              help="Back to the defaults (on, 10000, a day).")
@json_option
@pass_state
def queue_events(
    state: Any,
    name: str,
    enabled: bool | None,
    maxlen: int | None,
    max_age: float | None,
    to_default: bool,
    as_json: bool,
) -> None:
    """Queue NAME's event log (`jobqueue events`): on or off, how many events and how long
    each partition keeps. Without options, shows them. Memory: about 100 bytes per
    event (`bench/core.py` measures it), so the default 10000 per partition is about
    1 MB."""
    validate_queue_name(name)
    jq = state.jq()
    now = jq.queue_events(name)
    if to_default and (enabled is not None or maxlen is not None or max_age is not None):
        raise click.UsageError("--default or the other options, not both")
    if to_default:
        now = jq.set_queue_events(name)
    elif enabled is not None or maxlen is not None or max_age is not None:
        _note_if_new(jq, name)
        now = jq.set_queue_events(
            name,
            enabled=now.enabled if enabled is None else enabled,
            maxlen=maxlen if maxlen is not None else _set(now.maxlen, 10_000),
            max_age=max_age if max_age is not None else _set(now.max_age_s, 86_400.0),
        )
    if as_json:
        click.echo(json.dumps(now.to_dict()))
        return
    word = "on" if now.enabled else "off"
    click.echo(f"queue {name}: events {word}, about {now.maxlen} per partition, the last "
               f"{duration(round(now.max_age_s * 1000))}; {sum(now.lengths)} held now"
               + (" (its partitions disagree: set them again)" if now.mixed else ""))


def _set(value: Any, default: Any) -> Any:
    """A setting to write again: None (the default) when it is the default."""
    return None if value == default else value


# A negative LIMIT ("-1") is an argument to refuse with the rule, not an unknown option.
_LIMIT_ARGS = {"ignore_unknown_options": True}


@queue.command("concurrency", context_settings=_LIMIT_ARGS)
@click.argument("name")
@click.argument("limit")
@click.option("--per-key", is_flag=True, help="At most LIMIT runs of each limit_key at once.")
@click.option("--task", "task", help="At most LIMIT runs of this task at once.")
@click.option(
    "--exact",
    is_flag=True,
    help="Across all the queue's partitions and masters (permits in the limit's own slot).",
)
@pass_state
def queue_concurrency(
    state: Any, name: str, limit: str, per_key: bool, task: str | None, exact: bool
) -> None:
    """At most LIMIT runs of queue NAME running at once, per partition (exact for a queue of
    one partition, the default); LIMIT `none` removes the limit. With --per-key: at most LIMIT
    runs of each limit_key (enqueue --limit-key); with --task T: at most LIMIT runs of task T
    (both up to 10000; a run over the cap waits, held back, and the rest of the queue goes on).

    Enforced by the claim script across all workers: a run holds its slot from its claim until
    its commit, its cancel or its lease's expiry (a killed worker's slot frees when its lease
    expires). Idempotent: setting the limit it has exits 0. With --exact: at most LIMIT of
    the whole queue across all its partitions and masters (workers take a permit per run
    from the limit's own slot; they see a new exact limit within 5 s)."""
    if per_key and task is not None:
        raise click.UsageError("--per-key or --task, not both")
    if exact and (per_key or task is not None):
        raise click.UsageError("--exact is for the whole queue: not with --per-key or --task")
    value = _limit_value(limit)
    kind = "exact " if exact else "per-key " if per_key else "" if task is None else f"task {task} "
    what = f"no {kind}concurrency limit" if value is None else f"{kind}concurrency limit {value}"
    _note_if_new(state.jq(), name)
    if state.jq().set_queue_concurrency(name, value, per_key=per_key, task=task, exact=exact):
        click.echo(f"queue {name}: {what}")
    else:
        click.echo(f"queue {name} already has {what} (nothing to do)")


@queue.command("rate", context_settings=_LIMIT_ARGS)
@click.argument("name")
@click.argument("limit")
@click.option(
    "--per",
    type=FiniteFloat(0.001, 86400),
    default=1.0,
    show_default=True,
    help="The window, in seconds (1 ms to 1 day).",
)
@click.option("--per-key", is_flag=True, help="At most LIMIT claims of each limit_key.")
@click.option(
    "--margin",
    type=FiniteFloat(0, 60),
    default=0.0,
    show_default=True,
    help="Seconds added to the window, so that at most LIMIT task starts (not only claims) "
    "fall in any --per seconds: at least the longest lag of a start behind its claim.",
)
@click.option(
    "--exact",
    is_flag=True,
    help="Across all the queue's partitions and masters (permits in the limit's own slot).",
)
@pass_state
def queue_rate(
    state: Any, name: str, limit: str, per: float, per_key: bool, margin: float, exact: bool
) -> None:
    """At most LIMIT runs of queue NAME claimed in any --per seconds, per partition (exact for
    a queue of one partition, the default); LIMIT `none` removes the limit. With --per-key: at
    most LIMIT claims of each limit_key (enqueue --limit-key). With --margin M: the window is
    --per + M seconds, so that task starts, which lag their claims, stay within LIMIT per
    --per seconds too.

    Enforced by the claim script across all workers, on the server's clock: a run over the
    limit stays pending, and idle workers sleep until the window has room. Idempotent. With
    --exact: at most LIMIT claims of the whole queue across all its partitions and masters
    (not with --per-key or --margin)."""
    if exact and (per_key or margin):
        raise click.UsageError("--exact is for the whole queue: not with --per-key or --margin")
    value = _limit_value(limit)
    ctx = click.get_current_context()
    if value is None and ctx.get_parameter_source("per") is not ParameterSource.DEFAULT:
        raise click.BadParameter(
            "a window without a limit: 'none' removes the limit", param_hint="--per"
        )
    jq = state.jq()
    kind = "exact " if exact else "per-key " if per_key else ""
    what = f"no {kind}rate limit" if value is None else f"{kind}rate limit {value} per {per:g}s"
    if value is not None and margin:
        what += f" (+{margin:g}s margin: a window of {per + margin:g}s)"
    _note_if_new(jq, name)
    if jq.set_queue_rate(name, value, per, per_key=per_key, margin=margin, exact=exact):
        click.echo(f"queue {name}: {what}")
    else:
        click.echo(f"queue {name} already has {what} (nothing to do)")


def _master_table(jq: Any, found: Sequence[queries.PartitionStats]) -> None:
    """On a cluster: what each master carries, so an uneven placement shows (SHARE 1.0 is
    its fair share of the partitions listed; `jobqueue repartition` spreads a queue whose
    partitions still have the plain tags of earlier versions)."""
    rows = [
        [m.node, m.partitions, m.due_now, m.scheduled_later, m.running, f"{m.share:.2f}"]
        for m in queries.master_loads(found, queries.master_names(jq))
    ]
    click.echo()
    click.echo(table(rows, ["MASTER", "PARTITIONS", "DUE NOW", "LATER", "RUNNING", "SHARE"]))


# `stats` is the older name, kept for scripts: the same command under both names.
stats = click.Command(
    "stats",
    callback=queues.callback,
    params=queues.params,
    help="Same as `queues`.",
    short_help="Same as `queues`.",
)


@click.group(invoke_without_command=True)
@json_option
@click.pass_context
def workers(ctx: click.Context, as_json: bool) -> None:
    """The worker registry (the default: list it); stale workers (no heartbeat for 3 beats)
    are flagged, and pruned once they missed 10 (by the live workers) or at once by
    `workers prune`."""
    if ctx.invoked_subcommand is None:
        ctx.invoke(workers_list, as_json=as_json)


@workers.command("list")
@json_option
@pass_state
def workers_list(state: Any, as_json: bool) -> None:
    """The live worker registry; stale workers (no heartbeat for 3 beats) are flagged."""
    jq = state.jq()
    found = queries.workers(jq)
    now = jq.server_time_ms()
    rows = [
        [
            w.id,
            w.host,
            w.pid,
            ",".join(w.queues),
            "?" if w.tasks is None else len(w.tasks),  # the names: --json
            f"{w.in_flight}/{w.concurrency}",
            when(w.started_ms, now),
            when(w.last_seen_ms, now),
            "STALE" if w.stale else "ok",
        ]
        for w in found
    ]
    emit(
        as_json,
        [w.to_dict() for w in found],
        rows,
        [
            "WORKER", "HOST", "PID", "QUEUES", "TASKS", "IN FLIGHT", "STARTED (UTC)", "LAST SEEN",
            "STATUS",
        ],
        "no workers registered",
        found,
    )


@workers.command("prune")
@json_option
@pass_state
def workers_prune(state: Any, as_json: bool) -> None:
    """Remove the entries of stale workers (no heartbeat for 3 beats: killed, or their host
    lost) from the registry now. A worker that is in fact alive comes back at its next
    heartbeat. Leases are not touched: runs of a dead worker are taken back when their
    leases expire."""
    gone = worker_registry.prune_stale(state.jq())
    if as_json:
        click.echo(json.dumps({"pruned": gone}))
    elif gone:
        click.echo(f"pruned {len(gone)} stale workers: {', '.join(gone)}")
    else:
        click.echo("no stale workers (nothing to do)")


@click.group()
def dead() -> None:
    """Dead runs: list, retry (requeue), purge."""


@dead.command("list")
@listing_options
@paging_options
@json_option
@pass_state
def dead_list(
    state: Any, /, limit: int, cursor: str | None, as_json: bool, **filters: Any
) -> None:
    """Dead runs, most recent first, with the last line of their error, a page at a time."""
    jq = state.jq()
    page = runs_page(jq, run_query(jq, "dead", filters), cursor=cursor, limit=limit)
    now = jq.server_time_ms()
    rows = [
        [
            r.run_id,
            r.queue,
            r.task,
            f"{r.attempt}/{r.max_attempts}",
            when(r.finished_ms, now),
            (r.error or "").splitlines()[-1][:80] if r.error else "",
        ]
        for r in page
    ]
    emit(
        as_json,
        [r.to_dict() for r in page],
        rows,
        ["RUN", "QUEUE", "TASK", "ATTEMPTS", "DIED (UTC)", "ERROR"],
        "no dead runs" + (" on this page" if page.next_cursor else ""),
        page,
    )
    page_footer(page, as_json)


def _dead_ids(jq: Any, run_ids: tuple[str, ...], all_: bool, filters: dict[str, Any]
              ) -> list[str]:
    # --queue also says where the given run ids are; the other filters only choose.
    chosen = {k: v for k, v in filters.items() if v and k != "queue"}
    if run_ids and (all_ or chosen):
        raise click.UsageError("give run ids, or --all (with filters), not both")
    if chosen and not all_:
        raise click.UsageError("filters choose among every dead run: add --all")
    if not run_ids and not all_:
        raise click.UsageError("give run ids, or --all for every dead run (of the filters)")
    if run_ids:
        return list(dict.fromkeys(run_ids))
    # Every page to the end: the whole filter, never the first page of it.
    ids: list[str] = []
    found: list[Anomaly] = []
    for run in iter_runs(jq, run_query(jq, "dead", filters), page_size=BULK_CHUNK):
        ids.append(run.run_id)
        found.extend(run.anomalies)
    warn_anomalies(found)
    return list(dict.fromkeys(ids))


@dead.command("retry")
@click.argument("run_ids", nargs=-1)
@click.option("--all", "all_", is_flag=True,
              help="Every dead run the filters choose (all of them without filters).")
@listing_options
@click.option("--yes", is_flag=True, help="Do not ask (--all asks first).")
@pass_state
def dead_retry(
    state: Any, /, run_ids: tuple[str, ...], all_: bool, yes: bool, **filters: Any
) -> None:
    """Put dead runs back to pending, attempts reset.

    Idempotent: a run already back to pending is reported, not retried twice. A run in another
    state (done, running, unknown) is refused: exit 1."""
    jq = state.jq()
    queue = filters.get("queue")
    ids = _dead_ids(jq, run_ids, all_, filters)
    if not ids:
        click.echo("no dead runs to retry")
        return
    confirm(f"retry {len(ids)} dead run(s)?", yes or not all_)
    targets: list[tuple[str, PartitionKeys]] = []
    already, refused = 0, 0
    for rid, keys, run_state in jq.run_states(ids, queue):
        if run_state == "dead" and keys is not None:
            targets.append((rid, keys))
        elif run_state == "pending":
            already += 1
            click.echo(one_line(f"{rid} is already pending (nothing to do)"), err=True)
        else:
            refused += 1
            what = "not found" if run_state == "missing" else f"is {run_state}"
            click.echo(one_line(f"error: refused {rid}: {what}; only dead runs retry"), err=True)
    retried = 0
    with progress(len(targets), "retrying dead runs") as advance:
        for start in range(0, len(targets), BULK_CHUNK):
            chunk = targets[start : start + BULK_CHUNK]
            outcomes = jq.requeue_located(chunk)
            for (rid, _), (changed, previous) in zip(chunk, outcomes, strict=True):
                if changed:
                    retried += 1
                elif previous == "pending":  # retried by someone else meanwhile
                    already += 1
                else:
                    refused += 1
                    click.echo(
                        one_line(f"error: refused {rid}: is {previous}; only dead runs retry"),
                        err=True,
                    )
            advance(len(chunk))
    summary = f"retried {retried} of {len(ids)} dead run(s)"
    if already:
        summary += f"; {already} already pending"
    if refused:
        summary += f"; {refused} refused"
    click.echo(summary)
    if refused:
        sys.exit(1)


@dead.command("purge")
@click.argument("run_ids", nargs=-1)
@click.option("--all", "all_", is_flag=True,
              help="Every dead run the filters choose (all of them without filters).")
@listing_options
@click.option("--yes", is_flag=True, help="Do not ask.")
@pass_state
def dead_purge(
    state: Any, /, run_ids: tuple[str, ...], all_: bool, yes: bool, **filters: Any
) -> None:
    """Delete dead runs for good (only runs still dead are touched)."""
    jq = state.jq()
    queue = filters.get("queue")
    ids = _dead_ids(jq, run_ids, all_, filters)
    if not ids:
        click.echo("no dead runs to purge")
        return
    confirm(f"purge {len(ids)} dead run(s) for good?", yes)
    purged = jq.purge_dead(ids, queue)
    click.echo(f"purged {purged} dead run(s); {len(ids) - purged} not dead or not found")


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
    jq = state.jq()
    limits = Limits(lease_s=lease or jq.settings.default_lease_s)
    checks = health.run(jq, limits) + coverage.run(jq) + scheduler_checks(jq, create_rate)
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


COMMANDS = [leases, runs, queues, stats, queue, workers, dead, capacity, check]
