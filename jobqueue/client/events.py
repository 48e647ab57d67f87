"""Reading and following the queues' event logs (see ``jobqueue.store.events``), and their
settings: ``jq.events(queue)``, ``ajq.events(queue)``, ``jq.recent_events(...)``,
``jq.set_queue_events(...)``.

A queue's log is one stream per partition. A reader keeps a position in each; an event's
``cursor`` holds them all, so ``events(queue, since=ev.cursor)`` resumes right after ``ev``
in every partition, whatever the order in which the partitions were read. Following reads
every stream of the queue at once: on a single server one blocking XREAD over all of them;
on a cluster, where one command reaches one slot, a pipelined non-blocking read of each
(one round trip per master), then a short blocking read of one partition at a time in turn.

The steps (what is sent, what a reply means) are written once here; ``EventStream`` drives
them on the sync client, ``AsyncEventStream`` on the asyncio one."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import redis

from jobqueue.anomalies import Anomaly, Listing, is_wrong_type
from jobqueue.errors import ConfigError, JobQueueError
from jobqueue.store.events import (
    DEFAULT_MAX_AGE_MS,
    DEFAULT_MAXLEN,
    KINDS,
    MAX_MAX_AGE_MS,
    MAX_MAXLEN,
    MIN_MAX_AGE_MS,
    MIN_MAXLEN,
    CursorError,
    Event,
    Losses,
    entry_key,
    format_cursor,
    is_entry_id,
    merge_order,
    parse_cursor,
    parse_entry,
    position_after,
    stream_name,
)
from jobqueue.store.io import Steps, cmd, commands, raised
from jobqueue.store.keys import PartitionKeys, queue_partitions, validate_queue_name

log = logging.getLogger("jobqueue.client")

READ_COUNT = 500  # entries per stream and read
BLOCK_MS = 1_000  # a follower's blocking read (single server)
CLUSTER_BLOCK_MS = 200  # a follower's blocking read of one partition in turn (cluster)
RETRY_FIRST_S, RETRY_MAX_S = 0.1, 2.0
Since = str | int | datetime | timedelta | None


@dataclass(frozen=True)
class EventSettings:
    """A queue's event log settings, as its partitions hold them: ``enabled`` (False when
    any partition's log is off), ``maxlen`` and ``max_age_s`` (the defaults when not set),
    and ``lengths``: the entries each partition's log holds now."""

    queue: str
    enabled: bool
    maxlen: int
    max_age_s: float
    lengths: list[int] = field(default_factory=list)
    mixed: bool = False  # the partitions disagree (a set_queue_events that failed half way)

    def to_dict(self) -> dict[str, Any]:
        return {
            "queue": self.queue, "enabled": self.enabled, "maxlen": self.maxlen,
            "max_age_s": self.max_age_s, "entries": sum(self.lengths), "mixed": self.mixed,
        }


def check_event_settings(maxlen: int | None, max_age_s: float | None) -> tuple[int | None,
                                                                                 int | None]:
    """(maxlen, max_age_ms) as given, checked; None keeps the default."""
    age_ms = None
    if maxlen is not None and (isinstance(maxlen, bool) or not isinstance(maxlen, int)
                               or not MIN_MAXLEN <= maxlen <= MAX_MAXLEN):
        raise ConfigError(f"maxlen must be a whole number from {MIN_MAXLEN} to {MAX_MAXLEN}")
    if max_age_s is not None:
        if isinstance(max_age_s, bool) or not isinstance(max_age_s, (int, float)):
            raise ConfigError("max_age must be a number of seconds")
        age_ms = round(max_age_s * 1000) if max_age_s == max_age_s else -1
        if not MIN_MAX_AGE_MS <= age_ms <= MAX_MAX_AGE_MS:
            raise ConfigError(
                f"max_age must be from {MIN_MAX_AGE_MS // 1000} s to "
                f"{MAX_MAX_AGE_MS // 86_400_000} days"
            )
    return maxlen, age_ms


def set_events_steps(
    partitions: Sequence[PartitionKeys], enabled: bool, maxlen: int | None, age_ms: int | None
) -> Steps[None]:
    """Write a queue's settings to each partition's ``events:conf`` (a field not given is
    removed: its default applies)."""
    cmds = []
    for keys in partitions:
        conf = keys.events_conf
        cmds.append(cmd("hdel", conf, "off") if enabled else cmd("hset", conf, "off", "1"))
        cmds.append(cmd("hset", conf, "maxlen", maxlen) if maxlen is not None
                    else cmd("hdel", conf, "maxlen"))
        cmds.append(cmd("hset", conf, "age_ms", age_ms) if age_ms is not None
                    else cmd("hdel", conf, "age_ms"))
    replies = yield commands(*cmds)
    for keys, reply in zip((k for k in partitions for _ in range(3)), replies, strict=True):
        if is_wrong_type(reply):
            raise JobQueueError(
                f"{keys.events_conf} holds foreign data of another type: the event settings "
                "of this partition cannot be written (see jobqueue check)"
            )
    raised(replies)


