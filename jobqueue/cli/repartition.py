"""``jobqueue repartition QUEUE --partitions N``, the migration that changes a queue's
partition count (the logic is ``jobqueue.ops.repartition``), and ``jobqueue repair``, which puts
every run back in its index (``jobqueue.ops.repair``)."""

from __future__ import annotations

import json
from typing import Any

import click

from jobqueue.cli.common import warn_anomalies
from jobqueue.cli.output import progress
from jobqueue.ops import repair as repair_mod
from jobqueue.ops import repartition as rp
from jobqueue.store.keys import MAX_PARTITIONS, validate_queue_name

# Commands receive jobqueue.cli.State (ctx.obj).
pass_state = click.pass_obj

BEFORE = (
    "stop every worker, scheduler and producer of this queue first (they keep the count they "
    "read at start) and restart them afterwards"
)


def _ranges(pairs: list[tuple[int, int]]) -> str:
    return ", ".join(f"{a}->{b}" for a, b in pairs)


def _summary(report: rp.Report) -> list[str]:
    states = ", ".join(f"{state} {n:,}" for state, n in sorted(report.moved.items()))
    lines = [
        f"queue {report.queue!r}: {report.old} -> {report.new} partitions",
        f"moved {report.total_moved:,} runs"
        + (f" ({states})" if states else "")
        + f"; {report.stayed:,} were already in place",
    ]
    if report.late:
        lines.append(
            f"{report.late:,} runs arrived during the move and were moved too: is a producer "
            "still running with the old count?"
        )
    if report.gone:
        lines.append(f"dropped {report.gone:,} index entries whose records had expired")
    if report.folded:
        lines.append(f"counters folded into the remaining partitions: {_ranges(report.folded)}")
    lines.append(f"recorded {report.new} partitions in {report.seconds:.2f} s")
    return lines


@click.command()
@click.argument("queue")
@click.option(
    "--partitions",
    "count",
    required=True,
    type=click.IntRange(1, MAX_PARTITIONS),
    help="The new partition count.",
)
@click.option("--yes", is_flag=True, help="Do not ask.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_state
def repartition(state: Any, queue: str, count: int, yes: bool, as_json: bool) -> None:
    """Change QUEUE's partition count: move every run (pending, dead, finished) to its new
    partition, then record the count. Refused while runs are running or workers serve the
    queue; safe to re-run after an interruption (it finishes the move)."""
    jq = state.jq()
    before = rp.plan(jq, queue, count)
    # The question goes to stderr, so that --json output stays one JSON document.
    if not yes and not click.confirm(f"{before.describe()}\n{BEFORE}. Move now?", err=True):
        click.echo("error: not confirmed: nothing moved", err=True)
        raise click.exceptions.Exit(1)
    # A bar on a terminal only; entries moved into a partition scanned later are seen twice.
    with progress(before.total, f"moving {queue}") as advance:
        report = rp.repartition(jq, queue, count, advance=advance)
    if as_json:
        click.echo(json.dumps(report.to_dict()))
    else:
        for line in _summary(report):
            click.echo(line)


@click.command()
@click.option("--queue", "queues", multiple=True, help="Only this queue (repeatable).")
@click.option("--dry-run", is_flag=True, help="Say what would change; change nothing.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_state
def repair(state: Any, queues: tuple[str, ...], dry_run: bool, as_json: bool) -> None:
    """Put every run back in the index its state belongs to: a record with no index entry (a
    pending run no claim sees) gets it back; an index entry with no record becomes an orphan
    (kept until its record comes back: a slot being imported). Run it after moving Redis
    Cluster slots by hand, a partial restore or foreign writes; safe while workers run, and to
    run again. Reads every key of every partition (SCAN on each node): minutes for millions."""
    jq = state.jq()
    for name in queues:
        validate_queue_name(name)
    table = jq.queue_table()
    warn_anomalies(table.anomalies)  # entries no command can use: left alone, named
    names = list(queues) or sorted(table.counts)
    reports = [repair_mod.repair_queue(jq, name, dry_run=dry_run) for name in names]
    if as_json:
        click.echo(json.dumps([r.to_dict() for r in reports]))
        return
    verb = "would be" if dry_run else "were"
    for r in reports:
        t = r.totals
        click.echo(
            f"queue {r.queue!r} ({r.partitions} partitions): {t.indexed:,} runs {verb} put back "
            f"in their index, {t.orphaned:,} index entries without a record {verb} set aside "
            f"as orphans, {t.unorphaned:,} orphans {verb} put back; {t.unchanged:,} were in place"
        )
