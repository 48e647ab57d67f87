"""The worker registry: ``jobqueue workers`` (``list``, the default, and ``prune``)."""

from __future__ import annotations

import json
from typing import Any

import click

from jobqueue.cli.common import pass_state
from jobqueue.cli.format import when
from jobqueue.cli.output import emit, json_option
from jobqueue.ops import queries
from jobqueue.ops import workers as worker_registry


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
