"""Test-only ways to build and read script calls, on top of the contracts in jobqueue.store
(the product builds the same calls in its own shapes)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from jobqueue.store.runs import BOUNCE, COMPLETE, FAIL, RELEASE, Bounced, Outcome
from jobqueue.store.schedules import AdvanceHeader
from jobqueue.store.scripts import Call


@dataclass(frozen=True)
class Advance:
    """One job's compare-and-set move of its next fire time, with what the tick counted (the
    scheduler builds advance.lua's group headers directly)."""

    job_id: str
    expected_next_ms: int
    new_next_ms: int | None
    fired: int = 0
    missed: int = 0
    skipped: int = 0
    dropped: int = 0
    last_fire_ms: int | None = None
    through_ms: int = 0
    buffered: str = ""  # buffer-one: the buffered run's entry to record, '' for none


def advance_groups(moves: Sequence[Advance]) -> list[tuple[AdvanceHeader, list[str]]]:
    """The moves as ADVANCE.call takes them: moves that share everything but the job id travel
    as one group."""
    groups: dict[AdvanceHeader, list[str]] = {}
    for m in moves:
        header: AdvanceHeader = (
            m.expected_next_ms,
            "" if m.new_next_ms is None else m.new_next_ms,
            m.fired,
            m.missed,
            m.skipped,
            m.dropped,
            "" if m.last_fire_ms is None else m.last_fire_ms,
            m.through_ms,
            m.buffered,
        )
        groups.setdefault(header, []).append(m.job_id)
    return list(groups.items())


def outcome(call: Call, reply: Any) -> Outcome | Bounced:
    """The outcome of a one-run fenced call (complete of one run, fail, release or bounce),
    read by its script's contract."""
    if call.script == "complete":
        (one,) = COMPLETE.parse(reply)
        return one
    if call.script == "bounce":
        return BOUNCE.parse(reply)
    return {"fail": FAIL, "release": RELEASE}[call.script].parse(reply)
