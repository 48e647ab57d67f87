"""What the sync and asyncio clients share: task registration (``TaskRegistration``, its base
class, in jobqueue.client.registration) and turning an enqueue request into RunSpecs grouped
by partition. No I/O here."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, ParamSpec, TypeVar

from jobqueue.anomalies import Anomaly, checked, is_wrong_type
from jobqueue.client.registration import (
    TaskRef,
    TaskRegistration,
    check_args_sequence,
)
from jobqueue.errors import (
    ConfigError,
    CorruptData,
    InvalidRunId,
    OperationRefused,
    RunNotFound,
)
from jobqueue.hooks import EnqueueRequest, MetaError, encode_meta
from jobqueue.models import PRIORITY_MAX, Run
from jobqueue.payload import encode_payload
from jobqueue.policy.timeutil import Delay, Instant, delay_to_ms, instant_to_ms
from jobqueue.settings import Settings
from jobqueue.store.keys import (
    QUEUES_KEY,
    PartitionKeys,
    bad_count,
    parse_placement,
    partition_of,
    placement_record,
    queue_partition,
    validate_partition_count,
    validate_queue_name,
    validate_run_id,
)
from jobqueue.store.runs import CREATE_RUN, RunSpec
from jobqueue.store.scripts import Call
from jobqueue.tasks import (
    RunOptions,
    Task,
)

P = ParamSpec("P")
R = TypeVar("R")


# The latest due time a run may have: 9000-01-01T00:00:00Z. Later instants are typing
# mistakes (and 9999-12-31 is the sentinel due time of buffer-one's buffered runs).
MAX_DUE_MS = 221845392000000
# The longest delay: one that cannot pass MAX_DUE_MS from any plausible present (before 2100).
# A bound, not a decision: Redis adds the delay to its own clock.
MAX_DELAY_MS = MAX_DUE_MS - 4102444800000


def dedupe_run_id(key: str) -> str:
    """A new run id under a deduplication key (its partition is the key's)."""
    try:
        return validate_run_id(f"{key}@{os.urandom(16).hex()}")
    except InvalidRunId as exc:
        raise InvalidRunId(f"dedupe key {key[:80]!r}: {exc}") from None


def check_priority(priority: object) -> int:
    """A run's priority: a whole number 0 (the default) .. PRIORITY_MAX."""
    if (
        isinstance(priority, bool)
        or not isinstance(priority, int)
        or not 0 <= priority <= PRIORITY_MAX
    ):
        raise ConfigError(
            f"priority must be an integer from 0 to {PRIORITY_MAX}, not {priority!r}"
        )
    return priority


MAX_LIMIT_KEY_LENGTH = 256


def check_limit_key(limit_key: object) -> str:
    """A run's limit_key (per-key caps and rates): non-empty text, at most
    MAX_LIMIT_KEY_LENGTH characters, no control characters (it names Redis keys)."""
    if not isinstance(limit_key, str) or not limit_key:
        raise ConfigError(f"limit_key must be a non-empty string, not {limit_key!r}")
    if len(limit_key) > MAX_LIMIT_KEY_LENGTH:
        raise ConfigError(
            f"limit_key is {len(limit_key)} characters; the limit is {MAX_LIMIT_KEY_LENGTH}"
        )
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in limit_key):
        raise ConfigError(f"limit_key {limit_key!r} contains control characters")
    try:
        limit_key.encode()
    except UnicodeEncodeError:
        raise ConfigError(f"limit_key {limit_key!r} is not valid Unicode text") from None
    return limit_key


def check_due(at_ms: int | None, delay_ms: int) -> None:
    """Refuse due times past year 9000, for every way of planning a run."""
    if at_ms is not None and at_ms >= MAX_DUE_MS:
        raise ConfigError("at is beyond year 9000: give a due time before 9000-01-01")
    if delay_ms > MAX_DELAY_MS:
        raise ConfigError(f"delay of {delay_ms / 1000:.3g} s puts the run beyond year 9000")


# Runs per create_run call (the scheduler has its own chunk for sched_create): large enough
# to amortise the round trip, small enough that one script never blocks the server for long.
CREATE_RUN_CHUNK = 500


@dataclass(frozen=True)
class Request:
    """One run to enqueue, for ``enqueue_many``."""

    task: TaskRef
    args: tuple[Any, ...] | list[Any] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    run_id: str | None = None
    delay: Delay | None = None
    at: Instant | None = None
    queue: str | None = None
    # str -> str carried with the run (stored, ctx.meta); the enqueue hooks may add to it
    meta: dict[str, str] = field(default_factory=dict)
    priority: int | None = None  # 0 (the default) .. 9: higher is claimed first when due
    limit_key: str | None = None  # the key of the queue's per-key limits (check_limit_key)


