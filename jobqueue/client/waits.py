"""Waiting for runs to finish without polling: ``handle.wait()`` and ``handle.result()``.

A client keeps one listener per partition that somebody waits on. The listener reads the
partition's event log (``jq:{q#p}:events``, see ``jobqueue.store.events``) with a blocking
XREAD and wakes the waiters of a run as soon as it reads that run's finishing event
(completed, dead, cancelled; purged too). A woken waiter reads the run's record, which the
same script wrote, and returns it. Many waiters share one listener: 1,000 waiters on one
partition cost one blocking read, not 1,000 polls.

A waiter registers with the listener *before* it reads the record for the first time, and
the listener reads from a position it had reached before that registration, so an event written
after the first read is always seen. Where the log cannot be trusted the waiters read their
records again, which is always right (the record is the truth, the log a notice):

- after a lost connection the listener arms again (the log may have gone back, in a
  failover to a replica that lagged, or away, in a restart) and every waiter reads again;
- when entries were removed (trimmed) before it read them: it fell behind by a whole log, or
  somebody trimmed it by hand (``jobqueue.store.events.Losses``: the log's count of entries
  ever added, from XINFO STREAM, against the entries read), or when the log is not the one
  read before (made again, gone back);
- every ``SWEEP_S``, whatever the log brought: one pipelined read of the watched runs'
  states, for a finish whose event was never written (the log turned off and on, a server
  whose ACL lacks XADD) or a change of the log the checks above cannot see. The runs it
  finds finished have their records read as those of a read's events are, in one call for
  all (a sweep while the listener is behind the log, e.g. mid-way through a full read's
  backlog, finds every run whose event is still unread: hundreds of waiters under load,
  each of which would otherwise read its record by itself). A partition whose log is off,
  or holds foreign data, is watched that way only, at the waiters' polling pace (5 ms,
  doubling to ``poll``).

The steps (what is sent, what a reply means) are written once here (``ListenerState``);
the sync client runs a listener in a thread, the asyncio client in a task.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

import redis

from jobqueue.anomalies import is_wrong_type
from jobqueue.client.base import read_run
from jobqueue.errors import ConnectionFailed, JobQueueError
from jobqueue.store.events import FINISHED, Losses
from jobqueue.store.io import Scripts, Steps, cmd, commands
from jobqueue.store.keys import PartitionKeys
from jobqueue.store.runs import READ_RECORDS

log = logging.getLogger("jobqueue.client")
T = TypeVar("T")

BLOCK_MS = 2_000  # one blocking read; below the connections' 10 s socket timeout
READ_COUNT = 1_000  # entries per read (a full read is followed by the next at once)
# Runs per read_records call (several calls go in one round trip): a record can be 1 MiB
# (payload and result), and one call builds its whole reply in the server's memory at once.
RECORDS_PER_CALL = 100
SWEEP_S = 5.0  # no entry for this long: the watched runs' states are read once
FIRST_POLL_S = 0.005
RETRY_FIRST_S, RETRY_MAX_S = 0.05, 1.0
# Besides the finishing events, a purge ends a wait (the record is gone: RunNotFound).
WAKING = FINISHED | {"purged"}
FINISHED_STATES = ("done", "dead", "cancelled")
OFF = "events are off for this queue"


class Arming(NamedTuple):
    """Where a listener starts: ``pos`` the log's last entry id ('0-0': no log yet), or
    ``mode`` 'poll' when the log is off or unusable (``why``); ``info``: XINFO STREAM's."""

    mode: str
    pos: str
    why: str = ""
    info: Any = None


class Read(NamedTuple):
    """One blocking read: (entry id, run id, event) in order; ``info`` the log's XINFO STREAM
    just before it (None: no log); ``gone`` when the log itself went away."""

    entries: list[tuple[str, str, str]]
    info: Any
    gone: bool
    foreign: bool  # the log is not a stream, or the ACL refused: arm again


class States(NamedTuple):
    """A sweep: whether the log is off now, and the watched runs that finished (or whose
    record is gone or is not a record)."""

    off: bool
    ended: set[str]


def _denied(reply: Any) -> bool:
    """An ACL refusal (an ACL written before event logs existed lacks XREAD, XINFO)."""
    return isinstance(reply, Exception) and "NOPERM" in str(reply).upper()


def _off(conf: Any) -> bool:
    return isinstance(conf, list) and bool(conf) and conf[0] == "1"


