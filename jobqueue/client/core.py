"""Every operation of the clients, written once as I/O-free steps (``jobqueue.store.io``): the
sync ``JobQueue`` and the asyncio ``AsyncJobQueue`` drive the same steps, so they validate,
build keys, parse replies and report foreign data alike; only the I/O differs."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any, NamedTuple

from jobqueue.anomalies import Anomaly, Listing, is_wrong_type
from jobqueue.client.base import (
    ClientBase,
    Planned,
    Request,
    cancel_refused,
    create_batches,
    created_flags,
    not_found,
    pick_located,
    read_run,
)
from jobqueue.client.queue_steps import QueueSteps
from jobqueue.client.registration import TaskRef, check_args_sequence
from jobqueue.errors import ConfigError, NotDurable, OperationRefused
from jobqueue.models import Run
from jobqueue.policy.timeutil import Instant
from jobqueue.recurring.declarations import make_definition
from jobqueue.recurring.fires import backfill_specs, trigger_spec
from jobqueue.recurring.info import ScheduleInfo
from jobqueue.recurring.steps import RecurringSteps
from jobqueue.store.admin import PURGE
from jobqueue.store.io import (
    DurableScripts,
    Scripts,
    Steps,
    cmd,
    commands,
    raised,
    server_time_steps,
)
from jobqueue.store.keys import PartitionKeys, partition_of
from jobqueue.store.runs import CANCEL, CREATE_RUN, DEDUPE, REQUEUE, RunSpec
from jobqueue.store.scripts import Call
from jobqueue.tasks import Dedupe, RunOptions

log = logging.getLogger("jobqueue.client")

class Created(NamedTuple):
    """What creating one run did: its id, its queue, and whether this call created it;
    ``outcome`` says more under a deduplication key: 'created', 'existed' (the run id was
    taken), 'deduplicated' or 'replaced' (``run_id`` is then the run holding the key)."""

    run_id: str
    queue: str
    created: bool
    outcome: str = ""


class RunState(NamedTuple):
    """A run as ``run_states`` found it: where it lives (None: not found) and its state
    ('missing' when not found, 'not a run record' for a key of another type)."""

    run_id: str
    keys: PartitionKeys | None
    state: str


class ClientCore(QueueSteps):
    """The operations both clients share; ``recurring`` is their definitions store."""

    recurring: RecurringSteps

    def __init__(
        self,
        *,
        settings: Any = None,
        partitions: dict[str, int] | None = None,
        tasks: ClientBase | None = None,
    ) -> None:
        super().__init__(settings=settings, partitions=partitions, tasks=tasks)
        self._registered_queues: set[str] = set()

    def _run_calls(self, calls: list[Call], run_ids: list[str]) -> Steps[list[Any]]:
        """Script calls that create runs, durable as Settings.durable_* ask (WAIT/WAITAOF)."""
        s = self.settings
        if not s.durable:
            replies: list[Any] = yield Scripts(calls)
            return replies
        replies, durable = yield DurableScripts(
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

    def _enqueue(
        self, task: TaskRef, args: tuple[Any, ...], kwargs: dict[str, Any], opts: RunOptions
    ) -> Steps[Created]:
        """Validate, then create one run (the sync client's enqueue)."""
        queue, spec = self._plan_enqueue(task, args, kwargs, opts)
        return (yield from self._enqueue_planned(queue, spec, opts.dedupe))

    def _plan_enqueue(
        self, task: TaskRef, args: tuple[Any, ...], kwargs: dict[str, Any], opts: RunOptions
    ) -> tuple[str, RunSpec]:
        """An enqueue validated whole, before anything is written: (queue, run)."""
        dedupe = opts.dedupe
        if dedupe is not None and opts.run_id is not None:
            raise ConfigError(
                "pass dedupe or run_id, not both: a deduplicated run's id comes from its key"
            )
        return self.prepare_args(
            task, args, kwargs, opts.run_id, opts.delay, opts.at, opts.queue,
            priority=opts.priority, dedupe_key=None if dedupe is None else dedupe.key,
            limit_key=opts.limit_key,
        )

    def _enqueue_planned(self, name: str, spec: RunSpec, dedupe: Dedupe | None) -> Steps[Created]:
        """Create a planned run (``_plan_enqueue``), its queue recorded first."""
        yield from self._register_queue(name)
        if dedupe is not None:
            keys = self.keys_for(name, spec.run_id)
            call = DEDUPE.call(keys, spec, dedupe.key, dedupe.mode, dedupe.ttl_ms)
            (reply,) = yield from self._run_calls([call], [spec.run_id])
            done = DEDUPE.parse(reply)
            return Created(done.run_id, name, done.outcome == "created", done.outcome)
        call = CREATE_RUN.call(self.keys_for(name, spec.run_id), (spec,))
        (reply,) = yield from self._run_calls([call], [spec.run_id])
        (created,) = CREATE_RUN.parse(reply)
        return Created(spec.run_id, name, created)

    def _enqueue_many(self, requests: Iterable[Request]) -> Steps[list[Created]]:
        """Validate all, then create all in one pipelined round trip (one script call per
        partition and chunk)."""
        prepared = [self.prepare(r) for r in requests]
        for queue in sorted({q for q, _ in prepared}):
            yield from self._register_queue(queue)
        planned = self.place(prepared)
        created = yield from self._create(planned)
        return [
            Created(p.spec.run_id, p.keys.queue, c) for p, c in zip(planned, created, strict=True)
        ]

    def _create(self, planned: list[Planned], now: int | None = None) -> Steps[list[bool]]:
        batches = create_batches(planned, now)
        calls = [call for call, _ in batches]
        replies = yield from self._run_calls(calls, [p.spec.run_id for p in planned])
        return created_flags(len(planned), batches, replies)

    def _create_in(self, queue: str, specs: list[RunSpec], now: int | None) -> Steps[list[bool]]:
        """Create runs planned outside enqueue (a recurring job's) in their queue."""
        if not specs:
            return []
        count = yield from self._register_queue(queue)
        planned = [
            Planned(self.partition_keys(queue, partition_of(s.run_id, count)), s) for s in specs
        ]
        return (yield from self._create(planned, now))

    # -- look-ups --------------------------------------------------------------------------

    def _search(
        self, run_id: str, queue: str | None
    ) -> Steps[tuple[PartitionKeys | None, list[Anomaly]]]:
        """The partition holding a run, and the queues that could not be searched."""
        table = yield from self._queue_table()
        keys = self.lookup_candidates(run_id, queue, table)
        skipped = [] if queue else table.anomalies
        if not keys:
            return None, skipped
        found = raised((yield commands(*(cmd("exists", k.run(run_id)) for k in keys))))
        return pick_located(run_id, [k for k, n in zip(keys, found, strict=True) if n]), skipped

    def _locate(self, run_id: str, queue: str | None) -> Steps[PartitionKeys | None]:
        return (yield from self._search(run_id, queue))[0]

    def _located(self, run_id: str, queue: str | None) -> Steps[PartitionKeys]:
        keys, skipped = yield from self._search(run_id, queue)
        if keys is None:
            raise not_found(run_id, queue, skipped)
        return keys

    def _read(self, keys: PartitionKeys, run_id: str) -> Steps[Run | None]:
        fields, history = yield commands(
            cmd("hgetall", keys.run(run_id)), cmd("lrange", keys.history(run_id), 0, -1)
        )
        return read_run(keys, run_id, fields, history)

    def _wait_keys(self, run_id: str, queue: str | None) -> Steps[PartitionKeys]:
        """Where a run to wait for lives: computed when this client registered its queue
        (its enqueue did), else looked up."""
        if queue is not None and queue in self._registered_queues:
            return self.keys_for(queue, run_id)
        return (yield from self._located(run_id, queue))

    def _find_run(self, run_id: str, queue: str | None) -> Steps[Run | None]:
        keys = yield from self._locate(run_id, queue)
        return None if keys is None else (yield from self._read(keys, run_id))

    def _get_run(self, run_id: str, queue: str | None) -> Steps[Run]:
        keys = yield from self._located(run_id, queue)
        run = yield from self._read(keys, run_id)
        if run is None:  # expired between the look-up and the read
            raise not_found(run_id, queue)
        return run

    def _run_states(self, run_ids: Iterable[str], queue: str | None) -> Steps[list[RunState]]:
        """Where each run lives and its state, the states read in one pipeline."""
        located: list[tuple[str, PartitionKeys | None]] = []
        for rid in run_ids:
            located.append((rid, (yield from self._locate(rid, queue))))
        present = [(rid, keys) for rid, keys in located if keys is not None]
        replies = (
            (yield commands(*(cmd("hget", keys.run(rid), "state") for rid, keys in present)))
            if present
            else []
        )
        found = iter(replies)

        def state_of(reply: Any) -> str:
            if is_wrong_type(reply):  # another program's key under the run's name
                return "not a run record"
            if isinstance(reply, Exception):
                raise reply
            return str(reply or "missing")

        return [
            RunState(rid, keys, "missing" if keys is None else state_of(next(found)))
            for rid, keys in located
        ]

    # -- steering --------------------------------------------------------------------------

    def _cancel(self, run_id: str, queue: str | None, reason: str) -> Steps[str]:
        keys = yield from self._located(run_id, queue)
        call = CANCEL.call(keys, run_id, self.settings.done_retention_ms, reason)
        (reply,) = yield Scripts([call])
        changed, state = CANCEL.parse(reply)
        if not changed:
            raise cancel_refused(run_id, state)
        return state

    def _purge_dead(self, run_ids: Iterable[str], queue: str | None) -> Steps[int]:
        groups: dict[PartitionKeys, list[str]] = {}
        for run_id in run_ids:
            keys = yield from self._locate(run_id, queue)
            if keys is not None:
                groups.setdefault(keys, []).append(run_id)
        calls = [PURGE.call(keys, members) for keys, members in groups.items()]
        replies = (yield Scripts(calls)) if calls else []
        return sum(PURGE.parse(reply)[0] for reply in replies)

    def _requeue(self, run_id: str, queue: str | None, force: bool = False) -> Steps[str]:
        keys = yield from self._located(run_id, queue)
        (reply,) = yield Scripts([REQUEUE.call(keys, run_id, force)])
        changed, state = REQUEUE.parse(reply)
        if not changed and state == "done":
            # A done run requeued runs a second time: never by accident (a repeated command).
            raise OperationRefused(
                f"run {run_id} is done; requeueing it runs it again: pass force=True (--force)"
            )
        if not changed and state == "workflow-step":
            raise OperationRefused(
                f"run {run_id} is a workflow step that waited on other runs, and its arguments "
                "came from them: it does not requeue alone (create its workflow again)"
            )
        if not changed:
            raise OperationRefused(f"run {run_id} is {state}; only finished runs requeue")
        return state

    def _requeue_located(
        self, runs: list[tuple[str, PartitionKeys]]
    ) -> Steps[list[tuple[bool, str]]]:
        """Requeue runs already located, in one round trip: (changed, previous state) each."""
        if not runs:
            return []
        replies = yield Scripts([REQUEUE.call(keys, rid) for rid, keys in runs])
        return [REQUEUE.parse(reply) for reply in replies]

    # -- recurring jobs --------------------------------------------------------------------

    def _schedule(
        self,
        job_id: str,
        task: TaskRef,
        *,
        cron: str | None,
        every: float | None,
        tz: str,
        args: Iterable[Any],
        kwargs: dict[str, Any] | None,
        misfire: str,
        jitter: float | None,
        overlap: str,
        queue: str | None,
        start_at: Instant | None,
        end_at: Instant | None,
        max_attempts: int | None,
        now: int | None,
    ) -> Steps[ScheduleInfo]:
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
        return (yield from self.recurring.schedule_steps(defn, now))

    def _trigger(self, job_id: str, now: int | None) -> Steps[Created]:
        """Run the job now, outside its schedule, with its own run id
        ``<job_id>@manual-<now>``; the schedule is untouched."""
        defn = (yield from self.recurring.require_steps(job_id)).definition
        t = yield from server_time_steps(now)
        spec = trigger_spec(defn, t, self.settings.max_payload_bytes)
        (created,) = yield from self._create_in(defn.queue, [spec], now)
        return Created(spec.run_id, defn.queue, created)

    def _backfill(
        self, job_id: str, start: Instant, end: Instant, now: int | None
    ) -> Steps[list[Created]]:
        """Create the runs of every fire time in [start, end], due at once (see
        ``backfill_specs``: never past the server's now)."""
        defn = (yield from self.recurring.require_steps(job_id)).definition
        t = yield from server_time_steps(now)
        specs = backfill_specs(defn, start, end, t, self.settings.max_payload_bytes)
        created = yield from self._create_in(defn.queue, specs, now)
        return [Created(s.run_id, defn.queue, c) for s, c in zip(specs, created, strict=True)]

    def _list_schedules(self, limit: int | None) -> Steps[Listing[ScheduleInfo]]:
        """Every recurring job (paged, see ``RecurringSteps.list_steps``); what cannot be
        listed is logged, once per call, and kept in the listing's anomalies."""
        listing = yield from self.recurring.list_steps(limit)
        for anomaly in listing.anomalies:
            log.warning("recurring jobs: anomaly: %s", anomaly)
        for info in listing:
            for anomaly in info.anomalies:
                log.warning("recurring job %s: anomaly: %s", info.job_id, anomaly)
        return listing
