"""``jobqueue groups``: fair shares between a queue's groups (a run's group is its
limit_key): list them, turn fair shares on or off, set a group's weight and max_size, pause
and resume one group."""

from __future__ import annotations

import json
from typing import Any

import click

from jobqueue.cli.common import pass_state, warn_anomalies


@click.group()
def groups() -> None:
    """Fair shares between a queue's groups: list, fair, set, pause, resume.

    With fair shares on, claims serve the queue's groups (a run's group is its limit_key;
    runs without one form the group shown as -) in weighted turns, priority first within a
    group."""


@groups.command("list")
@click.argument("queue")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per group.")
@pass_state
def list_groups(state: Any, queue: str, as_json: bool) -> None:
    """QUEUE's groups: weight, max_size, paused, runs waiting, running and served."""
    jq = state.jq()
    found = jq.groups(queue)
    _print_groups(jq, queue, found, as_json)
    # Foreign data met: one line each on stderr, the listing as far as it could be read.
    warn_anomalies([*found.anomalies, *(a for g in found for a in g.anomalies)])


def _print_groups(jq: Any, queue: str, found: Any, as_json: bool) -> None:
    if as_json:
        for g in found:
            click.echo(json.dumps({
                "group": g.name, "weight": g.weight, "max_size": g.max_size, "paused": g.paused,
                "waiting": g.waiting, "running": g.running, "served": g.served,
            }))
        return
    click.echo(f"queue {queue}: fair shares {'on' if jq.fair_shares(queue) else 'off'}")
    if not found:
        click.echo("no groups")
        return
    click.echo(f"{'GROUP':<24} {'WEIGHT':>6} {'MAX':>8} {'PAUSED':>6} {'WAITING':>9} "
               f"{'RUNNING':>8} {'SERVED':>10}")
    for g in found:
        click.echo(
            f"{(g.name or '-'):<24} {g.weight:>6} {g.max_size if g.max_size else '-':>8} "
            f"{'yes' if g.paused else 'no':>6} {g.waiting:>9} {g.running:>8} {g.served:>10}"
        )


@groups.command("fair")
@click.argument("queue")
@click.argument("switch", type=click.Choice(["on", "off"]))
@pass_state
def fair(state: Any, queue: str, switch: str) -> None:
    """Turn fair shares on or off for QUEUE (every partition)."""
    changed = state.jq().set_fair_shares(queue, switch == "on")
    click.echo(f"queue {queue}: fair shares {switch}{'' if changed else ' (nothing to do)'}")


@groups.command("set")
@click.argument("queue")
@click.argument("group")
@click.option("--weight", type=click.IntRange(1, 1000), help="Its share of claims (default 1).")
@click.option("--max-size", type=click.IntRange(0), help="The most runs waiting in it; 0: none.")
@pass_state
def set_group(
    state: Any, queue: str, group: str, weight: int | None, max_size: int | None
) -> None:
    """Set GROUP's weight and max_size in QUEUE ('-' names the runs without a limit_key)."""
    if weight is None and max_size is None:
        raise click.UsageError("give --weight or --max-size")
    name = "" if group == "-" else group
    changed = state.jq().set_group(queue, name, weight=weight, max_size=max_size)
    click.echo(f"queue {queue} group {group}: {'set' if changed else 'already so (nothing to do)'}")


@groups.command("pause")
@click.argument("queue")
@click.argument("group")
@pass_state
def pause(state: Any, queue: str, group: str) -> None:
    """Stop claims of GROUP's runs in QUEUE (enqueues go on)."""
    changed = state.jq().pause_group(queue, "" if group == "-" else group)
    click.echo(f"queue {queue} group {group}: {'paused' if changed else 'already paused'}")


@groups.command("resume")
@click.argument("queue")
@click.argument("group")
@pass_state
def resume(state: Any, queue: str, group: str) -> None:
    """Let claims of GROUP's runs in QUEUE go on."""
    changed = state.jq().resume_group(queue, "" if group == "-" else group)
    click.echo(f"queue {queue} group {group}: {'resumed' if changed else 'not paused'}")