def arm_steps(keys: PartitionKeys) -> Steps[Arming]:
    """The log's settings and its last entry id (XINFO STREAM; no log yet: '0-0')."""
    conf, kind, info = yield commands(
        cmd("hmget", keys.events_conf, "off"),
        cmd("type", keys.events),
        cmd("xinfo_stream", keys.events),
    )
    if any(_denied(reply) for reply in (conf, kind, info)):
        return Arming("poll", "0-0", "the server's ACL does not let this client read the log")
    for reply in (conf, kind):
        if isinstance(reply, Exception) and not is_wrong_type(reply):
            raise reply
    if _off(conf):
        return Arming("poll", "0-0", OFF)
    if kind == "none":
        return Arming("stream", "0-0")
    if kind != "stream":
        return Arming("poll", "0-0", f"{keys.events} holds foreign data (a {kind})")
    if isinstance(info, Exception):
        raise info
    last = info.get("last-generated-id") or _entry_id(info.get("last-entry")) or "0-0"
    return Arming("stream", str(last), info=info)


def _entry_id(entry: Any) -> str | None:
    if isinstance(entry, (list, tuple)) and entry and isinstance(entry[0], str):
        return entry[0]
    return None


def read_steps(keys: PartitionKeys, pos: str, block_ms: int) -> Steps[Read]:
    """TYPE and XINFO STREAM, then one blocking XREAD from ``pos``, in one round trip (what
    XINFO tells before the read shows entries removed before they were read: Losses)."""
    kind, info, reply = yield commands(
        cmd("type", keys.events),
        cmd("xinfo_stream", keys.events),
        cmd("xread", {keys.events: pos}, count=READ_COUNT, block=block_ms),
    )
    if any(_denied(r) for r in (reply, kind, info)):
        return Read([], None, False, True)  # arms again, to 'poll'
    if isinstance(kind, Exception):
        raise kind
    if kind not in ("none", "stream") or is_wrong_type(reply):
        return Read([], None, False, True)
    if isinstance(reply, Exception):
        raise reply
    entries: list[tuple[str, str, str]] = []
    for _stream, items in reply or []:
        for entry_id, fields in items:
            if isinstance(fields, dict):
                entries.append((entry_id, str(fields.get("r", "")), str(fields.get("e", ""))))
            else:
                entries.append((entry_id, "", ""))
    if kind == "none":  # no log (yet, or any more: deleted, or lost in a failover; entries
        # then come from a log made again during the read, after others were lost)
        return Read(entries, None, pos != "0-0", False)
    if isinstance(info, Exception):
        raise info
    return Read(entries, info, False, False)


def states_steps(keys: PartitionKeys, run_ids: list[str]) -> Steps[States]:
    """The log's switch and each watched run's state, in one round trip."""
    replies = yield commands(
        cmd("hmget", keys.events_conf, "off"),
        *(cmd("hget", keys.run(run_id), "state") for run_id in run_ids),
    )
    conf, states = replies[0], replies[1:]
    if isinstance(conf, Exception) and not is_wrong_type(conf):
        raise conf
    ended = set()
    for run_id, state in zip(run_ids, states, strict=True):
        if isinstance(state, Exception) and not is_wrong_type(state):
            raise state
        if is_wrong_type(state) or state is None or state in FINISHED_STATES:
            ended.add(run_id)
    return States(_off(conf), ended)


def records_steps(keys: PartitionKeys, run_ids: list[str]) -> Steps[dict[str, Any]]:
    """The records (as Runs; None for one gone) of runs whose finishing event was read (or
    that a sweep found finished), in one round trip (read_records.lua, 100 runs a call: a
    reply to parse per 100, not two a run).
    A run whose keys hold another type, or whose record does not read, is left out: its
    waiter reads it itself, and says so."""
    chunks = [run_ids[i:i + RECORDS_PER_CALL] for i in range(0, len(run_ids), RECORDS_PER_CALL)]
    replies = yield Scripts([READ_RECORDS.call(keys, chunk) for chunk in chunks])
    records = [record for reply in replies for record in READ_RECORDS.parse(reply)]
    out = {}
    for run_id, record in zip(run_ids, records, strict=True):
        if record.fields is None:
            continue
        try:
            out[run_id] = read_run(keys, run_id, record.fields, record.history)
        except Exception:
            continue
    return out


def _ids(woken: list[Watch]) -> list[str]:
    return list(dict.fromkeys(w.run_id for w in woken))


