"""A claimed run's lifecycle in the worker: one phase at a time (jobqueue.worker.runs), moved
only along the allowed transitions, and the table the worker's event loop asks which runs
hold a slot, need a heartbeat, or wait for their commit."""

from __future__ import annotations

import asyncio
import itertools

import pytest
from helpers import settle

from jobqueue.context import RunContext
from jobqueue.store.keys import PartitionKeys
from jobqueue.store.runs import ClaimedRun
from jobqueue.worker.runs import (
    HEARTBEATED,
    TRANSITIONS,
    Finished,
    InFlight,
    PhaseError,
    RunPhase,
    RunTable,
)

KEYS = PartitionKeys("default", 0)
CODE_RUNS = {
    RunPhase.RUNNING,
    RunPhase.LEASE_LOST,
    RunPhase.TIMED_OUT,
    RunPhase.OVERRUN,
    RunPhase.RELEASED,
}


def claimed(
    run_id: str = "r",
    fence: int = 7,
    lease_ms: int = 3000,
    timeout_s: float | None = 10.0,
    at: float = 100.0,
) -> InFlight:
    """A run claimed at ``at`` (clock seconds), its lease granted then."""
    run = ClaimedRun(run_id, fence, 1, 3, "t", "{}", 0, 0, run_id, None, 0)
    ctx = RunContext(run_id, fence, 1, 3, "t", "default", run_id, None)
    deadline = at + lease_ms / 1000
    return InFlight(run, KEYS, ctx, at, timeout_s, lease_ms, granted=at, lease_deadline=deadline)


@pytest.mark.parametrize(("frm", "to"), list(itertools.product(RunPhase, RunPhase)))
def test_a_run_moves_only_along_the_allowed_transitions(frm: RunPhase, to: RunPhase) -> None:
    entry = claimed()
    entry.phase = frm
    if to in TRANSITIONS[frm]:
        entry.move(to)
        assert entry.phase is to
    else:
        with pytest.raises(PhaseError):
            entry.move(to)
        assert entry.phase is frm


def test_every_phase_is_reachable_from_running_and_leads_to_done() -> None:
    reach = {RunPhase.RUNNING}
    while True:
        more = {to for frm in reach for to in TRANSITIONS[frm]} - reach
        if not more:
            break
        reach |= more
    assert reach == set(RunPhase)
    for phase in RunPhase:
        seen, todo = set(), [phase]
        while todo:
            p = todo.pop()
            seen.add(p)
            todo += [t for t in TRANSITIONS[p] if t not in seen]
        assert RunPhase.DONE in seen


def test_a_slot_is_held_exactly_while_the_runs_code_runs() -> None:
    assert {p for p in RunPhase if p.holds_slot} == CODE_RUNS


def test_a_returned_run_frees_its_slot_and_waits_for_its_commit_heartbeated() -> None:
    table, entry = RunTable(2), claimed()
    table.add(entry)
    assert table.free_slots() == 1
    assert table.returned(entry) is True  # its outcome goes to the committer
    assert entry.phase is RunPhase.COMMITTING
    assert table.free_slots() == 2
    assert table.in_phase(HEARTBEATED) == [entry]  # its lease is kept until the commit lands
    table.answered([Finished(entry, ok=True)])
    assert table.views() == []


def test_a_late_outcome_of_a_timed_out_run_is_discarded_and_its_slot_freed() -> None:
    table, entry = RunTable(2), claimed(timeout_s=1.0)
    table.add(entry)
    expired, stuck = table.timed_out(now=101.5)
    assert (expired, stuck) == ([entry], 1)
    assert entry.phase is RunPhase.TIMED_OUT
    assert table.in_phase(HEARTBEATED) == []
    table.answered([Finished(entry, ok=False, error="timed out")])  # the timeout's fail
    assert entry.phase is RunPhase.OVERRUN  # the code still holds its slot
    assert table.free_slots() == 1
    assert table.returned(entry) is False  # the late result is not committed
    assert (table.free_slots(), table.views()) == (2, [])


def test_a_timed_out_run_whose_code_returns_before_its_fail_lands_waits_for_the_fail() -> None:
    table, entry = RunTable(2), claimed(timeout_s=1.0)
    table.add(entry)
    table.timed_out(now=101.5)
    assert table.returned(entry) is False
    assert entry.phase is RunPhase.COMMITTING_UNLEASED
    assert table.free_slots() == 2
    table.answered([Finished(entry, ok=False, error="timed out")])
    assert table.views() == []


def test_a_run_within_its_timeout_is_left_alone() -> None:
    table, entry = RunTable(2), claimed(timeout_s=1.0)
    table.add(entry)
    assert table.timed_out(now=100.9) == ([], 0)
    assert entry.phase is RunPhase.RUNNING