class Planned(NamedTuple):
    """A validated run and where it goes (a tuple: one per enqueued run)."""

    keys: PartitionKeys
    spec: RunSpec


class ClientBase(TaskRegistration):
    def __init__(
        self,
        *,
        settings: Settings | None = None,
        partitions: dict[str, int] | None = None,
        tasks: ClientBase | None = None,
    ) -> None:
        """``tasks``: another client (the app's JobQueue) whose registered tasks this one
        shares, so that an AsyncJobQueue enqueues the app's tasks by function or name."""
        super().__init__(settings=settings, tasks=tasks)
        self._keys: dict[tuple[str, int], PartitionKeys] = {}
        self._valid_queues: set[str] = set()
        self._partitions: dict[str, int] = {}
        # Queues recorded with the spread placement (see jobqueue.store.keys: Placement).
        self._spread: dict[str, bool] = {}
        for queue, count in (partitions or {}).items():
            validate_partition_count(count, f"queue {queue!r}")
            self._partitions[validate_queue_name(queue)] = count

    def partitions_of(self, queue: str) -> int:
        return self._partitions.get(queue, 1)

    def spread_of(self, queue: str) -> bool:
        """Whether the queue's partitions use the spread placement, as recorded in Redis."""
        return self._spread.get(queue, False)

    def partition_keys(self, queue: str, partition: int) -> PartitionKeys:
        """One shared instance per partition: its key names are built once."""
        keys = self._keys.get((queue, partition))
        if keys is None:
            keys = self._keys[(queue, partition)] = queue_partition(
                queue, partition, self.partitions_of(queue), self.spread_of(queue)
            )
        return keys

    def keys_for(self, queue: str, run_id: str) -> PartitionKeys:
        return self.partition_keys(queue, partition_of(run_id, self.partitions_of(queue)))

    def all_partition_keys(self, queue: str) -> list[PartitionKeys]:
        return [self.partition_keys(queue, p) for p in range(self.partitions_of(queue))]

    # -- planning --------------------------------------------------------------------------

    def prepare(self, req: Request) -> tuple[str, RunSpec]:
        """Validate one request completely before anything is written: (queue, run). The
        Request's options win over those of a task given ``with_options``."""
        task = req.task if isinstance(req.task, Task) else self.resolve_task(req.task)
        if task.run_options is not None and task.run_options.dedupe is not None:
            raise ConfigError("dedupe is for enqueue (one run per call), not enqueue_many")
        opts = (task.run_options or RunOptions()).merged(
            run_id=req.run_id, delay=req.delay, at=req.at, queue=req.queue,
            priority=req.priority, limit_key=req.limit_key,
        )
        return self.prepare_args(
            task, req.args, req.kwargs, opts.run_id, opts.delay, opts.at, opts.queue, req.meta,
            priority=opts.priority, limit_key=opts.limit_key,
        )

    def prepare_args(
        self,
        ref: TaskRef,
        args: tuple[Any, ...] | list[Any],
        kwargs: dict[str, Any],
        run_id: str | None,
        delay: Delay | None,
        at: Instant | None,
        queue: str | None,
        meta: dict[str, str] | None = None,
        *,
        priority: int | None = None,
        dedupe_key: str | None = None,
        limit_key: str | None = None,
    ) -> tuple[str, RunSpec]:
        """``prepare`` without building a Request first (enqueue's path: a run per call).
        With ``dedupe_key`` the run id is ``<key>@<random>``: the key decides the partition,
        as a job id does for its runs, so the key and every run of it share one slot."""
        if dedupe_key is not None:
            run_id = dedupe_run_id(dedupe_key)
        task = ref if isinstance(ref, Task) else self.resolve_task(ref)
        if delay is not None and at is not None:
            raise ConfigError("pass delay or at, not both")
        check_args_sequence(args)
        task.check_arguments(args, kwargs, for_run=True)
        at_ms = None if at is None else instant_to_ms(at)
        delay_ms = 0 if delay is None else delay_to_ms(delay)
        check_due(at_ms, delay_ms)
        name = task.options.queue if queue is None else queue  # "" is refused, not defaulted
        if name not in self._valid_queues:
            self._valid_queues.add(validate_queue_name(name))
        payload = encode_payload(args, dict(kwargs), self.settings.max_payload_bytes)
        options = task.options
        spec = RunSpec(
            # 128 random bits, like uuid4().hex, for a fraction of its cost.
            validate_run_id(run_id) if run_id is not None else os.urandom(16).hex(),
            task.name,
            payload,
            at_ms,
            delay_ms,
            options.max_attempts,
            options.lease_ms,
            options.timeout_ms,
        )
        if meta is not None and not isinstance(meta, Mapping):
            raise MetaError(f"meta must be a mapping of str to str, got {type(meta).__name__}")
        if priority is not None:
            spec.priority = check_priority(priority)
        if limit_key is not None:
            spec.limit_key = check_limit_key(limit_key)
        if self.hooks:
            request = EnqueueRequest(spec.task, name, spec.run_id, args, kwargs, dict(meta or {}))
            self.hooks.before_enqueue(request)
            spec.meta = encode_meta(request.meta)
        elif meta:
            spec.meta = encode_meta(meta)
        return name, spec

    def place(self, prepared: list[tuple[str, RunSpec]]) -> list[Planned]:
        """Partition keys for prepared runs (the queues' partition counts must be known)."""
        return [Planned(self.keys_for(q, spec.run_id), spec) for q, spec in prepared]


    def registration(self, queue: str) -> str:
        """What a first registration records for ``queue``: its configured count (1 unless
        ``partitions=`` says otherwise), with the spread placement."""
        return placement_record(self._partitions.get(queue, 1), True)

    def adopt_partition_count(self, queue: str, reply: Any) -> int:
        """Check the partition count recorded in Redis (``reply``: HGET's, or a count already
        read, e.g. from :meth:`queues`; see :meth:`QueueTable.record`) against ours, then use
        it with its placement. A count jobqueue cannot have written is refused (CorruptData):
        iterating 99999999 partitions would hang the process, and a guess would lose runs."""
        if is_wrong_type(reply):
            raise CorruptData(f"{QUEUES_KEY} is not a hash: cannot register queue {queue!r}")
        if isinstance(reply, Exception):
            raise reply
        if type(reply) is int:
            reply = str(reply)  # checked like the text it was read as
        placed = parse_placement(reply)
        if placed is None:
            raise CorruptData(
                f"{QUEUES_KEY} field {queue!r}: {bad_count(reply)}; set it right "
                f"(HSET {QUEUES_KEY} {queue} <count>) before using the queue"
            )
        stored, spread = placed
        wanted = self._partitions.get(queue)
        if wanted is not None and wanted != stored:
            raise ConfigError(
                f"queue {queue!r} has {stored} partitions in Redis but {wanted} are "
                f"configured here; changing the partition count needs a migration: "
                f"`jobqueue repartition {queue} --partitions {wanted}` (see its --help)"
            )
        if (self._partitions.get(queue), self.spread_of(queue)) != (stored, spread):
            # Keys built before the count and placement were known are built again.
            self._keys = {k: v for k, v in self._keys.items() if k[0] != queue}
        self._partitions[queue] = stored
        self._spread[queue] = spread
        return stored

    def lookup_candidates(
        self, run_id: str, queue: str | None, table: QueueTable
    ) -> list[PartitionKeys]:
        """Where a run may live: its partition in ``queue``, else in every known queue, with
        partition counts as recorded in Redis (a client need not configure them). A queue
        whose record is unusable is not searched; named explicitly, it is CorruptData."""
        validate_run_id(run_id)
        if queue is not None:
            # A malformed name is bad input (exit 2), as in enqueue: never "not found".
            validate_queue_name(queue)
            if queue in table.unusable:
                raise CorruptData(f"cannot look in queue {queue!r}: {table.unusable[queue]}")
            names = [queue]
        else:
            names = sorted((set(table.counts) | set(self._partitions)) - set(table.unusable))
        out = []
        for q in names:
            count = self._partitions.get(q) or table.counts.get(q, 1)
            spread = self._spread.get(q, q in table.spread)
            out.append(queue_partition(q, partition_of(run_id, count), count, spread))
        return out