def _hand_over(records: dict[str, Any], woken: list[Watch]) -> None:
    for w in woken:
        w.run = records.get(w.run_id)


@dataclass(eq=False)
class Watch:
    """One waiter's registration: ``woken`` is set (by its listener) when its run may have
    finished, and the waiter then reads the record, unless the listener read it already
    for all the runs its events (or its sweep) found finished (``run``: one round trip for
    all of them)."""

    run_id: str
    poll_s: float
    woken: Any  # threading.Event or asyncio.Event
    run: Any = None


@dataclass(eq=False)
class ListenerState:
    """What a listener knows, and what each reply means for its waiters (no I/O; the
    drivers below hold the lock around every call)."""

    keys: PartitionKeys
    watchers: dict[str, list[Watch]] = field(default_factory=dict)
    mode: str = ""  # '' until armed, then 'stream' or 'poll'
    pos: str = "0-0"
    need_arm: bool = True
    why: str = ""  # why 'poll' (Arming.why)
    last_sweep: float = 0.0  # monotonic time of the last sweep (or arming)
    armed_at: float = 0.0
    poll_pause: float = FIRST_POLL_S
    losses: Losses = field(default_factory=Losses)
    exact: bool = False  # (read: the waiters woken were woken by their runs' own events)

    def add(self, watch: Watch) -> None:
        self.watchers.setdefault(watch.run_id, []).append(watch)
        self.poll_pause = FIRST_POLL_S

    def remove(self, watch: Watch) -> None:
        group = self.watchers.get(watch.run_id, [])
        if watch in group:
            group.remove(watch)
        if not group:
            self.watchers.pop(watch.run_id, None)

    def everyone(self) -> list[Watch]:
        return [w for group in self.watchers.values() for w in group]

    def armed(self, arming: Arming, now: float, first: bool) -> list[Watch]:
        """Armed (again), reading from the log's end now: every waiter reads again after a
        re-arm (the log may have gone back or away, and what came before this position is
        not read), none after the first (they read after registering), none from polling to
        polling (the states read covers them)."""
        if arming.mode == "poll" and self.why != arming.why:
            log.debug("waits on %s read the run records (%s)", self.keys.prefix, arming.why)
        wake = not first and not (self.mode == "poll" and arming.mode == "poll")
        self.pos = arming.pos
        self.losses.caught_up(arming.info)
        self.mode, self.why, self.need_arm = arming.mode, arming.why, False
        self.last_sweep = self.armed_at = now
        return self.everyone() if wake else []

    def read(self, result: Read, now: float) -> list[Watch]:
        """The waiters to wake; ``self.exact`` says whether they were woken by their own
        runs' finishing events (their records worth reading for them at once)."""
        self.exact = False
        if result.foreign:
            self.need_arm = True  # arms to 'poll' (foreign data is reported there)
            return self.everyone()
        woken: list[Watch] = []
        before = self.pos
        for entry_id, run_id, event in result.entries:
            if event in WAKING:
                woken.extend(self.watchers.get(run_id, ()))
            self.pos = entry_id
        if result.gone:
            self.need_arm = True
            return self.everyone()
        ids = [entry_id for entry_id, _, _ in result.entries]
        if result.info is not None and self.losses.check(result.info, ids, before, READ_COUNT):
            log.debug("events of %s were removed before they were read: the waiters read "
                     "their runs again", self.keys.prefix)
            return self.everyone()
        self.exact = True
        return woken

    def sweep_due(self, now: float) -> bool:
        """Every SWEEP_S whatever the log brought: a finish whose event never came (the log
        turned off and on again, a writer whose ACL lacks XADD, a log made again between two
        reads, a connection the client re-made without telling) is found by it."""
        return self.mode == "poll" or now - self.last_sweep >= SWEEP_S

    def swept(self, states: States, now: float) -> list[Watch]:
        if self.mode == "stream":
            self.need_arm = states.off  # switched off meanwhile
        elif self.why == OFF:
            self.need_arm = not states.off  # switched on again
        elif now - self.armed_at >= SWEEP_S:
            self.need_arm = True  # foreign data or the ACL: fixed since?
        if self.mode == "poll":
            self.poll_pause = min(self.poll_pause * 2, self.poll_cap())
        if not self.need_arm:
            self.last_sweep = now
        return [w for run_id in states.ended for w in self.watchers.get(run_id, ())]

    def poll_cap(self) -> float:
        return min((w.poll_s for w in self.everyone()), default=FIRST_POLL_S)

    def lost(self) -> list[Watch]:
        """The connection failed: arm again, and every waiter reads its record again."""
        self.need_arm = True
        return self.everyone()


