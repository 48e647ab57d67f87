"""The seed's sections 3 and 4, replayed through the real Lua scripts with an explicit clock
(seconds in the seed, milliseconds in the scripts). The printed lines must be the seed's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jobqueue import ops
from jobqueue.keys import PartitionKeys
from jobqueue.scripts import ScriptRunner

LEASE_MS = 30_000
# The seed's printed output, vendored so a clone without ../shared still checks against it.
SEED_OUTPUT = Path(__file__).resolve().parent / "data" / "seed_expected_output.txt"
SHARED_SEED_OUTPUT = (
    Path(__file__).resolve().parents[2] / "shared/seeds/000_20601c2b00efc37c.expected-output.txt"
)

EXPECTED_3 = """\
scheduler-A: INSERT report@60 -> created
scheduler-B: INSERT report@60 -> already exists, ignored"""

EXPECTED_4 = """\
t=60 W1 claims report@60 attempt 1 fence 1 lease until 90
t=70 W1 heartbeat -> lease until 100
t=71 W1 stalls (long GC pause / network partition), no more heartbeats
t=85 W2 finds nothing to claim
t=101 W2 claims report@60 attempt 2 fence 2 lease until 131
t=105 W2 commit fence 2 accepted -> report@60 DONE
t=110 W1 commit fence 1 REJECTED (current fence 2)
side effects applied for report@60: 1"""


def replay(runner: ScriptRunner, pk: PartitionKeys) -> tuple[str, str]:
    lines3 = []
    for who in ("scheduler-A", "scheduler-B"):
        spec = ops.RunSpec("report@60", "report", '{"args":[],"kwargs":{}}', due_at_ms=60_000)
        (created,) = ops.parse_create(runner.run(ops.create_call(pk, [spec], now=60_000)))
        lines3.append(
            f"{who}: INSERT report@60 -> " + ("created" if created else "already exists, ignored")
        )

    lines4: list[str] = []
    effects: set[str] = set()

    def claim(t: int, worker: str) -> ops.ClaimedRun | None:
        call = ops.claim_call(pk, 1, worker, LEASE_MS, 1, now=t * 1000)
        result = ops.parse_claim(runner.run(call))
        if not result.runs:
            lines4.append(f"t={t} {worker} finds nothing to claim")
            return None
        r = result.runs[0]
        lines4.append(
            f"t={t} {worker} claims {r.run_id} attempt {r.attempt} fence {r.fence} "
            f"lease until {r.lease_until_ms // 1000}"
        )
        return r

    def heartbeat(t: int, worker: str, c: ops.ClaimedRun) -> None:
        call = ops.heartbeat_call(pk, [(c.run_id, c.fence)], LEASE_MS, now=t * 1000)
        (answer,) = ops.parse_heartbeat(runner.run(call))
        assert isinstance(answer, int)
        lines4.append(f"t={t} {worker} heartbeat -> lease until {answer // 1000}")

    def complete(t: int, worker: str, c: ops.ClaimedRun) -> None:
        call = ops.complete_call(pk, c.run_id, c.fence, "null", 3_600_000, now=t * 1000)
        outcome = ops.parse_outcome(runner.run(call))
        if not outcome.accepted:
            lines4.append(
                f"t={t} {worker} commit fence {c.fence} REJECTED "
                f"(current fence {outcome.current_fence})"
            )
            return
        effects.add(c.run_id)  # the side effect, keyed by run id, applied only when accepted
        lines4.append(f"t={t} {worker} commit fence {c.fence} accepted -> {c.run_id} DONE")

    c1 = claim(60, "W1")
    assert c1 is not None
    heartbeat(70, "W1", c1)
    lines4.append("t=71 W1 stalls (long GC pause / network partition), no more heartbeats")
    claim(85, "W2")
    c2 = claim(101, "W2")
    assert c2 is not None
    complete(105, "W2", c2)
    complete(110, "W1", c1)
    lines4.append(f"side effects applied for report@60: {len(effects)}")
    return "\n".join(lines3), "\n".join(lines4)


def test_seed_sections_3_and_4_replay_through_the_scripts(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    section3, section4 = replay(runner, pk)
    assert section3 == EXPECTED_3
    assert section4 == EXPECTED_4


def test_expected_lines_are_the_seeds_own() -> None:
    """Guards the constants above against drifting from the seed document (and the vendored
    copy against drifting from ../shared, where that folder is present, as in CI)."""
    seed = SEED_OUTPUT.read_text()
    assert EXPECTED_3 in seed
    assert EXPECTED_4 in seed
    if SHARED_SEED_OUTPUT.exists():
        assert SHARED_SEED_OUTPUT.read_text() == seed


def test_the_stored_run_is_done_with_fence_2(runner: ScriptRunner, pk: PartitionKeys,
                                              redis_client: Any) -> None:
    replay(runner, pk)
    run = redis_client.hgetall(pk.run("report@60"))
    assert run["state"] == "done"
    assert run["fence"] == "2"
    assert run["attempt"] == "2"
    assert run["owner"] == "W2"
