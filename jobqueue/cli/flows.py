"""`jobqueue flows`: workflows and batches with their progress, or one flow's runs."""

from __future__ import annotations

import json
from typing import Any

import click

from jobqueue.cli.common import one_line, pass_state, warn_anomalies
from jobqueue.cli.format import table, when
from jobqueue.cli.output import emit, json_option
from jobqueue.errors import RunNotFound
from jobqueue.ops import flow_queries
from jobqueue.ops.flow_queries import FlowSummary
from jobqueue.store.keys import validate_run_id


def _states(s: FlowSummary) -> str:
    return ", ".join(f"{n} {state}" for state, n in s.states.items() if n)


@click.command()
@click.argument("flow_id", required=False)
@click.option("--queue", help="Only flows with runs in this queue.")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 1000))
@json_option
@pass_state
def flows(state: Any, flow_id: str | None, queue: str | None, limit: int, as_json: bool) -> None:
    """Workflows and batches, newest first, with their progress: finished runs of all (an
    expired run finished before its record went), and how many runs are in each state.
    With FLOW_ID: that flow's runs and what each waits on."""
    jq = state.jq()
    if flow_id is not None:
        _one(jq, validate_run_id(flow_id), as_json)
        return
    found = flow_queries.flows(jq, queue, limit)
    now = jq.server_time_ms()
    rows = [
        [s.flow_id, s.progress, s.failed, _states(s), when(s.created_ms, now),
         ", ".join(s.queues)]
        for s in found
    ]
    emit(as_json, [s.to_dict() for s in found], rows,
         ["FLOW", "FINISHED", "FAILED", "RUNS BY STATE", "CREATED (UTC)", "QUEUES"],
         "no flows", found)


def _one(jq: Any, flow_id: str, as_json: bool) -> None:
    detail = flow_queries.flow(jq, flow_id)
    if detail is None:
        raise RunNotFound(f"no flow {flow_id!r} (never created, or its records all expired)")
    warn_anomalies(list(detail.summary.anomalies))
    if as_json:
        click.echo(json.dumps(detail.to_dict(), default=str))
        return
    s = detail.summary
    click.echo(f"flow {one_line(s.flow_id)}: {s.progress} finished, {s.failed} failed "
               f"({_states(s)})")
    waits: dict[str, list[str]] = {}
    for e in detail.edges:
        waits.setdefault(e.waiting, []).append(
            e.dependency if e.policy == "fail" else f"{e.dependency} ({e.policy})"
        )
    rows = [
        [r.run_id, r.queue, r.task or "-", r.state,
         one_line(", ".join(waits.get(r.run_id, [])))[:80] or "-"]
        for r in detail.runs
    ]
    click.echo(table(rows, ["RUN", "QUEUE", "TASK", "STATE", "WAITS ON"]))