def _retriable(exc: BaseException) -> bool:
    return isinstance(
        exc, (redis.exceptions.RedisError, redis.exceptions.RedisClusterException, JobQueueError)
    )


def retriable(exc: BaseException) -> bool:
    """A read that may answer if tried again: the connection, or a cluster mid-failover."""
    return isinstance(exc, (
        redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
        redis.exceptions.ClusterDownError, redis.exceptions.TryAgainError,
        redis.exceptions.RedisClusterException, ConnectionFailed,
    ))


# -- sync: a thread per listener --------------------------------------------------------------


class _ThreadListener:
    def __init__(self, hub: SyncWaits, keys: PartitionKeys) -> None:
        self.hub, self.state = hub, ListenerState(keys)
        self.ready = threading.Event()  # armed (or failed: ``error``)
        self.error: BaseException | None = None

    def start(self) -> None:
        name = f"jobqueue-waits-{self.state.keys.queue}#{self.state.keys.partition}"
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def _run(self) -> None:
        run = self.hub.run_steps
        state, lock = self.state, self.hub.lock
        retry = RETRY_FIRST_S
        while True:
            with lock:
                if not state.watchers or self.hub.closed:
                    self.hub.forget(self)
                    return
                need_arm, sweep = state.need_arm, state.sweep_due(time.monotonic())
                pos, ids, pause = state.pos, list(state.watchers), state.poll_pause
            try:
                if need_arm:
                    arming = run(arm_steps(state.keys))
                    with lock:
                        woken = state.armed(arming, time.monotonic(), first=False)
                elif sweep:
                    if state.mode == "poll":
                        time.sleep(pause)
                    states = run(states_steps(state.keys, ids))
                    with lock:
                        woken = state.swept(states, time.monotonic())
                    if woken:  # (their records in one call, as for their events)
                        _hand_over(run(records_steps(state.keys, _ids(woken))), woken)
                else:
                    result = run(read_steps(state.keys, pos, BLOCK_MS))
                    with lock:
                        woken = state.read(result, time.monotonic())
                        exact = state.exact
                    if exact and woken:
                        _hand_over(run(records_steps(state.keys, _ids(woken))), woken)
                retry = RETRY_FIRST_S
            except Exception as exc:
                if not _retriable(exc):
                    log.exception("waits on %s: listener failed", state.keys.prefix)
                with lock:
                    woken = state.lost()
                log.debug("waits on %s: %s; reading again in %.2fs", state.keys.prefix, exc, retry)
                for w in woken:
                    w.woken.set()
                time.sleep(retry)
                retry = min(retry * 2, RETRY_MAX_S)
                continue
            for w in woken:
                w.woken.set()


class SyncWaits:
    """The sync client's listeners (one per partition waited on), shared by its threads."""

    def __init__(self, run_steps: Callable[[Steps[Any]], Any]) -> None:
        self.run_steps = run_steps
        self.lock = threading.Lock()
        self.listeners: dict[str, _ThreadListener] = {}
        self.closed = False
        self.pid = os.getpid()

    def forget(self, listener: _ThreadListener) -> None:
        """(Under the lock) a listener with no waiters left stops."""
        if self.listeners.get(listener.state.keys.prefix) is listener:
            del self.listeners[listener.state.keys.prefix]

    def watch(
        self, keys: PartitionKeys, run_id: str, poll_s: float, deadline: float | None
    ) -> Watch:
        """Register a waiter; returns once its listener reads from a position taken before
        this call returned (the caller reads the record after). Raises what arming raised
        (ConnectionFailed, a server error), or TimeoutError past ``deadline``."""
        watch = Watch(run_id, poll_s, threading.Event())
        while True:
            with self.lock:
                listener = self.listeners.get(keys.prefix)
                arming = listener is None
                if listener is None:
                    listener = self.listeners[keys.prefix] = _ThreadListener(self, keys)
                listener.state.add(watch)
            if arming:
                try:
                    first = self.run_steps(arm_steps(keys))
                except BaseException as exc:
                    with self.lock:
                        listener.state.remove(watch)
                        self.forget(listener)
                        listener.error = exc
                    listener.ready.set()
                    raise
                with self.lock:
                    listener.state.armed(first, time.monotonic(), first=True)
                listener.ready.set()
                listener.start()
                return watch
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            if listener.ready.wait(left) and listener.error is None:
                return watch
            with self.lock:
                listener.state.remove(watch)
            if listener.error is None:
                raise TimeoutError
            # the arming of another waiter failed: arm again (or fail) ourselves

    def unwatch(self, keys: PartitionKeys, watch: Watch) -> None:
        with self.lock:
            listener = self.listeners.get(keys.prefix)
            if listener is not None:
                listener.state.remove(watch)

    def close(self) -> None:
        with self.lock:
            self.closed = True
            woken = [w for lis in self.listeners.values() for w in lis.state.everyone()]
        for w in woken:
            w.woken.set()


