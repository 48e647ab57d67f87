"""Exact run listings, page by page: the one way the CLI, the dashboard and the API list runs.

A listing reads the run indexes (``due``, ``leases``, ``waiting``, ``dead``, ``done``: each a
sorted set per partition, written by the scripts that move the runs) in order, and pages by a
keyset cursor: the (score, run id, queue) of the last entry it looked at. Each partition's
next entries after that place come from ``index_page.lua`` (O(log n), whatever runs came or
went meanwhile), merged across partitions and queues. So:

- a page never stops short silently: it ends at ``limit`` rows, at the end of the indexes
  (``next_cursor`` None), or at ``scan_limit`` entries looked at, with a cursor to go on;
- following the cursors to the end lists every run that stayed in its index with its score
  once and only once (a run that moves meanwhile may show twice or not at all: it changed);
- a page costs a few round trips whatever the listing's size: each partition gives at most
  ``FETCH_MAX`` entries a round, and at most ``scan_limit`` entries are looked at.

Filters on the run id (``job``, ``prefix``) cost no record read; filters on the record
(``task``, ``error``, done against cancelled) read the record of each entry looked at. The
time range (``since_ms``, ``until_ms``) bounds the index's score: the time each listing is
sorted by (see ``SORTED_BY``).
"""

from __future__ import annotations

import base64
import binascii
import heapq
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass

from jobqueue.anomalies import Anomaly, Listing, checked, is_wrong_type, unique
from jobqueue.client.base import NOT_A_RECORD, not_a_record
from jobqueue.client.core import ClientCore
from jobqueue.client.sync import JobQueue
from jobqueue.errors import ConfigError
from jobqueue.models import STATES, Run
from jobqueue.ops.partitions import partitions_steps
from jobqueue.store.io import Scripts, Steps, cmd, commands
from jobqueue.store.keys import PartitionKeys
from jobqueue.store.pages import INDEX_PAGE, IndexPage
from jobqueue.store.runs import READ_RECORDS

# The indexes a listing without a state filter goes through, in this order.
INDEXES = ("leases", "due", "waiting", "dead", "done")
INDEX_OF_STATE = {
    "running": "leases",
    "pending": "due",
    "waiting": "waiting",
    "dead": "dead",
    "done": "done",
    "cancelled": "done",
}
# The states a run listed in an index may have; another one means it moved since.
STATES_OF_INDEX = {
    "leases": {"running"},
    "due": {"pending"},
    "waiting": {"waiting"},
    "dead": {"dead"},
    "done": {"done", "cancelled"},
}
# Each index's order unless the caller asks otherwise: what comes next first, what finished
# last first.
DEFAULT_ORDER = {"leases": "asc", "due": "asc", "waiting": "asc", "dead": "desc", "done": "desc"}
# What an index's score is: the time a listing of it is sorted by and its range bounds.
SORTED_BY = {
    "leases": "lease expiry",
    "due": "due time",
    "waiting": "creation time",
    "dead": "time of death",
    "done": "finish time",
}
# Entries looked at per page at most (a page of selective filters may end short of its
# limit there, with a cursor to go on); entries one partition gives per round trip at most.
SCAN_LIMIT = 10_000
FETCH_MAX = 1_000
# Records read per round trip of the rare records of another type; runs a read_records call.
RECORD_CHUNK = 500
RECORDS_PER_CALL = 100
MAX_LIMIT = 10_000
CURSOR_PREFIX = "c1."
MAX_CURSOR_CHARS = 4_096