def event_settings_steps(queue: str, partitions: Sequence[PartitionKeys]) -> Steps[EventSettings]:
    replies = yield commands(*(
        c for keys in partitions
        for c in (cmd("hmget", keys.events_conf, "off", "maxlen", "age_ms"),
                  cmd("xlen", keys.events))
    ))
    seen: set[tuple[bool, int, int]] = set()
    lengths = []
    for i in range(len(partitions)):
        conf, length = replies[2 * i], replies[2 * i + 1]
        off, maxlen, age = (None, None, None) if isinstance(conf, Exception) else conf
        seen.add((off == "1", _count(maxlen, DEFAULT_MAXLEN), _count(age, DEFAULT_MAX_AGE_MS)))
        lengths.append(length if isinstance(length, int) else 0)
    off = any(s[0] for s in seen)
    first = sorted(seen)[0]
    return EventSettings(queue, not off, first[1], first[2] / 1000, lengths, len(seen) > 1)


def _count(value: Any, default: int) -> int:
    return int(value) if isinstance(value, str) and value.isdigit() and value[0] != "0" else (
        default
    )


# -- reading ------------------------------------------------------------------------------------


@dataclass
class Stream:
    """One partition's log as a reader reads it."""

    keys: PartitionKeys
    pos: str  # the last entry id read ('0-0': from the start)
    losses: Losses = field(default_factory=Losses)

    @property
    def name(self) -> str:
        return stream_name(self.keys.queue, self.keys.partition)


@dataclass
class Reader:
    """What a reader of one or more queues' logs knows: its streams and positions, what it
    filters, and what it met that it could not read."""

    streams: list[Stream]
    run_id: str | None = None
    kinds: frozenset[str] | None = None
    cluster: bool = False
    skipped: int = 0  # foreign entries passed over
    anomalies: list[Anomaly] = field(default_factory=list)
    gaps: int = 0  # times entries were trimmed before this reader read them
    turn: int = 0  # the partition a cluster follower blocks on next

    @property
    def cursor(self) -> str:
        return format_cursor({s.name: s.pos for s in self.streams})

    def take(self, stream: Stream, items: Iterable[Any]) -> list[Event]:
        out = []
        for entry_id, fields in items:
            if entry_key(entry_id) <= entry_key(stream.pos):
                continue  # (a read from an exclusive position never gives it; a safeguard)
            stream.pos = entry_id
            ev = parse_entry(stream.keys.queue, stream.keys.partition, entry_id, fields)
            if ev is None:
                self.skipped += 1
                continue
            if self.run_id is not None and ev.run_id != self.run_id:
                continue
            if self.kinds is not None and ev.kind not in self.kinds:
                continue
            out.append(ev)
        return out

    def with_cursors(self, events: list[Event], start: dict[str, str]) -> list[Event]:
        """Each event with the cursor right after it (positions advance in event order)."""
        positions = dict(start)
        out = []
        for ev in events:
            positions[stream_name(ev.queue, ev.partition)] = ev.id
            out.append(_with_cursor(ev, format_cursor(positions)))
        return out


def _with_cursor(ev: Event, cursor: str) -> Event:
    from dataclasses import replace

    return replace(ev, cursor=cursor)


def partitions_steps(core: Any, queues: Sequence[str] | None) -> Steps[list[PartitionKeys]]:
    """Every partition of the queues (all known queues when None), as recorded in Redis (a
    queue not recorded yet: as this client would make it)."""
    table = yield from core._queue_table()
    names = list(queues) if queues is not None else sorted(table.counts)
    out: list[PartitionKeys] = []
    for name in names:
        validate_queue_name(name)
        if name in table.counts:
            out += table.partitions(name)
        else:  # (where its first registration will put it: the spread placement)
            out += queue_partitions(name, core.partitions_of(name), True)
    return out


