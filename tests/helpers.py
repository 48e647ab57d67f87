"""What many tests do first: create runs and claim them, through the real scripts and with an
explicit clock (``now`` in ms; None: the server's). ``runner`` is a ScriptRunner (a test's
``runner`` fixture, or ``jq.scripts``)."""

from __future__ import annotations

from typing import Any

from jobqueue.store.keys import PartitionKeys
from jobqueue.store.runs import CLAIM, CREATE_RUN, ClaimedRun, ClaimResult, RunSpec
from jobqueue.store.scripts import ScriptRunner

PAYLOAD = '{"args":[],"kwargs":{}}'
LEASE_MS = 30_000
# How long a run that claim dead-letters (lease expired on its last attempt) is kept.
DEAD_RETENTION_MS = 7_200_000


def spec(run_id: str, task: str = "t", payload: str = PAYLOAD, **fields: Any) -> RunSpec:
    """A run to create: task 't' with no arguments unless told; ``fields`` are RunSpec's
    (max_attempts, lease_ms, delay_ms, job_id, ...)."""
    return RunSpec(run_id, task, payload, **fields)


def create(
    runner: ScriptRunner,
    pk: PartitionKeys,
    *runs: str | RunSpec,
    now: int | None = 0,
    **fields: Any,
) -> list[bool]:
    """Create runs (run ids become ``spec(run_id, **fields)``) in one call; whether each was
    created (False: the run id existed)."""
    specs = [r if isinstance(r, RunSpec) else spec(r, **fields) for r in runs]
    return CREATE_RUN.parse(runner.run(CREATE_RUN.call(pk, specs, now=now)))


def create_new(
    runner: ScriptRunner,
    pk: PartitionKeys,
    *runs: str | RunSpec,
    now: int | None = 0,
    **fields: Any,
) -> None:
    """:func:`create`, for runs that must not exist yet."""
    assert all(create(runner, pk, *runs, now=now, **fields))


def claim(
    runner: ScriptRunner,
    pk: PartitionKeys,
    now: int | None = None,
    limit: int = 10,
    owner: str = "w1",
    lease_ms: int = LEASE_MS,
    retention_ms: int = DEAD_RETENTION_MS,
) -> ClaimResult:
    """Claim up to ``limit`` runs of one partition for ``owner``."""
    call = CLAIM.call(pk, limit, owner, lease_ms, retention_ms, now=now)
    return CLAIM.parse(runner.run(call))


def claim_one(
    runner: ScriptRunner,
    pk: PartitionKeys,
    now: int | None = None,
    owner: str = "w1",
    lease_ms: int = LEASE_MS,
    retention_ms: int = DEAD_RETENTION_MS,
) -> ClaimedRun:
    """Claim the one run due (the test keeps exactly one due)."""
    (run,) = claim(runner, pk, now, 1, owner, lease_ms, retention_ms).runs
    return run