@dataclass(frozen=True)
class RunQuery:
    """What to list. Every filter given must hold (and). ``job`` matches runs of a recurring
    job (run ids ``job@...``) or the run of that very id; ``prefix`` the start of run ids;
    ``error`` a text inside the run's error, case folded; ``since_ms``/``until_ms`` bound
    the time the listing is sorted by, inclusive. ``order`` is 'asc' (oldest first) or
    'desc'; None: each index's own (running, pending and waiting runs oldest first; dead and
    finished runs newest first)."""

    state: str | None = None
    queue: str | None = None
    task: str | None = None
    job: str | None = None
    prefix: str | None = None
    contains: str | None = None
    error: str | None = None
    since_ms: int | None = None
    until_ms: int | None = None
    order: str | None = None

    def checked(self) -> RunQuery:
        """Itself, or ConfigError naming what is wrong."""
        if self.state is not None and self.state not in STATES:
            raise ConfigError(f"unknown state {self.state!r} (one of {', '.join(STATES)})")
        if self.order not in (None, "asc", "desc"):
            raise ConfigError(f"order is 'asc' or 'desc', not {self.order!r}")
        if self.order == "desc" and self.state == "running":
            # A heartbeat moves a lease's expiry later: newest first, a run would skip pages.
            raise ConfigError("running runs are listed by lease expiry, oldest first only")
        for name in ("since_ms", "until_ms"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ConfigError(f"{name} must be a time in ms, not {value!r}")
        if (
            self.since_ms is not None
            and self.until_ms is not None
            and self.since_ms > self.until_ms
        ):
            raise ConfigError("since is after until: the range holds nothing")
        return self

    @property
    def indexes(self) -> tuple[str, ...]:
        return (INDEX_OF_STATE[self.state],) if self.state else INDEXES

    def order_of(self, index: str) -> str:
        if self.order is None or index == "leases":
            return DEFAULT_ORDER[index]
        return self.order

    @property
    def reads_records(self) -> bool:
        """Whether a row depends on its record beyond the index it is in."""
        return bool(self.task or self.error or self.state in ("done", "cancelled"))

    def matches_id(self, run_id: str) -> bool:
        if self.prefix and not run_id.startswith(self.prefix):
            return False
        if self.contains and self.contains not in run_id:
            return False
        return not self.job or run_id == self.job or run_id.rpartition("@")[0] == self.job

    def matches(self, index: str, run: Run) -> bool:
        if self.state is not None and run.state != self.state:
            return False
        if run.state in STATES and run.state not in STATES_OF_INDEX[index]:
            return False  # it moved after the index was read: it shows where it is now
        if self.task and run.task != self.task:
            return False
        return not self.error or self.error.casefold() in (run.error or "").casefold()


@dataclass(frozen=True)
class Place:
    """Where a listing is: an index, and the (score, run id, queue) of the last entry looked
    at in it; a score of '' is the index's start."""

    index: str
    score: str = ""
    run_id: str = ""
    queue: str = ""

    @property
    def after(self) -> tuple[str, str] | None:
        return (self.score, self.run_id) if self.score else None

    def encode(self) -> str:
        raw = json.dumps([self.index, self.score, self.run_id, self.queue], separators=(",", ":"))
        return CURSOR_PREFIX + base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")

    @classmethod
    def decode(cls, cursor: str) -> Place:
        """The place a cursor names; ConfigError for anything a page did not print."""
        shown = cursor[:60] if isinstance(cursor, str) else type(cursor).__name__
        bad = ConfigError(f"not a listing cursor: {shown!r} (give one a page printed)")
        if not isinstance(cursor, str) or not cursor.startswith(CURSOR_PREFIX):
            raise bad
        if len(cursor) > MAX_CURSOR_CHARS:
            raise bad
        body = cursor[len(CURSOR_PREFIX) :]
        try:
            fields = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
        except (ValueError, binascii.Error, UnicodeDecodeError):
            raise bad from None
        if (
            not isinstance(fields, list)
            or len(fields) != 4
            or not all(isinstance(f, str) for f in fields)
            or fields[0] not in INDEXES
        ):
            raise bad
        if fields[1]:
            try:
                if math.isnan(float(fields[1])):  # +-inf: scores another program wrote
                    raise bad
            except ValueError:
                raise bad from None
        return cls(*fields)


class RunPage(Listing[Run]):
    """A page of runs (a list), with what the page says of the rest:

    - ``next_cursor``: give it back for the next page; None when the listing is at its end;
    - ``total``: how many entries the indexes read hold within the time range (all pages);
    - ``total_exact``: True when every one of them matches (no filter beyond state and time
      range, or those the indexes answer): ``total`` is then the listing's count, else the
      most it can be;
    - ``scanned``: index entries this page looked at."""

    def __init__(
        self,
        rows: list[Run],
        anomalies: list[Anomaly],
        *,
        next_cursor: str | None,
        total: int,
        total_exact: bool,
        scanned: int,
    ) -> None:
        super().__init__(rows, anomalies)
        self.next_cursor = next_cursor
        self.total = total
        self.total_exact = total_exact
        self.scanned = scanned

    def summary(self) -> str:
        """One line: what the page shows against the whole, and whether more follow."""
        count = f"{self.total:,}" if self.total_exact else f"at most {self.total:,}"
        line = f"{len(self):,} shown of {count} (looked at {self.scanned:,} index entries)"
        return line + ("; more on the next page" if self.next_cursor else "; the end")


def _bounds(query: RunQuery) -> tuple[str, str]:
    low = "-inf" if query.since_ms is None else str(query.since_ms)
    high = "+inf" if query.until_ms is None else str(query.until_ms)
    return low, high


def _key(score: str, run_id: str, queue: str) -> tuple[float, bytes, str]:
    # Redis's own order of a sorted set: score, then member bytewise; then the queue.
    return float(score), run_id.encode(), queue


def runs_page(
    jq: JobQueue,
    query: RunQuery | None = None,
    *,
    cursor: str | None = None,
    limit: int = 50,
    scan_limit: int = SCAN_LIMIT,
) -> RunPage:
    """One page of the runs ``query`` selects, from ``cursor`` (None: the first page)."""
    return jq.run_steps(
        runs_page_steps(jq, query, cursor=cursor, limit=limit, scan_limit=scan_limit)
    )


def runs_page_steps(
    jq: ClientCore,
    query: RunQuery | None = None,
    *,
    cursor: str | None = None,
    limit: int = 50,
    scan_limit: int = SCAN_LIMIT,
) -> Steps[RunPage]:
    """:func:`runs_page` as steps, for either client (``await ajq.run_steps(...)``)."""
    query = (query or RunQuery()).checked()
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise ConfigError(f"limit must be 1 to {MAX_LIMIT:,}, not {limit!r}")
    if isinstance(scan_limit, bool) or not isinstance(scan_limit, int) or scan_limit < 1:
        raise ConfigError(f"scan_limit must be a positive number, not {scan_limit!r}")
    place = Place.decode(cursor) if cursor is not None else Place(query.indexes[0])
    if place.index not in query.indexes:
        raise ConfigError(f"that cursor is of another listing (its index is {place.index})")
    parts, found = yield from partitions_steps(jq, query.queue)
    return (yield from _page_steps(parts, list(found), query, place, limit, scan_limit))


def iter_runs(
    jq: JobQueue, query: RunQuery | None = None, *, page_size: int = 500
) -> Iterator[Run]:
    """Every run ``query`` selects, page after page to the end (for actions on a filter)."""
    cursor: str | None = None
    while True:
        page = runs_page(jq, query, cursor=cursor, limit=page_size)
        yield from page
        if page.next_cursor is None:
            return
        cursor = page.next_cursor


def _page_steps(
    parts: list[PartitionKeys],
    found: list[Anomaly],
    query: RunQuery,
    place: Place | None,
    limit: int,
    scan_limit: int,
) -> Steps[RunPage]:
    low, high = _bounds(query)
    indexes = query.indexes
    rows: list[Run] = []
    scanned = 0
    counted: dict[str, int] = {}
    foreign: set[str] = set()
    growth = 1  # x4 after each round that left the page short (its filters drop entries)
    while place is not None and len(rows) < limit and scanned < scan_limit:
        index, order = place.index, query.order_of(place.index)
        desc = order == "desc"
        want = limit - len(rows)
        # One more than the page needs: a partition that holds no more says so by giving
        # fewer, and the page knows it is the last.
        fetch = max(1, min(FETCH_MAX, scan_limit - scanned, (want + 1) * growth))
        growth *= 4
        live = [k for k in parts if getattr(k, index) not in foreign]
        calls = [
            INDEX_PAGE.call(
                getattr(k, index), order, low, high, after=place.after,
                # The same run id and score in another queue: listed if that queue comes later.
                inclusive=bool(place.queue) and (k.queue > place.queue if not desc
                                                 else k.queue < place.queue),
                count=fetch,
            )
            for k in live
        ]
        replies = (yield Scripts(calls)) if calls else []
        pages: list[tuple[PartitionKeys, IndexPage]] = []
        for k, reply in zip(live, replies, strict=True):
            page = INDEX_PAGE.parse(reply)
            if page is None:
                foreign.add(getattr(k, index))
                found.append(Anomaly(getattr(k, index), "holds another type, not a sorted set"))
            else:
                pages.append((k, page))
        if index not in counted:  # the range's count (wherever the place): for the total
            counted[index] = sum(page.in_range for _, page in pages)
        # Entries up to the horizon can be taken in order: past the last entry of a partition
        # that gave a full page, that partition may hold entries not read yet.
        ends = [_key(p.entries[-1][1], p.entries[-1][0], k.queue)
                for k, p in pages if len(p.entries) >= fetch]
        horizon = (max(ends) if desc else min(ends)) if ends else None
        merged = heapq.merge(
            *([(_key(s, m, k.queue), m, s, k) for m, s in p.entries] for k, p in pages),
            key=lambda e: e[0],
            reverse=desc,
        )
        taken: list[tuple[str, str, PartitionKeys]] = []
        for key, member, score, k in merged:
            if horizon is not None and (key < horizon if desc else key > horizon):
                break
            if len(taken) >= scan_limit - scanned:
                horizon = key  # the budget ends the page inside the index
                break
            taken.append((member, score, k))
        runs = yield from _records_steps(
            [(m, k) for m, _, k in taken if query.matches_id(m)], index, found
        )
        read_all = True
        for i, (member, score, k) in enumerate(taken):
            scanned += 1
            place = Place(index, score, member, k.queue)
            run = runs.get((k.queue, member))
            if run is not None and query.matches(index, run):
                rows.append(run)
                if len(rows) >= limit:
                    read_all = i == len(taken) - 1
                    break
        if horizon is None and read_all:
            # Every partition gave all it had past the place: this index is read.
            at = indexes.index(index) + 1
            place = Place(indexes[at]) if at < len(indexes) else None
    total = yield from _total_steps(parts, indexes, counted, foreign, low, high, found)
    return RunPage(
        rows,
        unique(found),
        next_cursor=place.encode() if place is not None else None,
        total=total,
        total_exact=not (query.reads_records or query.job or query.prefix or query.contains),
        scanned=scanned,
    )


def _records_steps(
    wanted: list[tuple[str, PartitionKeys]], index: str, found: list[Anomaly]
) -> Steps[dict[tuple[str, str], Run]]:
    """The runs of these index entries, by (queue, run id), records and histories together
    in one round trip (read_records.lua, RECORDS_PER_CALL runs a call: a reply to parse per
    call, not two a run). An entry without a record is left out (``jobqueue repair`` tells
    of those); one whose keys hold another type is read again alone, and shown as a run
    that says so, so that an operator can purge it."""
    by_partition: dict[PartitionKeys, list[str]] = {}
    for rid, k in wanted:
        by_partition.setdefault(k, []).append(rid)
    chunks = [(k, ids[i : i + RECORDS_PER_CALL]) for k, ids in by_partition.items()
              for i in range(0, len(ids), RECORDS_PER_CALL)]
    replies = (yield Scripts([READ_RECORDS.call(k, ids) for k, ids in chunks])) if chunks else []
    runs: dict[tuple[str, str], Run] = {}
    odd: list[tuple[str, PartitionKeys]] = []
    for (k, ids), reply in zip(chunks, replies, strict=True):
        for rid, record in zip(ids, READ_RECORDS.parse(reply), strict=True):
            if record.fields is None or record.history is None:
                odd.append((rid, k))
            elif record.fields:
                runs[(k.queue, rid)] = Run.from_hash(
                    rid, k.partition, record.fields, record.history, k.queue, key=k.run(rid)
                )
    if odd:
        runs.update((yield from _foreign_records_steps(odd, index, found)))
    return runs


def _foreign_records_steps(
    wanted: list[tuple[str, PartitionKeys]], index: str, found: list[Anomaly]
) -> Steps[dict[tuple[str, str], Run]]:
    """Runs whose record or history holds another type, read command by command: what can
    be read is shown, with the anomaly."""
    records: list[tuple[str, PartitionKeys, dict[str, str], list[Anomaly]]] = []
    for start in range(0, len(wanted), RECORD_CHUNK):
        chunk = wanted[start : start + RECORD_CHUNK]
        replies = yield commands(*(cmd("hgetall", k.run(rid)) for rid, k in chunk))
        for (rid, k), reply in zip(chunk, replies, strict=True):
            mine = [Anomaly(k.run(rid), NOT_A_RECORD)] if is_wrong_type(reply) else []
            fields = not_a_record(reply, "dead" if index == "dead" else "unknown")
            if fields:
                records.append((rid, k, fields, mine))
    with_history = [(rid, k, mine) for rid, k, fields, mine in records if fields.get("hist")]
    lines = (
        (yield commands(*(cmd("lrange", k.history(rid), 0, -1) for rid, k, _ in with_history)))
        if with_history else []
    )
    histories = {
        (k.queue, rid): checked(reply, k.history(rid), "list", mine, [])
        for (rid, k, mine), reply in zip(with_history, lines, strict=True)
    }
    return {
        (k.queue, rid): Run.from_hash(
            rid, k.partition, fields, histories.get((k.queue, rid), []), k.queue, tuple(mine),
            key=k.run(rid),
        )
        for rid, k, fields, mine in records
    }


def _total_steps(
    parts: list[PartitionKeys],
    indexes: tuple[str, ...],
    counted: dict[str, int],
    foreign: set[str],
    low: str,
    high: str,
    found: list[Anomaly],
) -> Steps[int]:
    """The entries of every index listed within the range: those this page started counted,
    the others counted now (ZCOUNT: O(log n) each)."""
    todo = [(k, index) for index in indexes if index not in counted for k in parts
            if getattr(k, index) not in foreign]
    replies = (
        (yield commands(*(cmd("zcount", getattr(k, i), low, high) for k, i in todo)))
        if todo else []
    )
    total = sum(counted.values())
    for (k, index), reply in zip(todo, replies, strict=True):
        total += int(checked(reply, getattr(k, index), "sorted set", found, 0))
    return total