def start_steps(partitions: Sequence[PartitionKeys], since: Since) -> Steps[list[Stream]]:
    """The streams, each at its starting position: after the entry ``since`` names (a
    cursor, an entry id), at a time (``datetime``, or a ``timedelta`` ago), from the start
    (``0``), or, with None, at each log's end (only what comes next)."""
    if since is None:
        replies = yield commands(*(cmd("xrevrange", k.events, "+", "-", count=1)
                                   for k in partitions))
        out = []
        for keys, reply in zip(partitions, replies, strict=True):
            last = reply[0][0] if isinstance(reply, list) and reply else "0-0"
            out.append(Stream(keys, last))
        return out
    if isinstance(since, timedelta):
        ((seconds, micros),) = raised((yield commands(cmd("time"))))
        since = int(seconds) * 1000 + int(micros) // 1000 - round(since.total_seconds() * 1000)
    if isinstance(since, datetime):
        if since.tzinfo is None:
            raise ConfigError("since: a datetime with a time zone (datetime.now(timezone.utc))")
        since = round(since.timestamp() * 1000)
    if isinstance(since, bool):
        raise ConfigError("since is a cursor, an entry id, a time or 0")
    if isinstance(since, int):
        start = "0-0" if since == 0 else position_after(since)
        return [Stream(k, start) for k in partitions]
    if isinstance(since, str):
        text = since.strip()
        if text in ("0", "start"):
            return [Stream(k, "0-0") for k in partitions]
        if is_entry_id(text):
            return [Stream(k, text) for k in partitions]
        try:
            positions = parse_cursor(text)
        except CursorError as exc:
            raise ConfigError(str(exc)) from None
        return [Stream(k, positions.get(stream_name(k.queue, k.partition), "0-0"))
                for k in partitions]
    raise ConfigError(f"since is a cursor, an entry id, a time or 0, not {since!r}")


def read_steps(reader: Reader, block_ms: int | None) -> Steps[list[Event]]:
    """One read of every stream (blocking up to ``block_ms`` when nothing is there; None:
    not at all), in the order written. Entries trimmed before this reader read them are
    counted in ``reader.gaps`` (and logged)."""
    streams = reader.streams
    if not streams:
        return []
    before = {s.name: s.pos for s in streams}
    if not reader.cluster or len(streams) == 1:
        found = yield from _read_together(reader, block_ms)
    else:
        found = yield from _read_in_turn(reader, block_ms)
    events = merge_order(found)
    return reader.with_cursors(events, before)


def _read_together(
    reader: Reader, block_ms: int | None, streams: Sequence[Stream] | None = None
) -> Steps[list[Event]]:
    """XINFO STREAM of these streams (all of the reader's by default; on a cluster, one),
    then one XREAD of them, in one round trip."""
    chosen = list(reader.streams if streams is None else streams)
    kwargs: dict[str, Any] = {"count": READ_COUNT}
    if block_ms is not None:
        kwargs["block"] = block_ms
    replies = yield commands(
        *(cmd("xinfo_stream", s.keys.events) for s in chosen),
        cmd("xread", {s.keys.events: s.pos for s in chosen}, **kwargs),
    )
    infos, reply = replies[:-1], replies[-1]
    return _taken(reader, chosen, _by_key(reply, chosen), infos)


def _read_in_turn(reader: Reader, block_ms: int | None) -> Steps[list[Event]]:
    """Every stream without blocking (pipelined: a round trip per master); when nothing came
    and a wait is asked, a short blocking read of one stream, the next one each time."""
    streams = reader.streams
    replies = yield commands(*(
        c for s in streams
        for c in (cmd("xinfo_stream", s.keys.events),
                  cmd("xread", {s.keys.events: s.pos}, count=READ_COUNT))
    ))
    got: dict[str, Any] = {}
    for i, s in enumerate(streams):
        got.update(_by_key(replies[2 * i + 1], [s]))
    events = _taken(reader, streams, got, replies[0::2])
    if events or block_ms is None:
        return events
    s = streams[reader.turn % len(streams)]
    reader.turn += 1
    return (yield from _read_together(reader, min(block_ms, CLUSTER_BLOCK_MS), [s]))


def _by_key(reply: Any, streams: Sequence[Stream]) -> dict[str, Any]:
    if is_wrong_type(reply):
        return {}
    if isinstance(reply, Exception):
        raise reply
    return {key: items for key, items in (reply or [])}


def _taken(
    reader: Reader, streams: Sequence[Stream], got: dict[str, Any], infos: Sequence[Any]
) -> list[Event]:
    events: list[Event] = []
    for s, info in zip(streams, infos, strict=True):
        start = s.pos
        items = got.get(s.keys.events, [])
        events += reader.take(s, items)
        if isinstance(info, dict):
            if s.losses.check(info, [i for i, _ in items], start, READ_COUNT):
                reader.gaps += 1
                log.warning("events of %s after %s were removed before they were read",
                            s.name, start)
        elif is_wrong_type(info) and not any(a.key == s.keys.events for a in reader.anomalies):
            reader.anomalies.append(Anomaly(s.keys.events, "not a stream: no event is read"))
    return events


