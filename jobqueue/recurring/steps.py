"""The definitions store as I/O-free operations (``Steps``, see ``jobqueue.store.io``): what is
sent to Redis to read, list, write, pause, resume and remove a recurring job, and what each
reply means. Driven by the sync client (``jobqueue.recurring.sync``) and the asyncio one
alike."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import redis

from jobqueue.anomalies import (
    Anomaly,
    Listing,
    checked,
    is_time,
    is_wrong_type,
    score_ms,
    unique,
)
from jobqueue.errors import (
    CorruptData,
    OperationRefused,
    UnknownSchedule,
)
from jobqueue.recurring.definitions import (
    ORIGIN_CODE,
    Definition,
    JobState,
    _str,
    validate_job_id,
)
from jobqueue.recurring.fires import first_fire_after
from jobqueue.recurring.info import ScheduleInfo
from jobqueue.recurring.layout import SchedLayout
from jobqueue.store.io import (
    Scripts,
    Steps,
    cmd,
    commands,
    raised,
    server_time_steps,
)
from jobqueue.store.keys import (
    SchedKeys,
)
from jobqueue.store.schedules import SCHED_DEFINE

_CAS_ATTEMPTS = 20
# Definitions read per HSCAN page by listings.
LIST_SCAN_COUNT = 500


class RuntimeOwned(Exception):
    """Internal to ``Recurring.sync``: the id belongs to a schedule added at run time."""


class RecurringSteps:
    """The definitions store as I/O-free operations, driven by the sync client
    (:class:`jobqueue.recurring.sync.Recurring`) and by the asyncio one alike. What it keeps
    between operations is K, the scheduler partition count, once known (``layout``)."""

    def __init__(self, partitions: int | None = None, client: Any = None) -> None:
        # ``client``: only asked for the cluster's masters (SchedLayout.default_partitions).
        self.layout = SchedLayout(partitions, self.topology_client)
        self._client = client

    def topology_client(self) -> Any:
        """The client whose topology (a cluster's masters) decides the default K."""
        return self._client

    # -- partitions (see SchedLayout) ------------------------------------------------------

    def record_partitions_steps(self) -> Steps[int]:
        return (yield from self.layout.record_partitions_steps())

    def read_partitions_steps(self) -> Steps[int]:
        return (yield from self.layout.read_partitions_steps())

    def refresh_steps(self) -> Steps[None]:
        return (yield from self.layout.refresh_steps())

    def keys_steps(self, job_id: str) -> Steps[SchedKeys]:
        return (yield from self.layout.keys_steps(job_id))

    def all_keys_steps(self) -> Steps[list[SchedKeys]]:
        return (yield from self.layout.all_keys_steps())

    def forget(self) -> None:
        self.layout.forget()

    # -- reading ---------------------------------------------------------------------------

    def read_steps(self, job_id: str) -> Steps[tuple[str | None, int | None, str | None]]:
        """A job's stored definition text, next fire and counters text (None: absent)."""
        sk = yield from self.keys_steps(job_id)
        replies = yield commands(
            cmd("hget", sk.defs, job_id),
            cmd("zscore", sk.next, job_id),
            cmd("hget", sk.state, job_id),
        )
        kinds = ((sk.defs, "hash"), (sk.next, "sorted set"), (sk.state, "hash"))
        for (key, kind), reply in zip(kinds, replies, strict=True):
            if is_wrong_type(reply):
                raise CorruptData(f"{key} is not a {kind}: cannot read {job_id!r}")
            if isinstance(reply, Exception):
                raise reply
        text, score, state = replies
        if score is not None and score_ms(score) is None:
            raise CorruptData(f"{sk.next} member {job_id!r} has score {score!r}, not a time")
        return _str(text), score_ms(score), _str(state)

    @staticmethod
    def stored_info(
        sk: SchedKeys, job_id: str, text: str, next_fire: Any, state: Any
    ) -> ScheduleInfo | Anomaly:
        """A stored job as read, or the Anomaly that says why its definition is not usable.
        A garbage next fire or counters text is an anomaly of the row instead."""
        try:
            defn = Definition.from_json(job_id, text)
        except CorruptData as exc:
            return Anomaly(sk.defs, f"field {job_id!r}: {exc}")
        anomalies: list[Anomaly] = []
        fire = score_ms(next_fire)
        if next_fire is not None and fire is None:
            anomalies.append(Anomaly(sk.next, f"member {job_id!r} has score {next_fire!r}"))
        try:
            counters = JobState.parse(_str(state))
            times = (counters.last_fire_ms, counters.through_ms)
            if not all(t is None or is_time(t) for t in times):
                raise ValueError("a time out of range")
        except ValueError:
            counters = JobState()
            anomalies.append(
                Anomaly(sk.state, f"field {job_id!r} is {_str(state)!r}, not counters")
            )
        return ScheduleInfo(defn, fire, counters, tuple(anomalies))

    def get_steps(self, job_id: str) -> Steps[ScheduleInfo | None]:
        """The job, None if there is none; CorruptData if its definition is not usable."""
        text, next_ms, state = yield from self.read_steps(validate_job_id(job_id))
        if text is None:
            return None
        sk = yield from self.keys_steps(job_id)
        info = self.stored_info(sk, job_id, text, next_ms, state)
        if isinstance(info, Anomaly):
            raise CorruptData(f"recurring job {job_id!r} cannot be read: {info}")
        return info

    def require_steps(self, job_id: str) -> Steps[ScheduleInfo]:
        info = yield from self.get_steps(job_id)
        if info is None:
            raise UnknownSchedule(f"no recurring job {job_id!r}")
        return info

    def list_steps(
        self, limit: int | None = None, scan_count: int = LIST_SCAN_COUNT
    ) -> Steps[Listing[ScheduleInfo]]:
        """Recurring jobs (at most ``limit``; None: all), sorted by job id. Read with HSCAN in
        pages and pipelined ZSCORE/HGET per page, so a store of millions of jobs never blocks
        the server. A definition that is not usable is an anomaly of the listing, not a row;
        garbage beside a usable one, an anomaly of its row."""
        out: list[ScheduleInfo] = []
        found: list[Anomaly] = []
        seen: set[str] = set()  # HSCAN may return an entry twice across pages
        wanted = math.inf if limit is None else limit
        for sk in (yield from self.all_keys_steps()):
            cursor: int = 0
            while len(out) < wanted:
                (page,) = yield commands(cmd("hscan", sk.defs, cursor, count=scan_count))
                if checked(page, sk.defs, "hash", found, None) is None:
                    break
                cursor, entries = page
                items = [(j, t) for j, t in entries.items() if j not in seen]
                if limit is not None:
                    items = items[: limit - len(out)]
                seen.update(j for j, _ in items)
                replies = (
                    (yield commands(
                        *(c for job_id, _ in items
                          for c in (cmd("zscore", sk.next, job_id), cmd("hget", sk.state, job_id)))
                    ))
                    if items
                    else []
                )
                for i, (job_id, text) in enumerate(items):
                    score = checked(replies[2 * i], sk.next, "sorted set", found, None)
                    state = checked(replies[2 * i + 1], sk.state, "hash", found, None)
                    info = self.stored_info(sk, job_id, text, score, state)
                    if isinstance(info, Anomaly):
                        found.append(info)
                    else:
                        out.append(info)
                if int(cursor) == 0:
                    break
            if len(out) >= wanted:
                break
        truncated = False
        if len(out) >= wanted:  # stopped at the limit: say whether definitions were left
            keys = yield from self.all_keys_steps()
            sizes = yield commands(*(cmd("hlen", sk.defs) for sk in keys))
            truncated = sum(n for n in sizes if isinstance(n, int)) > len(seen)
        return Listing(sorted(out, key=lambda i: i.job_id), unique(found), truncated)

    # -- writing ---------------------------------------------------------------------------

    def put_steps(self, job_id: str, build: Any, now: int | None) -> Steps[ScheduleInfo]:
        """Read, let ``build(old_info, now)`` decide (definition, next), write with CAS; retry
        when a scheduler or another client changed the job in between."""
        yield from self.refresh_steps()
        for _ in range(_CAS_ATTEMPTS):
            text, next_ms, state_text = yield from self.read_steps(job_id)
            sk = yield from self.keys_steps(job_id)
            old = None if text is None else self.stored_info(sk, job_id, text, next_ms, state_text)
            if isinstance(old, Anomaly):
                raise CorruptData(f"recurring job {job_id!r} cannot be changed: {old}")
            defn, new_next = build(old, (yield from server_time_steps(now)))
            if self.layout.known is None:
                # This process's first write, now known to be valid: K is recorded (HSETNX),
                # then everything is read again, in case another process recorded another K.
                yield from self.record_partitions_steps()
                continue
            call = SCHED_DEFINE.call(
                sk,
                job_id,
                expected_definition=text,
                expected_next_ms=next_ms,
                definition=None if defn is None else defn.to_json(),
                next_ms=new_next,
            )
            (reply,) = yield Scripts([call])
            if SCHED_DEFINE.parse(reply):
                state = old.state if old else JobState()
                if defn is None:  # deleted: report what was there
                    if old is None:
                        raise UnknownSchedule(f"no recurring job {job_id!r}")
                    return old
                return ScheduleInfo(defn, new_next, state)
        raise OperationRefused(f"recurring job {job_id!r} kept changing; gave up after retries")

    def schedule_steps(self, defn: Definition, now: int | None = None) -> Steps[ScheduleInfo]:
        """Create or update (upsert) a validated definition."""
        return (yield from self.upsert_steps(defn, now, code=False))

    def upsert_steps(
        self, defn: Definition, now: int | None, *, code: bool
    ) -> Steps[ScheduleInfo]:
        """``code``: a declaration in code, which never replaces a schedule added at run time
        (raises RuntimeOwned instead, checked in the same compare-and-set as the write)."""

        def build(old: ScheduleInfo | None, t: int) -> tuple[Definition, int | None]:
            if old is None:
                return defn, first_fire_after(defn, t)
            if code and old.definition.origin != ORIGIN_CODE:
                raise RuntimeOwned(defn.job_id)
            new = replace(defn, paused=old.definition.paused)
            if new.paused:
                return new, None
            if old.definition.timing == new.timing and old.next_fire_ms is not None:
                return new, old.next_fire_ms
            return new, first_fire_after(new, max(t, old.state.through_ms or t))

        return (yield from self.put_steps(defn.job_id, build, now))

    def remove_declared_steps(self, job_id: str) -> Steps[bool]:
        """Delete the job only if its stored definition still comes from code."""
        removed = False

        def build(old: ScheduleInfo | None, t: int) -> tuple[Definition | None, int | None]:
            nonlocal removed
            if old is None or old.definition.origin != ORIGIN_CODE:
                removed = False
                return (None, None) if old is None else (old.definition, old.next_fire_ms)
            removed = True
            return None, None

        try:
            yield from self.put_steps(job_id, build, 0)
        except UnknownSchedule:
            return False
        return removed

    def unschedule_steps(self, job_id: str) -> Steps[bool]:
        """Remove a job's definition, next fire and counters; runs already created stay."""
        validate_job_id(job_id)
        if (yield from self.read_steps(job_id))[0] is None:
            return False  # nothing there: nothing recorded either
        yield from self.record_partitions_steps()  # a write: K is recorded first
        yield from self.refresh_steps()
        sk = yield from self.keys_steps(job_id)
        for _ in range(_CAS_ATTEMPTS):
            # Compared with the stored text as it is, not parsed: a definition that is not
            # usable (foreign data) can still be removed, which is the way out of it.
            text, _next_ms, _state = yield from self.read_steps(job_id)
            if text is None:
                return False
            # The score as stored, not as parsed: a foreign fractional score (0.5) read as a
            # whole ms never matched, and the job could not be removed at all.
            (stored_score,) = yield commands(cmd("zscore", sk.next, job_id))
            call = SCHED_DEFINE.call(
                sk,
                job_id,
                expected_definition=text,
                expected_next_ms=stored_score,
                definition=None,
                next_ms=None,
            )
            (reply,) = yield Scripts([call])
            if SCHED_DEFINE.parse(reply):
                return True
        raise OperationRefused(f"recurring job {job_id!r} kept changing; gave up after retries")

    def pause_steps(self, job_id: str, now: int | None = None) -> Steps[ScheduleInfo]:
        yield from self.require_steps(job_id)

        def build(old: ScheduleInfo | None, t: int) -> tuple[Definition, None]:
            if old is None:
                raise UnknownSchedule(f"no recurring job {job_id!r}")
            return replace(old.definition, paused=True), None

        return (yield from self.put_steps(job_id, build, now))

    def resume_steps(self, job_id: str, now: int | None = None) -> Steps[ScheduleInfo]:
        """Fire times that passed while paused are not fired (use backfill for those)."""
        yield from self.require_steps(job_id)

        def build(old: ScheduleInfo | None, t: int) -> tuple[Definition, int | None]:
            if old is None:
                raise UnknownSchedule(f"no recurring job {job_id!r}")
            if not old.definition.paused:
                return old.definition, old.next_fire_ms
            new = replace(old.definition, paused=False)
            return new, first_fire_after(new, max(t, old.state.through_ms or t))

        return (yield from self.put_steps(job_id, build, now))


# -- what the scheduler daemon reads besides its scripts -------------------------------------


def due_count_steps(keys: Sequence[SchedKeys], horizon_ms: int) -> Steps[int]:
    """Jobs of the partitions ``keys`` whose next fire is at or before ``horizon_ms`` (one
    ZCOUNT per partition); a partition whose master does not answer is left out (counted
    when it is back)."""
    ahead = 0
    for sk in keys:
        try:
            (count,) = yield commands(cmd("zcount", sk.next, "(-inf", horizon_ms))
        except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException):
            continue
        if isinstance(count, int):
            ahead += count
    return ahead


def run_states_steps(run_keys: Sequence[str]) -> Steps[list[str | None]]:
    """The state of each run record (None: no record, or expired), in one round trip."""
    if not run_keys:
        return []
    replies = raised((yield commands(*(cmd("hget", key, "state") for key in run_keys))))
    return [None if state is None else _str(state) for state in replies]


def buffered_entries_steps(sk: SchedKeys) -> Steps[dict[str, str]]:
    """A partition's buffer-one entries: job id -> 'fire pred_fire due queue [pred_queue]'."""
    (entries,) = raised((yield commands(cmd("hgetall", sk.buffered))))
    return {_str(k) or "": _str(v) or "" for k, v in entries.items()}
