"""The operator's commands: leases, runs, stats, workers, dead runs, capacity, check.

Every listing has ``--json``; human output is an aligned table with relative and absolute
times. Data comes from ``jobqueue.inspect`` (the same functions any dashboard would use).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import click

from . import inspect, ops
from .capacity import CapacityInputs, estimate
from .errors import OperationRefused

# Commands receive jobqueue.cli.State (ctx.obj) through click.pass_obj.
pass_state = click.pass_obj


def _abs(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _rel(ms: int | None) -> str:
    """Signed duration, e.g. '12.3s', '-4.0s' (expired), '2h05m'."""
    if ms is None:
        return "-"
    sign, ms = ("-" if ms < 0 else ""), abs(ms)
    if ms < 60_000:
        return f"{sign}{ms / 1000:.1f}s"
    if ms < 3_600_000:
        return f"{sign}{ms // 60_000}m{(ms // 1000) % 60:02d}s"
    return f"{sign}{ms // 3_600_000}h{(ms // 60_000) % 60:02d}m"


def table(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> str:
    cells = [[str(h) for h in headers], *[[str(c) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells
    )


def emit(
    as_json: bool, data: list[dict[str, Any]], rows: list[list[Any]], headers: list[str], empty: str
) -> None:
    if as_json:
        click.echo(json.dumps(data, default=str))
    elif not rows:
        click.echo(empty)
    else:
        click.echo(table(rows, headers))


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
    found = inspect.leases(state.jq(), queue, expired_only=expired, worker=worker, limit=limit)
    rows = [
        [
            lease.run_id,
            lease.task,
            lease.owner,
            lease.host or "?",
            lease.pid or "?",
            lease.fence,
            lease.attempt,
            _rel(lease.remaining_ms) + (" EXPIRED" if lease.expired else ""),
            _abs(lease.lease_until_ms),
            _rel(lease.running_for_ms),
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
    )


@click.command()
@click.option(
    "--state",
    "state_filter",
    type=click.Choice(["pending", "running", "done", "dead", "cancelled"]),
)
@click.option("--queue")
@click.option("--job", help="Runs of this recurring job (run ids job@...).")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 10_000))
@json_option
@pass_state
def runs(
    state: Any,
    state_filter: str | None,
    queue: str | None,
    job: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """Runs by state, newest finished first."""
    found = inspect.runs(state.jq(), state=state_filter, queue=queue, job=job, limit=limit)
    rows = [
        [
            r.run_id,
            r.queue,
            r.task,
            r.state,
            f"{r.attempt}/{r.max_attempts}",
            r.fence,
            _abs(r.due_ms),
            _abs(r.finished_ms),
            (r.error or "")[:60],
        ]
        for r in found
    ]
    emit(
        as_json,
        [r.to_dict() for r in found],
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
        "no runs",
    )


@click.command()
@click.option("--queue")
@json_option
@pass_state
def stats(state: Any, queue: str | None, as_json: bool) -> None:
    """Per queue and partition: due now, later, running, expired leases, dead, throughput."""
    found = inspect.stats(state.jq(), queue)
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
            _rel(s.oldest_due_age_ms),
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
            "OLDEST DUE",
        ],
        "no queues yet",
    )


@click.command()
@json_option
@pass_state
def workers(state: Any, as_json: bool) -> None:
    """The live worker registry; stale workers (no heartbeat for 3 beats) are flagged."""
    found = inspect.workers(state.jq())
    rows = [
        [
            w.id,
            w.host,
            w.pid,
            ",".join(w.queues),
            f"{w.in_flight}/{w.concurrency}",
            _abs(w.started_ms),
            _rel(w.seen_ago_ms) + " ago",
            "STALE" if w.stale else "ok",
        ]
        for w in found
    ]
    emit(
        as_json,
        [w.to_dict() for w in found],
        rows,
        ["WORKER", "HOST", "PID", "QUEUES", "IN FLIGHT", "STARTED (UTC)", "LAST SEEN", "STATUS"],
        "no workers registered",
    )


@click.group()
def dead() -> None:
    """Dead runs: list, retry (requeue), purge."""


@dead.command("list")
@click.option("--queue")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 10_000))
@json_option
@pass_state
def dead_list(state: Any, queue: str | None, limit: int, as_json: bool) -> None:
    found = inspect.runs(state.jq(), state="dead", queue=queue, limit=limit)
    rows = [
        [
            r.run_id,
            r.queue,
            r.task,
            f"{r.attempt}/{r.max_attempts}",
            _abs(r.finished_ms),
            (r.error or "").splitlines()[-1][:80] if r.error else "",
        ]
        for r in found
    ]
    emit(
        as_json,
        [r.to_dict() for r in found],
        rows,
        ["RUN", "QUEUE", "TASK", "ATTEMPTS", "DIED (UTC)", "ERROR"],
        "no dead runs",
    )


def _dead_ids(jq: Any, run_ids: tuple[str, ...], all_: bool, queue: str | None) -> list[str]:
    if run_ids and all_:
        raise click.UsageError("give run ids or --all, not both")
    if not run_ids and not all_:
        raise click.UsageError("give run ids, or --all for every dead run")
    if run_ids:
        return list(run_ids)
    return [r.run_id for r in inspect.runs(jq, state="dead", queue=queue, limit=100_000)]


def _confirm(what: str, yes: bool) -> None:
    if not yes and not click.confirm(what, default=False):
        raise click.Abort()


@dead.command("retry")
@click.argument("run_ids", nargs=-1)
@click.option("--all", "all_", is_flag=True)
@click.option("--queue")
@click.option("--yes", is_flag=True, help="Do not ask.")
@pass_state
def dead_retry(
    state: Any, run_ids: tuple[str, ...], all_: bool, queue: str | None, yes: bool
) -> None:
    """Put dead runs back to pending, attempts reset."""
    jq = state.jq()
    ids = _dead_ids(jq, run_ids, all_, queue)
    _confirm(f"retry {len(ids)} dead run(s)?", yes or not all_)
    retried = 0
    for run_id in ids:
        try:
            jq.requeue(run_id, queue=queue)
            retried += 1
        except OperationRefused as exc:
            click.echo(f"skipped {run_id}: {exc}", err=True)
    click.echo(f"retried {retried} of {len(ids)} dead run(s)")


@dead.command("purge")
@click.argument("run_ids", nargs=-1)
@click.option("--all", "all_", is_flag=True)
@click.option("--queue")
@click.option("--yes", is_flag=True, help="Do not ask.")
@pass_state
def dead_purge(
    state: Any, run_ids: tuple[str, ...], all_: bool, queue: str | None, yes: bool
) -> None:
    """Delete dead runs for good (only runs still dead are touched)."""
    jq = state.jq()
    ids = _dead_ids(jq, run_ids, all_, queue)
    _confirm(f"purge {len(ids)} dead run(s) for good?", yes)
    groups: dict[Any, list[str]] = {}
    for run_id in ids:
        keys = jq.locate(run_id, queue)
        if keys is not None:
            groups.setdefault(keys, []).append(run_id)
    purged = refused = 0
    for keys, members in groups.items():
        p, r = ops.parse_purge(jq.scripts.run(ops.purge_call(keys, members)))
        purged, refused = purged + p, refused + r
    click.echo(
        f"purged {purged} dead run(s); {refused + len(ids) - sum(map(len, groups.values()))}"
        " not dead or not found"
    )


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
    help="Bytes per run row, as in the seed's estimate.",
)
@click.option(
    "--retention",
    default=24 * 3600,
    show_default=True,
    type=click.IntRange(1),
    help="Seconds a finished run is kept.",
)
@json_option
def capacity(jobs: int, every: int, row_bytes: int, retention: int, as_json: bool) -> None:
    """The seed's capacity arithmetic, plus the Redis memory our data model needs."""
    result = estimate(
        CapacityInputs(jobs=jobs, every_s=every, row_bytes=row_bytes, retention_s=retention)
    )
    if as_json:
        click.echo(json.dumps(result.to_dict()))
        return
    for line in result.lines():
        click.echo(line)