@dataclass(frozen=True)
class QueueTable:
    """``jq:queues`` as read: the queues every command can use, with their partition counts,
    and the entries none can (by queue name), each with the reason."""

    counts: dict[str, int]
    unusable: dict[str, Anomaly]
    anomalies: list[Anomaly]  # the unusable entries, and jq:queues itself if not a hash
    readable: bool = True  # False: jq:queues is not a hash, so no queue is known at all
    spread: frozenset[str] = frozenset()  # the queues recorded with the spread placement

    def record(self, queue: str) -> str:
        """The queue's entry as jobqueue writes it (what ``adopt_partition_count`` takes)."""
        return placement_record(self.counts[queue], queue in self.spread)

    def partitions(self, queue: str) -> list[PartitionKeys]:
        """Every partition of a usable queue, with its placement."""
        count, spread = self.counts[queue], queue in self.spread
        return [queue_partition(queue, p, count, spread) for p in range(count)]


def queue_table(reply: Any) -> QueueTable:
    """Parse an HGETALL reply of ``jq:queues`` (or its WRONGTYPE error): a name no command
    can address, or a count that is not an integer from 1 to MAX_PARTITIONS, is an anomaly
    and its queue is left out, so no listing ever iterates a count of 99999999."""
    if is_wrong_type(reply):
        whole = Anomaly(QUEUES_KEY, "not a hash: no queue can be read")
        return QueueTable({}, {}, [whole], readable=False)
    if isinstance(reply, Exception):
        raise reply
    counts: dict[str, int] = {}
    spread: set[str] = set()
    unusable: dict[str, Anomaly] = {}
    for name, stored in sorted(reply.items()):
        placed = parse_placement(stored)
        try:
            validate_queue_name(name)
        except ConfigError:
            unusable[name] = Anomaly(QUEUES_KEY, f"field {name!r} is not a valid queue name")
            continue
        if placed is None:
            unusable[name] = Anomaly(QUEUES_KEY, f"field {name!r}: {bad_count(stored)}")
        else:
            counts[name] = placed[0]
            if placed[1]:
                spread.add(name)
    return QueueTable(counts, unusable, list(unusable.values()), spread=frozenset(spread))


