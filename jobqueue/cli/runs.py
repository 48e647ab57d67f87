"""``jobqueue runs``: a page of runs by state and filters, and the listing options, query and
page footer that ``jobqueue dead`` shares."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from jobqueue.cli.common import pass_state
from jobqueue.cli.format import when
from jobqueue.cli.output import emit, json_option
from jobqueue.ops.listing import RunPage, RunQuery, runs_page
from jobqueue.policy.timeutil import when_to_ms


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