@click.command()
@pass_state
def check(state: Any) -> None:
    """Connectivity, server version, eviction policy, persistence, scripts, clock skew."""
    jq = state.jq()
    info = jq.redis.info()
    warnings = 0

    def line(ok: bool, text: str) -> None:
        nonlocal warnings
        warnings += 0 if ok else 1
        click.echo(f"{'ok  ' if ok else 'WARN'}  {text}")

    version = info.get("valkey_version") or info.get("redis_version")
    line(True, f"connected; server {info.get('server_name', 'redis')} {version}")
    policy = jq.redis.config_get("maxmemory-policy").get("maxmemory-policy", "?")
    line(
        policy == "noeviction",
        f"maxmemory-policy {policy}"
        + ("" if policy == "noeviction" else ": runs can be evicted; set noeviction"),
    )
    aof = info.get("aof_enabled") in (1, "1")
    line(aof, "appendonly yes" if aof else "appendonly no: a restart loses what was not saved")
    jq.scripts.load()
    line(True, "scripts loaded")
    # The host clock is read only to display its skew; no decision uses it.
    before = time.time()  # display only
    server_ms = jq.server_time_ms()
    local_ms = (before + time.time()) / 2 * 1000  # display only
    skew = server_ms - local_ms
    line(abs(skew) < 1000, f"clock skew host vs server {skew:+.0f} ms (decisions use the server's)")
    if warnings:
        click.echo(f"{warnings} warning(s)")


COMMANDS = [leases, runs, stats, workers, dead, capacity, check]
