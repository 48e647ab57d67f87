"""The event log of a queue partition: what happened to its runs, one stream entry per
transition, written by the Lua script that made the transition in the same call (see
``event_log`` in lua/lib/events.lua), so an entry exists if and only if its transition happened.

An entry has three fields: ``e`` the event, ``r`` the run id and ``i`` what the event adds,
its parts joined by '|' (the last part may itself hold '|'):

    created    <due ms>|<task>        a run created pending (enqueue, schedule, workflow)
    waiting    <task>                 a workflow run created waiting on others
    ready      (nothing)              a waiting run released (its dependencies finished)
    replaced   <due ms>               a debounced run's due time moved by a new enqueue
    claimed    <attempt>|<worker>     an attempt started
    progress   <percent>|<message>    the task reported progress
    retry      <attempt>|<due ms>     an attempt failed, the run is due again then
    completed  <attempt>              the run is done
    dead       <attempt>|<error>      the run died (out of attempts, lease lost past them, a
                                      workflow dependency's failure)
    cancelled  <reason>               the run was cancelled (or skipped by its workflow)
    expired    <attempt>|<worker>     a lease ran out and was taken back (claim.lua)
    refused    <reason>               a commit (complete, fail, release, hand-back) refused:
                                      fenced, finished, cancelled, not-running
    released   <attempt>|<worker>     a worker gave the run back (shutdown)
    bounced    <hand-backs>|<worker>  handed back by a worker without its task
    requeued   <state it had>         a dead, done or cancelled run made pending again
    purged     (nothing)              a dead run deleted for good

The log is trimmed at every write to about ``maxlen`` entries and to the last ``age`` of
them (``jq:{q#p}:events:conf``: off, maxlen, age_ms; absent, the defaults below). This
module reads entries and cursors; it does no I/O."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

# The defaults of lua/lib/events.lua (EVENTS_MAXLEN, EVENTS_AGE_MS).
DEFAULT_MAXLEN = 10_000
DEFAULT_MAX_AGE_MS = 86_400_000
# Bounds for a queue's own settings: below 100 entries a stream trims a whole node (100
# entries) at a time and keeps next to nothing; past 10 million one partition's log alone
# would take gigabytes.
MIN_MAXLEN, MAX_MAXLEN = 100, 10_000_000
MIN_MAX_AGE_MS, MAX_MAX_AGE_MS = 1_000, 30 * 86_400_000

# The events after which a run will not run again unless requeued: a waiter returns on them.
FINISHED = frozenset({"completed", "dead", "cancelled"})
KINDS = (
    "created", "waiting", "ready", "replaced", "claimed", "progress", "retry", "completed",
    "dead", "cancelled", "expired", "refused", "released", "bounced", "requeued", "purged",
)  # fmt: skip

_ENTRY_ID = re.compile(r"(\d{1,20})-(\d{1,20})")


def entry_ms(entry_id: str) -> int | None:
    """The server time (ms) a stream entry id carries, or None for something else."""
    m = _ENTRY_ID.fullmatch(entry_id)
    return int(m.group(1)) if m else None


def entry_key(entry_id: str) -> tuple[int, int]:
    """An entry id as a sortable pair; (0, 0) for anything that is not one."""
    m = _ENTRY_ID.fullmatch(entry_id)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def is_entry_id(text: str) -> bool:
    return _ENTRY_ID.fullmatch(text) is not None


@dataclass(frozen=True)
class Event:
    """One entry of a queue's event log. ``id`` is its stream entry id in its partition's
    log (``<ms>-<n>``); ``at_ms`` the server time it was written; ``cursor`` (set by the
    readers of a whole queue) where to resume to get every later event of every partition.
    The other fields are those the event carries (see the module's table), None otherwise."""

    id: str
    queue: str
    partition: int
    kind: str
    run_id: str
    at_ms: int
    attempt: int | None = None
    worker: str | None = None
    task: str | None = None
    due_ms: int | None = None
    progress: float | None = None
    text: str | None = None  # dead: the error's head; progress: the message; refused,
    # cancelled: the reason
    state: str | None = None  # requeued: the state the run had
    hand_backs: int | None = None
    cursor: str = ""

    @property
    def finished(self) -> bool:
        """True for the events after which the run will not run again unless requeued."""
        return self.kind in FINISHED

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None and v != ""}


def _int(text: str) -> int | None:
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 19 else None


def _percent(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) and 0 <= value <= 100 else None