def test_a_heartbeat_refused_as_finished_for_a_run_whose_commit_landed_is_no_news() -> None:
    table, entry = RunTable(2), claimed()
    table.add(entry)
    table.returned(entry)
    assert table.lost(entry, "finished") is False
    assert entry.phase is RunPhase.COMMITTING
    assert table.lost(entry, "fenced") is True
    assert entry.phase is RunPhase.COMMITTING_UNLEASED
    assert table.in_phase(HEARTBEATED) == []


def test_a_running_run_whose_heartbeat_is_refused_stops_being_heartbeated() -> None:
    table, entry = RunTable(2), claimed()
    table.add(entry)
    assert table.lost(entry, "cancelled") is True
    assert entry.phase is RunPhase.LEASE_LOST
    assert table.lost(entry, "cancelled") is False  # told once
    assert table.in_phase(HEARTBEATED) == []


def test_a_lease_run_out_unrenewed_stops_a_running_run_and_leaves_a_returned_one_be() -> None:
    table = RunTable(3)
    running, returned = claimed("a"), claimed("b")
    table.add(running)
    table.add(returned)
    table.returned(returned)
    assert table.lease_ran_out(now=102.9) == []
    assert table.lease_ran_out(now=103.1) == [running]
    assert (running.phase, returned.phase) == (RunPhase.LEASE_LOST, RunPhase.COMMITTING)


def test_shutdown_hands_back_only_runs_with_no_outcome_yet() -> None:
    table = RunTable(4)
    running, lost, committing, timed_out = (claimed(r, timeout_s=1.0) for r in "abcd")
    for e in (running, lost, committing, timed_out):
        table.add(e)
    running.timeout_s = lost.timeout_s = committing.timeout_s = None
    table.lost(lost, "fenced")
    table.returned(committing)
    table.timed_out(now=102.0)
    assert table.release_unfinished() == [running, lost]
    assert running.phase is lost.phase is RunPhase.RELEASED
    assert table.returned(running) is False  # whatever the code returns now is discarded


def test_a_lease_needs_renewing_a_third_of_it_after_it_was_granted() -> None:
    table = RunTable(2)
    short, long = claimed("a", lease_ms=1500, at=100.0), claimed("b", lease_ms=30_000, at=100.0)
    table.add(long)
    assert table.renewal_due(since=100.0) == 110.0
    table.add(short)
    assert table.renewal_due(since=100.0) == 100.5
    assert table.renewal_due(since=100.1) is None  # granted before the last round


def test_waiting_for_room_gives_no_slots_once_stopping() -> None:
    table = RunTable(1)
    table.add(claimed())
    assert asyncio.run(table.wait_for_room(lambda: True)) == 0


def test_a_returning_run_wakes_the_claim_loop_waiting_for_room() -> None:
    table, entry = RunTable(1), claimed()
    table.add(entry)

    async def wait_then_return() -> int:
        waiting = asyncio.ensure_future(table.wait_for_room(lambda: False))
        await settle()
        assert not waiting.done()  # no room: it waits
        table.returned(entry)
        return await asyncio.wait_for(waiting, 10)

    assert asyncio.run(wait_then_return()) == 1


def test_waiting_for_a_batch_claims_what_is_free_after_the_linger() -> None:
    table = RunTable(4)
    table.add(claimed("a"))
    table.add(claimed("b"))
    assert asyncio.run(table.wait_for_room(lambda: False, batch=4, linger=0.01)) == 2


def test_a_claim_loop_waiting_for_a_batch_goes_on_once_the_batch_is_free() -> None:
    table = RunTable(4)
    runs = [claimed(f"r{i}") for i in range(4)]
    for e in runs:
        table.add(e)
    table.returned(runs[0])

    async def waiter() -> int:
        waiting = asyncio.ensure_future(table.wait_for_room(lambda: False, batch=3, linger=60))
        await settle()
        table.returned(runs[1])  # 2 free of the 3 waited for: it waits on
        await settle()
        assert not waiting.done()
        table.returned(runs[2])
        return await asyncio.wait_for(waiting, 10)

    assert asyncio.run(waiter()) == 3


def test_the_last_run_returning_ends_the_wait_of_a_claim_loop_short_of_its_batch() -> None:
    table, entry = RunTable(4), claimed()
    table.add(entry)
    table.add(other := claimed("other"))
    table.returned(other)

    async def waiter() -> int:
        waiting = asyncio.ensure_future(table.wait_for_room(lambda: False, batch=8, linger=60))
        await settle()
        table.returned(entry)  # the table is idle: nothing more will free up
        return await asyncio.wait_for(waiting, 10)

    assert asyncio.run(waiter()) == 4
