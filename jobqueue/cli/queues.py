"""Queues: ``jobqueue queues`` (and its other name ``stats``): per queue and partition, what
is due, running, dead, paused and limited; ``jobqueue queue pause|resume|events|concurrency|rate``
changes one."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import click
from click.core import ParameterSource

from jobqueue.cli.common import FiniteFloat, pass_state
from jobqueue.cli.format import abs_time, duration, rate, table
from jobqueue.cli.output import emit, json_option
from jobqueue.ops import queries
from jobqueue.store.keys import validate_queue_name


@click.command()
@click.option("--queue", help="Only this queue.")
@json_option
@pass_state
def queues(state: Any, queue: str | None, as_json: bool) -> None:
    """Per queue and partition: due now, later, running, expired leases, dead, done in the
    last minute and hour, how late the oldest due run is, whether it is paused, its
    concurrency limit and its rate limit, how many due runs are parked by a full per-key or
    per-task cap (PARKED, counted in DUE NOW or LATER too), and those limits; with --json also
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
            s.parked,
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
            "PARKED",
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
               f"{duration(round(now.max_age_s * 1000))}; {sum(now.lengths)} in the log now"
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
    (both up to 10000; a run over the cap waits, parked, and the rest of the queue goes on).

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
