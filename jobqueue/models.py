"""What a run looks like to Python: parsed from its hash and history, never executed."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Generic, cast

from typing_extensions import TypeVar

from jobqueue.anomalies import Anomaly, is_time
from jobqueue.payload import decode_payload, decode_result

_CANCELLED_FENCE = re.compile(r" cancelled \(was running, fence=(\d+)\)")

FINISHED_STATES = frozenset({"done", "dead", "cancelled"})
STATES = ("pending", "running", "done", "dead", "cancelled")
# The record's integer fields (create_run.lua, claim.lua, ...): anything else stored in one is
# shown as its default and reported as an anomaly of the run.
INT_FIELDS = (
    "attempt",
    "max_attempts",
    "fence",
    "lease_until",
    "due",
    "created",
    "started",
    "finished",
    "scheduled_for",
)
TIME_FIELDS = frozenset({"lease_until", "due", "created", "started", "finished", "scheduled_for"})


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value not in (None, "") else None
    except ValueError:
        return None


# What the run's task returns (``Run[int]``); a bare ``Run`` is ``Run[Any]``.
R_co = TypeVar("R_co", covariant=True, default=Any)


@dataclass(frozen=True)
class Run(Generic[R_co]):
    run_id: str
    queue: str
    partition: int
    state: str
    task: str
    payload: str
    attempt: int
    max_attempts: int
    fence: int
    owner: str | None
    lease_until_ms: int | None
    due_ms: int | None
    created_ms: int | None
    started_ms: int | None
    finished_ms: int | None
    job_id: str
    scheduled_for_ms: int | None
    result_json: str | None
    error: str | None
    history: list[str] = field(default_factory=list)
    # Garbage found in the record (a field that is not what jobqueue writes, a key of another
    # type): the run is still shown, with these beside it.
    anomalies: tuple[Anomaly, ...] = ()

    @property
    def finished(self) -> bool:
        return self.state in FINISHED_STATES

    @property
    def result(self) -> R_co:
        """The task's return value once done (None before: check ``state``)."""
        return cast("R_co", decode_result(self.result_json))

    @property
    def args(self) -> list[Any]:
        return decode_payload(self.payload)[0]

    @property
    def kwargs(self) -> dict[str, Any]:
        return decode_payload(self.payload)[1]

    @classmethod
    def from_hash(
        cls,
        run_id: str,
        partition: int,
        fields: dict[str, str],
        history: list[str],
        queue: str = "",
        anomalies: tuple[Anomaly, ...] = (),
        *,
        key: str = "",
    ) -> Run:
        """A run from its record. Fields at their defaults are not stored (see create_run.lua),
        and the queue comes from the key the record was read from (``key``, which names the
        anomalies found). A field that is not what jobqueue writes is shown as its default and
        added to ``anomalies``."""
        found = list(anomalies)
        state = fields.get("state", "unknown")
        if state not in STATES and not found:  # a stand-in record already says why
            found.append(Anomaly(key, f"state {fields.get('state')!r} is not a run state"))
        for name in INT_FIELDS:
            value = fields.get(name)
            number = _int(value)
            if value not in (None, "") and number is None:
                found.append(Anomaly(key, f"field {name!r} is {value!r}, not an integer"))
            elif number is not None and name in TIME_FIELDS and not is_time(number):
                found.append(Anomaly(key, f"field {name!r} is {value!r}, not a time in ms"))
        return cls(
            run_id=run_id,
            queue=fields.get("queue") or queue,
            partition=partition,
            state=state,
            task=fields.get("task", ""),
            payload=fields.get("payload", ""),
            attempt=_int(fields.get("attempt")) or 0,
            max_attempts=_int(fields.get("max_attempts")) or 0,
            fence=_int(fields.get("fence")) or 0,
            owner=fields.get("owner") or None,
            lease_until_ms=_int(fields.get("lease_until")),
            due_ms=_int(fields.get("due")),
            created_ms=_int(fields.get("created")),
            started_ms=_int(fields.get("started")),
            finished_ms=_int(fields.get("finished")),
            job_id=fields.get("job", ""),
            scheduled_for_ms=_int(fields.get("scheduled_for")),
            result_json=fields.get("result"),
            error=fields.get("error"),
            history=history,
            anomalies=tuple(found),
        )

    def timeline(self) -> list[tuple[int | None, str]]:
        """The run's story, oldest first: (ms, event). The stored history keeps only what the
        record cannot show (how earlier attempts ended); creation, the latest claim and a
        success come from the record's fields."""
        events: list[tuple[int | None, str]] = []
        if self.created_ms is not None:
            # not the due time: retries and releases move it
            events.append((self.created_ms, "created"))
        for line in self.history:
            stamp, _, text = line.partition(" ")
            # isdigit() alone takes "²", which int() refuses: such a line is shown whole.
            numeric = stamp.isascii() and stamp.isdigit()
            events.append((_int(stamp), text) if numeric else (None, line))
        if self.attempt >= 1 and self.owner and self.started_ms is not None:
            # cancel issues a new fence; its history line keeps the one this claim was given
            fence = self._cancelled_claim_fence() if self.state == "cancelled" else self.fence
            events.append(
                (
                    self.started_ms,
                    f"claimed fence={fence} attempt={self.attempt} owner={self.owner}",
                )
            )
        if self.state == "done" and self.finished_ms is not None:
            events.append((self.finished_ms, f"done fence={self.fence}"))
        events.sort(key=lambda e: -1 if e[0] is None else e[0])
        return events

    def _cancelled_claim_fence(self) -> int:
        for line in reversed(self.history):
            found = _CANCELLED_FENCE.search(line)
            if found:
                return int(found.group(1))
        return self.fence

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view (for --json output)."""
        out = {
            k: v
            for k, v in self.__dict__.items()
            if k not in ("payload", "result_json", "anomalies")
        }
        try:
            out["args"], out["kwargs"] = decode_payload(self.payload)
        except ValueError:
            out["payload"] = self.payload
        out["result"] = self.result
        out["timeline"] = [{"at_ms": ms, "event": text} for ms, text in self.timeline()]
        out["anomalies"] = [a.to_dict() for a in self.anomalies]
        return out