def recent_steps(
    partitions: Sequence[PartitionKeys],
    limit: int,
    run_id: str | None,
    kinds: frozenset[str] | None,
) -> Steps[Listing[Event]]:
    """The newest ``limit`` events of these partitions (of one run, of some kinds: looked
    for among the newest 20 x ``limit``, at least 1,000, of each partition), oldest first,
    each with the cursor that follows on right after it."""
    per = limit if run_id is None and kinds is None else max(limit * 20, 1_000)
    replies = yield commands(*(cmd("xrevrange", k.events, "+", "-", count=per)
                               for k in partitions))
    everything = Reader([Stream(k, "0-0") for k in partitions])
    found: list[Event] = []
    anomalies: list[Anomaly] = []
    start: dict[str, str] = {}
    for s, reply in zip(everything.streams, replies, strict=True):
        if is_wrong_type(reply):
            anomalies.append(Anomaly(s.keys.events, "not a stream: no event is read"))
            continue
        if isinstance(reply, Exception):
            raise reply
        # What was not read of a log is older than every event shown (each log gave at
        # least as many as are shown): a cursor starts just before the oldest read.
        start[s.name] = entry_before(reply[-1][0]) if len(reply) == per else "0-0"
        found += everything.take(s, list(reversed(reply)))
    for s in everything.streams:
        start.setdefault(s.name, s.pos)
    ordered = everything.with_cursors(merge_order(found), start)
    wanted = [ev for ev in ordered if (run_id is None or ev.run_id == run_id)
              and (kinds is None or ev.kind in kinds)]
    return Listing(wanted[-limit:] if limit else [], anomalies)


def entry_before(entry_id: str) -> str:
    """The position from which a read gives ``entry_id`` and what follows."""
    ms, seq = entry_key(entry_id)
    if seq:
        return f"{ms}-{seq - 1}"
    return f"{ms - 1}-{2**64 - 1}" if ms else "0-0"


def check_kinds(kinds: Iterable[str] | None) -> frozenset[str] | None:
    if kinds is None:
        return None
    chosen = frozenset([kinds] if isinstance(kinds, str) else kinds)
    unknown = sorted(chosen - set(KINDS))
    if unknown:
        raise ConfigError(f"unknown event kinds {unknown}: choose among {', '.join(KINDS)}")
    return chosen


def _retriable(exc: BaseException) -> bool:
    return isinstance(exc, (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
                            redis.exceptions.ClusterDownError, redis.exceptions.TryAgainError,
                            redis.exceptions.RedisClusterException))


# -- the sync and asyncio followers -------------------------------------------------------------


class EventStream:
    """``for ev in jq.events(queue): ...``: the events of one or more queues, in the order
    written, each with the ``cursor`` to resume after it. Follows (blocks for more) unless
    made with ``follow=False``, which stops once it has read up to now. A lost connection is
    retried (with a WARNING, positions kept); ``close()`` (or leaving a ``with`` block, or
    ``break``) stops it."""

    def __init__(
        self,
        run_steps: Callable[[Steps[Any]], Any],
        start: Steps[Reader],
        follow: bool,
        block_s: float,
        again: Callable[[], Steps[Reader]] | None = None,
    ) -> None:
        self._run, self._start, self._follow = run_steps, start, follow
        # Every queue, none made yet: a reader of no log, which a follower makes again (from
        # the logs' start: a queue made since is all news) after each wait.
        self._again = again
        self._block_ms = max(1, round(block_s * 1000))
        self.block_s = self._block_ms / 1000
        self.reader: Reader | None = None
        self._buffer: list[Event] = []
        self._closed = False

    @property
    def cursor(self) -> str:
        """Where this stream is: ``events(..., since=stream.cursor)`` goes on from here."""
        return self.reader.cursor if self.reader is not None else ""

    def __iter__(self) -> Iterator[Event]:
        return self

    def __enter__(self) -> EventStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._closed = True

    def start(self) -> str:
        """Take the starting positions now (the first read does otherwise); the cursor."""
        if self.reader is None:
            self.reader = self._run(self._start)
        return self.reader.cursor

    def read_batch(self) -> list[Event]:
        """One read: the events there are, waiting at most ``block`` seconds for some
        (following) or not at all; empty when none came. Errors are raised, not retried."""
        self.start()
        assert self.reader is not None
        if self._waits_for_a_queue():
            return []
        got: list[Event] = self._run(
            read_steps(self.reader, self._block_ms if self._follow else None)
        )
        return got

    def _waits_for_a_queue(self) -> bool:
        """A follower of every queue while none exists: wait as a read would (never a loop
        that spins), then look for queues again."""
        if self.reader is None or self.reader.streams or not self._follow or not self._again:
            return False
        time.sleep(self.block_s)
        self.reader = self._run(self._again())
        return True

    def __next__(self) -> Event:
        if self.reader is None:
            self.reader = self._run(self._start)
        retry = RETRY_FIRST_S
        while not self._buffer:
            if self._closed:
                raise StopIteration
            try:
                if self._waits_for_a_queue():
                    continue
                got = self._run(read_steps(self.reader, self._block_ms if self._follow else None))
                retry = RETRY_FIRST_S
            except Exception as exc:
                if not self._follow or not _retriable(exc):
                    raise
                log.warning("following events failed (%s); again in %.1fs", exc, retry)
                time.sleep(retry)
                retry = min(retry * 2, RETRY_MAX_S)
                continue
            if not got and not self._follow:
                raise StopIteration
            self._buffer = got
        return self._buffer.pop(0)


