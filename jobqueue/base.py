"""What the sync and asyncio clients share: task registration and turning an enqueue request
into RunSpecs grouped by partition. No I/O here."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, overload

from . import ops
from .errors import ConfigError, OperationRefused, RunNotFound, UnknownTask
from .keys import PartitionKeys, partition_of, validate_queue_name, validate_run_id
from .ops import RunSpec
from .payload import encode_payload
from .scripts import Call
from .settings import Settings
from .tasks import Registry, Task, make_options
from .timeutil import Delay, Instant, delay_to_ms, instant_to_ms

F = TypeVar("F", bound=Callable[..., Any])

TaskRef = Task[Any, Any] | Callable[..., Any] | str

# Runs per create_run call: large enough to amortise the round trip, small enough that one
# script never blocks the server for long.
CREATE_CHUNK = 500


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


@dataclass(frozen=True)
class Planned:
    """A validated run and where it goes."""

    keys: PartitionKeys
    spec: RunSpec


class ClientBase:
    def __init__(
        self,
        *,
        settings: Settings | None = None,
        partitions: dict[str, int] | None = None,
    ) -> None:
        self.settings = settings or Settings()
        self.registry = Registry()
        self._partitions: dict[str, int] = {}
        for queue, count in (partitions or {}).items():
            if not isinstance(count, int) or count < 1:
                raise ConfigError(f"queue {queue!r}: partitions must be an integer >= 1")
            self._partitions[validate_queue_name(queue)] = count

    # -- tasks -----------------------------------------------------------------------------

    @overload
    def task(self, func: F, /) -> Task[Any, Any]: ...

    @overload
    def task(
        self,
        *,
        name: str | None = None,
        queue: str | None = None,
        max_attempts: int | None = None,
        timeout: float | None = None,
        lease: float | None = None,
        backoff: float | None = None,
        backoff_cap: float | None = None,
    ) -> Callable[[F], Task[Any, Any]]: ...

    def task(  # type: ignore[misc]  # mypy cannot match a positional-only optional
        self,
        func: Callable[..., Any] | None = None,
        /,
        *,
        name: str | None = None,
        queue: str | None = None,
        max_attempts: int | None = None,
        timeout: float | None = None,
        lease: float | None = None,
        backoff: float | None = None,
        backoff_cap: float | None = None,
    ) -> Any:
        """Register a function as a task: ``@jq.task`` or ``@jq.task(name=..., queue=...)``."""

        def register(f: Callable[..., Any]) -> Task[Any, Any]:
            return self._register(
                name or f.__name__, f, queue, max_attempts, timeout, lease, backoff, backoff_cap
            )

        return register(func) if func is not None else register

    def declare_task(
        self,
        name: str,
        *,
        queue: str | None = None,
        max_attempts: int | None = None,
        timeout: float | None = None,
        lease: float | None = None,
    ) -> Task[Any, Any]:
        """Make a task known by name where its code is not importable (an app that only
        enqueues, workers elsewhere)."""
        return self._register(name, None, queue, max_attempts, timeout, lease, None, None)

    def _register(
        self,
        name: str,
        func: Callable[..., Any] | None,
        queue: str | None,
        max_attempts: int | None,
        timeout: float | None,
        lease: float | None,
        backoff: float | None,
        backoff_cap: float | None,
    ) -> Task[Any, Any]:
        options = make_options(
            queue=queue or self.settings.default_queue,
            max_attempts=self.settings.default_max_attempts
            if max_attempts is None
            else max_attempts,
            timeout=timeout,
            lease=lease,
            backoff_base=backoff,
            backoff_cap=backoff_cap,
        )
        task: Task[Any, Any] = Task(name=name, options=options, func=func, enqueuer=self)
        self.registry.add(task)
        return task

    def resolve_task(self, ref: TaskRef) -> Task[Any, Any]:
        if isinstance(ref, Task):
            return ref
        if isinstance(ref, str):
            return self.registry.get(ref)
        name = getattr(ref, "__name__", None)
        if isinstance(name, str) and name in self.registry and self.registry.get(name).func is ref:
            return self.registry.get(name)
        raise UnknownTask(f"{ref!r} is not a registered task: decorate it with @jq.task")

    # -- partitions ------------------------------------------------------------------------

    def partitions_of(self, queue: str) -> int:
        return self._partitions.get(queue, 1)

    def keys_for(self, queue: str, run_id: str) -> PartitionKeys:
        return PartitionKeys(queue, partition_of(run_id, self.partitions_of(queue)))

    def all_partition_keys(self, queue: str) -> list[PartitionKeys]:
        return [PartitionKeys(queue, p) for p in range(self.partitions_of(queue))]

    # -- planning --------------------------------------------------------------------------

    def prepare(self, req: Request) -> tuple[str, RunSpec]:
        """Validate one request completely before anything is written: (queue, run)."""
        task = self.resolve_task(req.task)
        if req.delay is not None and req.at is not None:
            raise ConfigError("pass delay or at, not both")
        queue = validate_queue_name(req.queue or task.options.queue)
        run_id = validate_run_id(req.run_id) if req.run_id is not None else uuid.uuid4().hex
        payload = encode_payload(req.args, dict(req.kwargs), self.settings.max_payload_bytes)
        spec = RunSpec(
            run_id=run_id,
            task=task.name,
            payload=payload,
            due_at_ms=None if req.at is None else instant_to_ms(req.at),
            delay_ms=delay_to_ms(req.delay),
            max_attempts=task.options.max_attempts,
            lease_ms=task.options.lease_ms,
            timeout_ms=task.options.timeout_ms,
        )
        return queue, spec

    def place(self, prepared: list[tuple[str, RunSpec]]) -> list[Planned]:
        """Partition keys for prepared runs (the queues' partition counts must be known)."""
        return [Planned(self.keys_for(q, spec.run_id), spec) for q, spec in prepared]

    def adopt_partition_count(self, queue: str, stored: int) -> int:
        """Check the partition count recorded in Redis against ours, then use it."""
        wanted = self._partitions.get(queue)
        if wanted is not None and wanted != stored:
            raise ConfigError(
                f"queue {queue!r} has {stored} partitions in Redis but {wanted} are "
                "configured here; changing the partition count needs a migration"
            )
        self._partitions[queue] = stored
        return stored

    def lookup_candidates(
        self, run_id: str, queue: str | None, recorded: dict[str, int]
    ) -> list[PartitionKeys]:
        """Where a run may live: its partition in ``queue``, else in every known queue, with
        partition counts as recorded in Redis (a client need not configure them)."""
        validate_run_id(run_id)
        names = [queue] if queue else sorted(set(recorded) | set(self._partitions))
        return [
            PartitionKeys(q, partition_of(run_id, self._partitions.get(q) or recorded.get(q, 1)))
            for q in names
        ]


def create_batches(planned: list[Planned], now: int | None = None) -> list[tuple[Call, list[int]]]:
    """One create_run call per partition and chunk, with the indexes of the runs it carries."""
    groups: dict[PartitionKeys, list[int]] = {}
    for i, p in enumerate(planned):
        groups.setdefault(p.keys, []).append(i)
    batches = []
    for keys, indexes in groups.items():
        for start in range(0, len(indexes), CREATE_CHUNK):
            chunk = indexes[start : start + CREATE_CHUNK]
            batches.append((ops.create_call(keys, [planned[i].spec for i in chunk], now), chunk))
    return batches


def created_flags(
    count: int, batches: list[tuple[Call, list[int]]], replies: list[Any]
) -> list[bool]:
    created = [False] * count
    for (_, chunk), reply in zip(batches, replies, strict=True):
        for i, flag in zip(chunk, ops.parse_create(reply), strict=True):
            created[i] = flag
    return created


def cancel_refused(run_id: str, state: str) -> OperationRefused:
    return OperationRefused(f"run {run_id} is {state}; only pending or running runs cancel")


def not_found(run_id: str, queue: str | None) -> RunNotFound:
    where = f"queue {queue!r}" if queue else "any queue"
    return RunNotFound(f"no run {run_id!r} in {where} (never created, or expired)")