# -- asyncio: a task per listener -------------------------------------------------------------


class _TaskListener:
    def __init__(self, hub: AsyncWaits, keys: PartitionKeys) -> None:
        self.hub, self.state = hub, ListenerState(keys)
        self.ready = asyncio.Event()
        self.error: BaseException | None = None
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        run, state = self.hub.run_steps, self.state
        retry = RETRY_FIRST_S
        while True:
            if not state.watchers or self.hub.closed:
                self.hub.forget(self)
                return
            woken: list[Watch]
            try:
                if state.need_arm:
                    arming = await run(arm_steps(state.keys))
                    woken = state.armed(arming, time.monotonic(), first=False)
                elif state.sweep_due(time.monotonic()):
                    if state.mode == "poll":
                        await asyncio.sleep(state.poll_pause)
                    states = await run(states_steps(state.keys, list(state.watchers)))
                    woken = state.swept(states, time.monotonic())
                    if woken:  # (their records in one call, as for their events)
                        _hand_over(await run(records_steps(state.keys, _ids(woken))), woken)
                else:
                    result = await run(read_steps(state.keys, state.pos, BLOCK_MS))
                    woken = state.read(result, time.monotonic())
                    if state.exact and woken:
                        _hand_over(await run(records_steps(state.keys, _ids(woken))), woken)
                retry = RETRY_FIRST_S
            except asyncio.CancelledError:
                self.hub.forget(self)
                raise
            except Exception as exc:
                if not _retriable(exc):
                    log.exception("waits on %s: listener failed", state.keys.prefix)
                for w in state.lost():
                    w.woken.set()
                await asyncio.sleep(retry)
                retry = min(retry * 2, RETRY_MAX_S)
                continue
            for w in woken:
                w.woken.set()


class AsyncWaits:
    """The asyncio client's listeners, on one event loop."""

    def __init__(self, run_steps: Callable[[Steps[Any]], Coroutine[Any, Any, Any]]) -> None:
        self.run_steps = run_steps
        self.listeners: dict[str, _TaskListener] = {}
        self.closed = False
        self.loop = asyncio.get_running_loop()

    def forget(self, listener: _TaskListener) -> None:
        if self.listeners.get(listener.state.keys.prefix) is listener:
            del self.listeners[listener.state.keys.prefix]

    async def watch(self, keys: PartitionKeys, run_id: str, poll_s: float) -> Watch:
        """See :meth:`SyncWaits.watch` (the caller bounds it with its timeout)."""
        watch = Watch(run_id, poll_s, asyncio.Event())
        while True:
            listener = self.listeners.get(keys.prefix)
            arming = listener is None
            if listener is None:
                listener = self.listeners[keys.prefix] = _TaskListener(self, keys)
            listener.state.add(watch)
            if arming:
                try:
                    first = await self.run_steps(arm_steps(keys))
                except BaseException as exc:
                    listener.state.remove(watch)
                    self.forget(listener)
                    listener.error = exc
                    listener.ready.set()
                    raise
                listener.state.armed(first, time.monotonic(), first=True)
                listener.ready.set()
                listener.start()
                return watch
            try:
                await listener.ready.wait()
            except BaseException:
                listener.state.remove(watch)
                raise
            if listener.error is None:
                return watch
            listener.state.remove(watch)

    def unwatch(self, keys: PartitionKeys, watch: Watch) -> None:
        listener = self.listeners.get(keys.prefix)
        if listener is not None:
            listener.state.remove(watch)

    def close(self) -> None:
        self.closed = True
        for lis in list(self.listeners.values()):
            for w in lis.state.everyone():
                w.woken.set()
            if lis.task is not None:
                lis.task.cancel()