def parse_entry(queue: str, partition: int, entry_id: str, fields: Any) -> Event | None:
    """An entry as the scripts write it, or None for anything else (foreign data: an entry
    without an event or a run id). An event of a kind this version does not know (written by
    a newer one) is kept, with its info unread."""
    if not isinstance(fields, Mapping):
        return None
    kind, run_id, info = fields.get("e"), fields.get("r"), fields.get("i", "")
    at = entry_ms(entry_id) if isinstance(entry_id, str) else None
    if not isinstance(kind, str) or not kind or not isinstance(run_id, str) or not run_id:
        return None
    if at is None or not isinstance(info, str):
        return None
    head, _, rest = info.partition("|")
    extra: dict[str, Any] = {}
    if kind == "created":
        extra = {"due_ms": _int(head), "task": rest or None}
    elif kind == "waiting":
        extra = {"task": info or None}
    elif kind == "replaced":
        extra = {"due_ms": _int(head)}
    elif kind in ("claimed", "expired", "released"):
        extra = {"attempt": _int(head), "worker": rest or None}
    elif kind == "retry":
        extra = {"attempt": _int(head), "due_ms": _int(rest)}
    elif kind == "dead":
        extra = {"attempt": _int(head), "text": rest}
    elif kind == "completed":
        extra = {"attempt": _int(head)}
    elif kind == "bounced":
        extra = {"hand_backs": _int(head), "worker": rest or None}
    elif kind == "progress":
        extra = {"progress": _percent(head), "text": rest or None}
    elif kind in ("refused", "cancelled"):
        extra = {"text": info}
    elif kind == "requeued":
        extra = {"state": info or None}
    return Event(entry_id, queue, partition, kind, run_id, at, **extra)


# -- entries removed before they were read -------------------------------------------------------


@dataclass
class Losses:
    """Tells when entries of a log were removed (trimmed, deleted) before its reader read
    them. Each read is preceded, in the same round trip, by XINFO STREAM: the log's count of
    entries ever added and its last id then. The entries added since the reader last caught
    up, less those it read since, are the ones it should find up to that id; finding fewer,
    some were removed. Unknown (the reader never caught up, or the server says neither) is
    never a loss."""

    base: int | None = None  # entries ever added, when the reader was last caught up
    read: int = 0  # entries read since
    ahead: str | None = None  # a position found past the log's last id (told once)

    def check(self, info: Any, returned: Sequence[str], pos_before: str, count: int) -> bool:
        """After a read of at most ``count`` entries from ``pos_before`` that gave
        ``returned`` (ids, in order), ``info`` taken just before it: True when some were
        lost (a full read that did not reach the log's last id says nothing: more may
        follow), or when the log is not the one read before (made again, or gone back).
        A log deleted and made again during the blocking read itself is not seen here:
        the waits' sweep covers that."""
        added = info.get("entries-added") if isinstance(info, Mapping) else None
        last = info.get("last-generated-id") if isinstance(info, Mapping) else None
        if not isinstance(added, int) or not isinstance(last, str):
            self.base = None
            return False
        upto = sum(1 for i in returned if entry_key(i) <= entry_key(last))
        # A read that came to the log's last id (then) is complete, even at ``count``.
        complete = len(returned) < count or (
            bool(returned) and entry_key(returned[-1]) >= entry_key(last)
        )
        gone_back = entry_key(last) < entry_key(pos_before)  # a failover, a restore
        told = gone_back and self.ahead == pos_before
        self.ahead = pos_before if gone_back else None
        lost = (gone_back and not told) or (
            self.base is not None and (
                added < self.base  # a new log (deleted, made again)
                or (complete and upto < added - self.base - self.read)
            )
        )
        self.read += len(returned)
        pos = returned[-1] if returned else pos_before
        if entry_key(pos) >= entry_key(last) or lost:
            self.base, self.read = added, len(returned) - upto
        return lost

    def caught_up(self, info: Any) -> None:
        """The reader is at the log's last id (a listener armed there)."""
        added = info.get("entries-added") if isinstance(info, Mapping) else None
        self.base, self.read = (added, 0) if isinstance(added, int) else (None, 0)


# -- cursors: a position in every partition of one or more queues ---------------------------


def stream_name(queue: str, partition: int) -> str:
    """How a cursor names a partition's log: ``<queue>#<partition>``."""
    return f"{queue}#{partition}"


def format_cursor(positions: Mapping[str, str]) -> str:
    """``<queue>#<partition>=<entry id>`` per partition, ';'-separated, in a stable order."""
    return ";".join(f"{name}={pos}" for name, pos in sorted(positions.items()))


class CursorError(ValueError):
    """A cursor or position that is neither a cursor nor an entry id nor a time."""


def parse_cursor(text: str) -> dict[str, str]:
    """The positions a cursor holds (see ``format_cursor``); CursorError for anything else."""
    positions: dict[str, str] = {}
    for part in text.split(";"):
        name, eq, pos = part.partition("=")
        queue, hash_, partition = name.rpartition("#")
        if not (eq and hash_ and queue and partition.isdigit() and is_entry_id(pos)):
            raise CursorError(
                f"{text!r} is not a cursor (<queue>#<partition>=<entry id>;...), an entry id "
                "(<ms>-<n>) or a time"
            )
        positions[name] = pos
    return positions


def position_after(ms: int) -> str:
    """The position from which a read returns the events written at ``ms`` or later."""
    return f"{max(ms - 1, 0)}-{2**64 - 1}" if ms > 0 else "0-0"


def merge_order(events: Iterable[Event]) -> list[Event]:
    """Events of several partitions in the order they were written (by server time; within a
    millisecond, by partition then entry)."""
    return sorted(events, key=lambda ev: (ev.at_ms, ev.queue, ev.partition, entry_key(ev.id)))