# The anomaly of a key of another type under a run's name.
NOT_A_RECORD = "holds another type, not a hash (not a run record)"


def not_a_record(reply: Any, state: str = "unknown") -> Any:
    """A run record as read (HGETALL), or for a key of another type (WRONGTYPE) a stand-in
    record saying so; any other error reply is raised."""
    if not isinstance(reply, Exception):
        return reply
    if "WRONGTYPE" not in str(reply):
        raise reply
    return {"state": state, "error": f"not a run record: {reply}"[:300]}


def read_run(keys: PartitionKeys, run_id: str, fields: Any, history: Any) -> Run | None:
    """A run from its pipelined HGETALL and LRANGE replies (``raise_on_error=False``), or None
    when there is no record. A key of another type under a run's name (claim.lua dead-letters
    those) is shown for what it is, as an anomaly, rather than failing ``show``; any other
    error reply is raised."""
    anomalies: list[Anomaly] = []
    if is_wrong_type(fields):
        anomalies.append(Anomaly(keys.run(run_id), NOT_A_RECORD))
    fields = not_a_record(fields)
    history = checked(history, keys.history(run_id), "list", anomalies, [])
    if not fields:
        return None
    return Run.from_hash(
        run_id,
        keys.partition,
        fields,
        history,
        keys.queue,
        tuple(anomalies),
        key=keys.run(run_id),
    )


def pick_located(run_id: str, found: list[PartitionKeys]) -> PartitionKeys | None:
    """The one partition a run id was found in. The same id in several queues (each queue
    has its own runs) is ambiguous without a queue: refused, never one picked silently."""
    if len(found) > 1:
        queues = ", ".join(k.queue for k in found)
        raise OperationRefused(
            f"run id {run_id!r} exists in several queues ({queues}): name the queue (--queue)"
        )
    return found[0] if found else None


def create_batches(planned: list[Planned], now: int | None = None) -> list[tuple[Call, list[int]]]:
    """One create_run call per partition and chunk, with the indexes of the runs it carries."""
    groups: dict[PartitionKeys, list[int]] = {}
    for i, p in enumerate(planned):
        groups.setdefault(p.keys, []).append(i)
    batches = []
    for keys, indexes in groups.items():
        for start in range(0, len(indexes), CREATE_RUN_CHUNK):
            chunk = indexes[start : start + CREATE_RUN_CHUNK]
            batches.append((CREATE_RUN.call(keys, [planned[i].spec for i in chunk], now), chunk))
    return batches


def created_flags(
    count: int, batches: list[tuple[Call, list[int]]], replies: list[Any]
) -> list[bool]:
    created = [False] * count
    for (_, chunk), reply in zip(batches, replies, strict=True):
        for i, flag in zip(chunk, CREATE_RUN.parse(reply), strict=True):
            created[i] = flag
    return created


def cancel_refused(run_id: str, state: str) -> OperationRefused:
    return OperationRefused(f"run {run_id} is {state}; only pending or running runs cancel")


def not_found(run_id: str, queue: str | None, skipped: list[Anomaly] | None = None) -> RunNotFound:
    """``skipped``: queues that could not be searched (their record is unusable), named so
    that "not found" is not taken for "never created"."""
    where = f"queue {queue!r}" if queue else "any queue"
    note = ""
    if skipped:
        shown = "; ".join(str(a) for a in skipped[:3]) + ("; ..." if len(skipped) > 3 else "")
        note = f"; not searched: {shown}"
    return RunNotFound(f"no run {run_id!r} in {where} (never created, or expired){note}")
