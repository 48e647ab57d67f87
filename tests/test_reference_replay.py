"""The reference replay (docs/design.md, "The run-lifecycle replay"): two schedulers creating
one run, then a lease, a heartbeat, a stalled worker and its refused commit, through the real
Lua scripts with an explicit clock (seconds in the lines, milliseconds in the scripts). The
printed lines must be exactly the reference lines.

Fences are only ever compared, and the scripts issue them above the clock in microseconds
(docs/design.md, "Fences"): the lines number them 1, 2, ... in the order they were issued, as
the reference does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jobqueue.store.keys import PartitionKeys
from jobqueue.store.runs import CLAIM, COMPLETE, CREATE_RUN, HEARTBEAT, ClaimedRun, RunSpec
from jobqueue.store.scripts import ScriptRunner

LEASE_MS = 30_000
# The reference output: the expected lines of every reference scenario of docs/design.md.
REFERENCE_OUTPUT = Path(__file__).resolve().parent / "data" / "reference_replay_output.txt"
# Where a checkout also has the original copy of that output beside the project, it must match.
ORIGINAL_OUTPUT = (
    Path(__file__).resolve().parents[2] / "shared/seeds/000_20601c2b00efc37c.expected-output.txt"
)

EXPECTED_CREATION = """\
scheduler-A: INSERT report@60 -> created
scheduler-B: INSERT report@60 -> already exists, ignored"""

EXPECTED_LIFECYCLE = """\
t=60 W1 claims report@60 attempt 1 fence 1 lease until 90
t=70 W1 heartbeat -> lease until 100
t=71 W1 stalls (long GC pause / network partition), no more heartbeats
t=85 W2 finds nothing to claim
t=101 W2 claims report@60 attempt 2 fence 2 lease until 131
t=105 W2 commit fence 2 accepted -> report@60 DONE
t=110 W1 commit fence 1 REJECTED (current fence 2)
side effects applied for report@60: 1"""


def replay(runner: ScriptRunner, pk: PartitionKeys) -> tuple[str, str, list[int]]:
    creation = []
    for who in ("scheduler-A", "scheduler-B"):
        spec = RunSpec("report@60", "report", '{"args":[],"kwargs":{}}', due_at_ms=60_000)
        (created,) = CREATE_RUN.parse(runner.run(CREATE_RUN.call(pk, [spec], now=60_000)))
        creation.append(
            f"{who}: INSERT report@60 -> " + ("created" if created else "already exists, ignored")
        )

    lifecycle: list[str] = []
    effects: set[str] = set()
    issued: list[int] = []

    def nth(fence: int | None) -> int:
        """The fence's place in the order of issue (1 = the first)."""
        return issued.index(fence) + 1 if fence in issued else 0

    def claim(t: int, worker: str) -> ClaimedRun | None:
        call = CLAIM.call(pk, 1, worker, LEASE_MS, 1, now=t * 1000)
        result = CLAIM.parse(runner.run(call))
        if not result.runs:
            lifecycle.append(f"t={t} {worker} finds nothing to claim")
            return None
        r = result.runs[0]
        assert all(r.fence > f for f in issued), "a fence greater than every one before"
        issued.append(r.fence)
        lifecycle.append(
            f"t={t} {worker} claims {r.run_id} attempt {r.attempt} fence {nth(r.fence)} "
            f"lease until {r.lease_until_ms // 1000}"
        )
        return r

    def heartbeat(t: int, worker: str, c: ClaimedRun) -> None:
        call = HEARTBEAT.call(pk, [(c.run_id, c.fence)], LEASE_MS, now=t * 1000)
        (answer,) = HEARTBEAT.parse(runner.run(call)).answers
        assert isinstance(answer, int)
        lifecycle.append(f"t={t} {worker} heartbeat -> lease until {answer // 1000}")

    def complete(t: int, worker: str, c: ClaimedRun) -> None:
        call = COMPLETE.call(pk, [(c.run_id, c.fence, "null")], 3_600_000, now=t * 1000)
        (outcome,) = COMPLETE.parse(runner.run(call))
        if not outcome.accepted:
            lifecycle.append(
                f"t={t} {worker} commit fence {nth(c.fence)} REJECTED "
                f"(current fence {nth(outcome.current_fence)})"
            )
            return
        effects.add(c.run_id)  # the side effect, keyed by run id, applied only when accepted
        lifecycle.append(
            f"t={t} {worker} commit fence {nth(c.fence)} accepted -> {c.run_id} DONE"
        )

    c1 = claim(60, "W1")
    assert c1 is not None
    heartbeat(70, "W1", c1)
    lifecycle.append("t=71 W1 stalls (long GC pause / network partition), no more heartbeats")
    claim(85, "W2")
    c2 = claim(101, "W2")
    assert c2 is not None
    complete(105, "W2", c2)
    complete(110, "W1", c1)
    lifecycle.append(f"side effects applied for report@60: {len(effects)}")
    return "\n".join(creation), "\n".join(lifecycle), issued


def test_the_reference_replay_runs_through_the_scripts(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    creation, lifecycle, _ = replay(runner, pk)
    assert creation == EXPECTED_CREATION
    assert lifecycle == EXPECTED_LIFECYCLE


def test_expected_lines_are_the_reference_output() -> None:
    """Guards the constants above against drifting from the reference output (and that file
    against drifting from its original copy, where a checkout has one beside the project)."""
    reference = REFERENCE_OUTPUT.read_text()
    assert EXPECTED_CREATION in reference
    assert EXPECTED_LIFECYCLE in reference
    if ORIGINAL_OUTPUT.exists():
        assert ORIGINAL_OUTPUT.read_text() == reference


def test_the_stored_run_is_done_with_the_second_fence(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    _, _, issued = replay(runner, pk)
    run = redis_client.hgetall(pk.run("report@60"))
    assert run["state"] == "done"
    assert run["fence"] == str(issued[1])
    assert run["attempt"] == "2"
    assert run["owner"] == "W2"
