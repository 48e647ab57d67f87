"""A run's state changed by hand: ``jobqueue cancel`` and ``jobqueue requeue``, each
idempotent (a second call on a run already there exits 0)."""

from __future__ import annotations

import click

from jobqueue.cli.common import State, pass_state, yes_option
from jobqueue.cli.output import confirm
from jobqueue.errors import OperationRefused


@click.command()
@click.argument("run_id")
@click.option("--queue")
@click.option("--reason", default="cancelled from the CLI", show_default=True)
@yes_option
@pass_state
def cancel(state: State, run_id: str, queue: str | None, reason: str, yes: bool) -> None:
    """Cancel a pending or running run (a running worker is fenced out).

    Idempotent: an already cancelled run exits 0; a done or dead one is refused (exit 1)."""
    jq = state.jq()
    try:
        previous = jq.cancel(run_id, queue=queue, reason=reason)
    except OperationRefused:
        run = jq.find_run(run_id, queue)
        if run is None or run.state != "cancelled":
            raise
        click.echo(f"{run_id} is already cancelled (nothing to do)")
        return
    click.echo(f"cancelled {run_id} (was {previous})")


@click.command()
@click.argument("run_id")
@click.option("--queue")
@click.option("--force", is_flag=True, help="Requeue a done run too (it runs again).")
@click.option("--yes", is_flag=True, help="Do not ask before requeueing a done run (as --force).")
@pass_state
def requeue(state: State, run_id: str, queue: str | None, force: bool, yes: bool) -> None:
    """Put a dead or cancelled run back to pending, attempts reset. A done run runs again:
    asked first (no answer refuses), unless --force or --yes.

    Idempotent: an already pending run exits 0; a running one is refused (exit 1)."""
    jq = state.jq()
    force = force or yes
    if not force:
        run = jq.find_run(run_id, queue)
        if run is not None and run.state == "done":
            # No answer (a script) refuses: a done run runs again only when asked for.
            confirm(f"{run_id} is done: requeue it to run again?", False, "--force")
            force = True
    try:
        previous = jq.requeue(run_id, queue=queue, force=force)
    except OperationRefused:
        run = jq.find_run(run_id, queue)
        if run is None or run.state != "pending":
            raise
        click.echo(f"{run_id} is already pending (nothing to do)")
        return
    click.echo(f"requeued {run_id} (was {previous})")
