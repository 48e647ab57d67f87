"""``jobqueue show``: everything about one run (its record, what holds its queue back, its
history, kept tracebacks) and, for a workflow step, the tree of runs it waits on."""

from __future__ import annotations

import json

import click

from jobqueue.cli.common import State, ms_to_text, one_line, pass_state, warn_anomalies
from jobqueue.cli.format import rate as rate_text
from jobqueue.cli.format import when
from jobqueue.client.sync import JobQueue
from jobqueue.errors import JobQueueError
from jobqueue.models import DependencyState, Run
from jobqueue.policy.timeutil import instants_shown


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
        *(() if run.parked is None else [("parked", f"waiting for a slot of {run.parked}")]),
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
