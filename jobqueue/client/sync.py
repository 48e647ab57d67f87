"""The app-facing client: register tasks, enqueue runs (idempotent by run id), look runs up."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Any

import redis

from jobqueue.anomalies import Anomaly, is_wrong_type
from jobqueue.client.base import (
    ClientBase,
    Planned,
    QueueTable,
    Request,
    TaskRef,
    cancel_refused,
    check_args_sequence,
    create_batches,
    created_flags,
    not_found,
    pick_located,
    queue_table,
    read_run,
)
from jobqueue.errors import ConfigError, ConnectionFailed, NotDurable, OperationRefused, RunTimeout
from jobqueue.models import Run
from jobqueue.policy.timeutil import Delay, Instant
from jobqueue.settings import Settings
from jobqueue.store import ops
from jobqueue.store.connection import check, redact, sync_client
from jobqueue.store.embedded import configured_url, resolve_url
from jobqueue.store.keys import QUEUES_KEY, PartitionKeys, validate_queue_name
from jobqueue.store.scripts import Call, ScriptRunner


class RunHandle:
    """What enqueue returns: the run id, whether this call created the run, and a way to wait."""

    def __init__(self, jq: JobQueue, run_id: str, queue: str, created: bool) -> None:
        self.jq, self.run_id, self.queue, self.created = jq, run_id, queue, created

    def __repr__(self) -> str:
        return f"RunHandle({self.run_id!r}, queue={self.queue!r}, created={self.created})"

    def refresh(self) -> Run:
        return self.jq.get_run(self.run_id, queue=self.queue)

    @property
    def state(self) -> str:
        return self.refresh().state

    @property
    def result(self) -> Any:
        return self.refresh().result

    def wait(self, timeout: float | None = None, poll: float = 0.2) -> Run:
        """Block until the run finishes (done, dead or cancelled) and return it."""
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.005
        while True:
            run = self.refresh()
            if run.finished:
                return run
            if deadline is not None and time.monotonic() >= deadline:
                raise RunTimeout(f"run {self.run_id} still {run.state} after {timeout} s")
            time.sleep(pause)
            pause = min(pause * 2, poll)


class JobQueue(ClientBase):
    """``JobQueue.from_url(url)`` or ``JobQueue(redis_client)``."""

    def __init__(
        self,
        client: Any = None,
        *,
        settings: Settings | None = None,
        partitions: dict[str, int] | None = None,
        url: str | None = None,
    ) -> None:
        """With a client, use it; else connect lazily, at first use, to ``url`` (else
        $JOBQUEUE_REDIS_URL, else an embedded server). Lazy, so that an app module can create
        its JobQueue at import time and a worker or CLI can still point it elsewhere."""
        super().__init__(settings=settings, partitions=partitions)
        if url is not None:
            configured_url(url)  # an empty URL is refused now, not at first use
        self._client = client
        self._scripts = ScriptRunner(client) if client is not None else None
        self.url = url
        self._connect_lock = threading.Lock()
        self._registered_queues: set[str] = set()

    @classmethod
    def from_url(
        cls,
        url: str | None = None,
        *,
        settings: Settings | None = None,
        partitions: dict[str, int] | None = None,
    ) -> JobQueue:
        """A JobQueue for ``url`` (redis://, rediss://, unix://, redis+cluster://); with no
        URL, $JOBQUEUE_REDIS_URL, else a private embedded server. Connects at first use."""
        return cls(settings=settings, partitions=partitions, url=url)

    def use_url(self, url: str) -> None:
        """Point a not-yet-connected JobQueue elsewhere (the CLI's --redis-url)."""
        if self._client is not None:
            raise ConfigError("this JobQueue is already connected; set the URL before first use")
        self.url = configured_url(url)

    def connect(self) -> None:
        """Connect now and check the server answers (a clear error if not)."""
        with self._connect_lock:
            if self._client is not None:
                return
            resolved = resolve_url(self.url)
            client = sync_client(resolved)
            check(client, resolved)
            self.url, self._client, self._scripts = resolved, client, ScriptRunner(client)

    @property
    def connected(self) -> bool:
        return self._client is not None

    @property
    def redis(self) -> Any:
        if self._client is None:
            self.connect()
        return self._client

    @property
    def scripts(self) -> ScriptRunner:
        if self._scripts is None:
            self.connect()
        assert self._scripts is not None
        return self._scripts

    def close(self) -> None:
        if self._scripts is not None:
            self._scripts.close()
        if self._client is not None:
            self._client.close()

    def __repr__(self) -> str:
        return f"JobQueue({redact(self.url) if self.url else 'not connected'})"

    # -- queues ----------------------------------------------------------------------------

    def register_queue(self, queue: str) -> int:
        """Record the queue and its partition count in Redis once; a process that disagrees
        with the recorded count is refused (runs would be looked for in the wrong slots)."""
        if queue in self._registered_queues:
            return self.partitions_of(queue)
        validate_queue_name(queue)  # jq:queues lists only names every command can address
        try:
            pipe = self.redis.pipeline(transaction=False)
            pipe.hsetnx(QUEUES_KEY, queue, self.registration(queue))
            pipe.hget(QUEUES_KEY, queue)
            written, stored = pipe.execute(raise_on_error=False)
            if isinstance(written, Exception) and not is_wrong_type(written):
                raise written  # refused by the server (OOM, READONLY): not the data's fault
        except redis.exceptions.RedisError as exc:
            raise ConnectionFailed(f"cannot register queue {queue!r}: {exc}") from None
        count = self.adopt_partition_count(queue, stored)
        self._registered_queues.add(queue)
        return count

    def queues(self) -> dict[str, int]:
        """Every usable queue recorded in Redis, with its partition count (entries that are
        not usable are left out: see :meth:`queue_table`)."""
        return self.queue_table().counts

    def queue_table(self) -> QueueTable:
        """``jq:queues`` as read, with the entries no command can use as anomalies."""
        try:
            reply = self.redis.hgetall(QUEUES_KEY)
        except redis.exceptions.ResponseError as exc:
            if not is_wrong_type(exc):
                raise
            reply = exc
        return queue_table(reply)

    # -- enqueue ---------------------------------------------------------------------------

    def enqueue(
        self,
        task: TaskRef,
        *args: Any,
        run_id: str | None = None,
        delay: Delay | None = None,
        at: Instant | None = None,
        queue: str | None = None,
        **kwargs: Any,
    ) -> RunHandle:
        """Create one run; with a run id that already exists, nothing is written and the
        handle says ``created=False``."""
        name, spec = self.prepare_args(task, args, kwargs, run_id, delay, at, queue)
        self.register_queue(name)
        keys = self.keys_for(name, spec.run_id)
        call = ops.create_call(keys, (spec,))
        if self.settings.durable:
            (reply,) = self._run_durable([call], [spec.run_id])
        else:
            reply = self.scripts.run(call)
        (created,) = ops.parse_create(reply)
        return RunHandle(self, spec.run_id, name, created)

    def _run_durable(self, calls: list[Call], run_ids: list[str]) -> list[Any]:
        """Settings.durable_*: the creates, then WAIT/WAITAOF on their connections."""
        s = self.settings
        replies, durable = self.scripts.run_durable(
            calls, s.durable_replicas, s.durable_fsync, s.durable_timeout_ms
        )
        if not durable:
            what = run_ids[0] if len(run_ids) == 1 else f"{len(run_ids)} runs ({run_ids[0]}, ...)"
            raise NotDurable(
                f"{what}: written on the master but not acknowledged by "
                f"{s.durable_replicas} replica(s){' and its AOF' if s.durable_fsync else ''} "
                f"within {s.durable_timeout_s:g}s; a failover now could lose it: enqueue it "
                "again with the same run id (idempotent) once replicas catch up"
            )
        return replies

    def enqueue_many(self, requests: Iterable[Request]) -> list[RunHandle]:
        """Validate all, then create all in one pipelined round trip (one script call per
        partition and chunk)."""
        prepared = [self.prepare(r) for r in requests]
        for queue in {q for q, _ in prepared}:
            self.register_queue(queue)
        planned = self.place(prepared)
        created = self._create(planned)
        return [
            RunHandle(self, p.spec.run_id, p.keys.queue, c)
            for p, c in zip(planned, created, strict=True)
        ]

    def _create(self, planned: list[Planned], now: int | None = None) -> list[bool]:
        batches = create_batches(planned, now)
        calls = [call for call, _ in batches]
        if self.settings.durable:
            replies = self._run_durable(calls, [p.spec.run_id for p in planned])
        elif len(calls) == 1:
            # A single call goes without a pipeline: its overhead matters at one enqueue.
            replies = [self.scripts.run(calls[0])]
        else:
            replies = self.scripts.run_many(calls)
        return created_flags(len(planned), batches, replies)

    # -- look-ups --------------------------------------------------------------------------

    def locate(self, run_id: str, queue: str | None = None) -> PartitionKeys | None:
        """The partition holding a run: in ``queue`` if given, else in any known queue."""
        return self._search(run_id, queue)[0]

    def _search(self, run_id: str, queue: str | None) -> tuple[PartitionKeys | None, list[Anomaly]]:
        """The partition holding a run, and the queues that could not be searched."""
        table = self.queue_table()
        keys = self.lookup_candidates(run_id, queue, table)
        skipped = [] if queue else table.anomalies
        if not keys:
            return None, skipped
        pipe = self.redis.pipeline(transaction=False)
        for k in keys:
            pipe.exists(k.run(run_id))
        found = [k for k, n in zip(keys, pipe.execute(), strict=True) if n]
        return pick_located(run_id, found), skipped

    def _located(self, run_id: str, queue: str | None) -> PartitionKeys:
        keys, skipped = self._search(run_id, queue)
        if keys is None:
            raise not_found(run_id, queue, skipped)
        return keys

    def find_run(self, run_id: str, queue: str | None = None) -> Run | None:
        keys = self.locate(run_id, queue)
        return None if keys is None else self._read(keys, run_id)

    def get_run(self, run_id: str, queue: str | None = None) -> Run:
        keys = self._located(run_id, queue)
        run = self._read(keys, run_id)
        if run is None:  # expired between the look-up and the read
            raise not_found(run_id, queue)
        return run

    def _read(self, keys: PartitionKeys, run_id: str) -> Run | None:
        pipe = self.redis.pipeline(transaction=False)
        pipe.hgetall(keys.run(run_id))
        pipe.lrange(keys.history(run_id), 0, -1)
        fields, history = pipe.execute(raise_on_error=False)
        return read_run(keys, run_id, fields, history)

    # -- steering --------------------------------------------------------------------------

    def cancel(self, run_id: str, queue: str | None = None, reason: str = "cancelled") -> str:
        """Cancel a pending or running run; returns the state it was in. A running worker is
        fenced out at its next heartbeat. Refused (OperationRefused) if already finished."""
        keys = self._located(run_id, queue)
        call = ops.cancel_call(keys, run_id, self.settings.done_retention_ms, reason)
        changed, state = ops.parse_state_change(self.scripts.run(call))
        if not changed:
            raise cancel_refused(run_id, state)
        return state

    def purge_dead(self, run_ids: Iterable[str], queue: str | None = None) -> int:
        """Delete dead runs for good (record, history, dead-index entry), one purge call per
        partition in one round trip. Runs no longer dead (requeued meanwhile) or not found are
        left alone. Returns how many were purged."""
        groups: dict[PartitionKeys, list[str]] = {}
        for run_id in run_ids:
            keys = self.locate(run_id, queue)
            if keys is not None:
                groups.setdefault(keys, []).append(run_id)
        calls = [ops.purge_call(keys, members) for keys, members in groups.items()]
        return sum(ops.parse_purge(reply)[0] for reply in self.scripts.run_many(calls))

    def requeue(self, run_id: str, queue: str | None = None) -> str:
        """Put a dead, cancelled or done run back to pending with its attempts reset."""
        keys = self._located(run_id, queue)
        changed, state = ops.parse_state_change(self.scripts.run(ops.requeue_call(keys, run_id)))
        if not changed:
            raise OperationRefused(f"run {run_id} is {state}; only finished runs requeue")
        return state

    def server_time_ms(self) -> int:
        seconds, micros = self.redis.time()
        return int(seconds) * 1000 + int(micros) // 1000

    # -- recurring jobs --------------------------------------------------------------------
    # Delegates to jobqueue.schedules.recurring (the definitions store); the daemon is
    # jobqueue.scheduler.Scheduler. ``now`` (ms) is for tests; the server clock otherwise.

    from jobqueue.schedules.recurring import Recurring, ScheduleInfo

    @property
    def recurring(self) -> Recurring:
        store = self.__dict__.get("_recurring_store")
        if store is None:
            from jobqueue.schedules.recurring import Recurring

            store = self.__dict__.setdefault("_recurring_store", Recurring(self))
        return store  # type: ignore[no-any-return]

    def schedule(
        self,
        job_id: str,
        task: TaskRef,
        *,
        cron: str | None = None,
        every: float | None = None,
        tz: str = "UTC",
        args: Iterable[Any] = (),
        kwargs: dict[str, Any] | None = None,
        misfire: str = "fire-once",
        jitter: float | None = None,
        overlap: str = "allow",
        queue: str | None = None,
        start_at: Instant | None = None,
        end_at: Instant | None = None,
        max_attempts: int | None = None,
        now: int | None = None,
    ) -> ScheduleInfo:
        """Create or update a recurring job (upsert). Everything is validated first: a bad
        cron, time zone, jitter (>= the period) or policy raises and writes nothing."""
        from jobqueue.schedules.recurring import make_definition

        check_args_sequence(args)
        defn = make_definition(
            self,
            job_id,
            task,
            cron=cron,
            every=every,
            tz=tz,
            args=list(args),
            kwargs=kwargs,
            misfire=misfire,
            jitter=jitter,
            overlap=overlap,
            queue=queue,
            start_at=start_at,
            end_at=end_at,
            max_attempts=max_attempts,
        )
        return self.recurring.schedule(defn, now=now)

    def unschedule(self, job_id: str) -> bool:
        return self.recurring.unschedule(job_id)

    def pause_schedule(self, job_id: str, now: int | None = None) -> ScheduleInfo:
        return self.recurring.pause(job_id, now=now)

    def resume_schedule(self, job_id: str, now: int | None = None) -> ScheduleInfo:
        return self.recurring.resume(job_id, now=now)

    def trigger(self, job_id: str, now: int | None = None) -> RunHandle:
        return self.recurring.trigger(job_id, now=now)

    def backfill(
        self, job_id: str, start: Instant, end: Instant, now: int | None = None
    ) -> list[RunHandle]:
        return self.recurring.backfill(job_id, start, end, now=now)

    def get_schedule(self, job_id: str) -> ScheduleInfo | None:
        return self.recurring.get(job_id)

    def list_schedules(self) -> list[ScheduleInfo]:
        return self.recurring.list_jobs()

    # -- end of recurring jobs -------------------------------------------------------------
