"""Dead runs: ``jobqueue dead list|retry|purge``."""

from __future__ import annotations

import sys
from typing import Any

import click

from jobqueue.anomalies import Anomaly
from jobqueue.cli.common import one_line, pass_state, warn_anomalies
from jobqueue.cli.format import when
from jobqueue.cli.output import confirm, emit, json_option, progress
from jobqueue.cli.runs import listing_options, page_footer, paging_options, run_query
from jobqueue.ops.listing import iter_runs, runs_page
from jobqueue.store.keys import PartitionKeys

# Runs per round trip of `dead retry` (one requeue call each): one progress step each.
BULK_CHUNK = 500


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
