"""``jobqueue leases``: which worker holds which run's lease, and for how long still."""

from __future__ import annotations

from typing import Any

import click

from jobqueue.cli.common import pass_state
from jobqueue.cli.format import abs_time, duration
from jobqueue.cli.output import emit, json_option
from jobqueue.ops import queries


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
    found = queries.leases(state.jq(), queue, expired_only=expired, worker=worker, limit=limit)
    rows = [
        [
            lease.run_id,
            lease.task,
            lease.owner,
            lease.host or "?",
            lease.pid or "?",
            lease.fence,
            lease.attempt,
            duration(lease.remaining_ms) + (" EXPIRED" if lease.expired else ""),
            abs_time(lease.lease_until_ms),
            duration(lease.running_for_ms),
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
        found,
    )