class AsyncEventStream:
    """``async for ev in ajq.events(queue): ...``: see :class:`EventStream`."""

    def __init__(
        self,
        run_steps: Callable[[Steps[Any]], Coroutine[Any, Any, Any]],
        start: Steps[Reader],
        follow: bool,
        block_s: float,
        again: Callable[[], Steps[Reader]] | None = None,
    ) -> None:
        self._run, self._start, self._follow = run_steps, start, follow
        self._again = again  # as EventStream's
        self._block_ms = max(1, round(block_s * 1000))
        self.reader: Reader | None = None
        self._buffer: list[Event] = []
        self._closed = False

    @property
    def cursor(self) -> str:
        return self.reader.cursor if self.reader is not None else ""

    def __aiter__(self) -> AsyncIterator[Event]:
        return self

    async def __aenter__(self) -> AsyncEventStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._closed = True

    async def __anext__(self) -> Event:
        if self.reader is None:
            self.reader = await self._run(self._start)
        retry = RETRY_FIRST_S
        while not self._buffer:
            if self._closed:
                raise StopAsyncIteration
            try:
                if self._follow and self._again and not self.reader.streams:
                    await asyncio.sleep(self._block_ms / 1000)
                    self.reader = await self._run(self._again())
                    continue
                got = await self._run(
                    read_steps(self.reader, self._block_ms if self._follow else None)
                )
                retry = RETRY_FIRST_S
            except Exception as exc:
                if not self._follow or not _retriable(exc):
                    raise
                log.warning("following events failed (%s); again in %.1fs", exc, retry)
                await asyncio.sleep(retry)
                retry = min(retry * 2, RETRY_MAX_S)
                continue
            if not got and not self._follow:
                raise StopAsyncIteration
            self._buffer = got
        return self._buffer.pop(0)


def recent_of_steps(
    core: Any,
    queues: Sequence[str] | None,
    limit: int,
    run_id: str | None,
    kinds: frozenset[str] | None,
) -> Steps[Listing[Event]]:
    """``recent_steps`` of the queues' partitions, or of the run's own when ``run_id``."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 0 <= limit <= 100_000:
        raise ConfigError("limit must be a whole number from 0 to 100000")
    if run_id is not None:
        queue = queues[0] if queues and len(queues) == 1 else None
        partitions = [(yield from core._located(run_id, queue))]
    else:
        partitions = yield from partitions_steps(core, queues)
    return (yield from recent_steps(partitions, limit, run_id, kinds))


def reader_steps(
    core: Any,
    queues: Sequence[str] | None,
    since: Since,
    run_id: str | None,
    kinds: frozenset[str] | None,
    cluster: bool,
) -> Steps[Reader]:
    """Where a reader starts: the run's own partition when ``run_id`` is given (looked up
    in ``queues``' one queue, else everywhere), else every partition of the queues."""
    if run_id is not None:
        queue = queues[0] if queues and len(queues) == 1 else None
        keys = yield from core._located(run_id, queue)
        partitions = [keys]
    else:
        partitions = yield from partitions_steps(core, queues)
    streams = yield from start_steps(partitions, since)
    return Reader(streams, run_id, kinds, cluster)


def queue_list(queue: str | Sequence[str] | None) -> list[str] | None:
    if queue is None:
        return None
    names = [queue] if isinstance(queue, str) else list(queue)
    for name in names:
        validate_queue_name(name)
    return names
