"""The app-facing client: register tasks, enqueue runs (idempotent by run id), look runs up.
Every operation is ``jobqueue.client.core``'s, driven here on a sync connection."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ParamSpec, TypeVar, overload

import redis.cluster

from jobqueue.anomalies import Listing
from jobqueue.client.base import ClientBase, QueueTable, Request, not_found
from jobqueue.client.core import ClientCore, Created, RunState
from jobqueue.client.events import (
    EventSettings,
    EventStream,
    Reader,
    Since,
    check_event_settings,
    check_kinds,
    event_settings_steps,
    partitions_steps,
    queue_list,
    reader_steps,
    recent_of_steps,
    set_events_steps,
)
from jobqueue.client.flows import create_flow, dependencies_steps
from jobqueue.client.groups import read_fair, read_groups, set_groups
from jobqueue.client.registration import TaskRef
from jobqueue.client.relay import purge_dead_steps, relay_until_quiet
from jobqueue.client.waits import RETRY_FIRST_S, RETRY_MAX_S, SyncWaits, retriable
from jobqueue.errors import ConfigError, JobQueueError
from jobqueue.handles import DEFAULT_POLL_S, FlowHandle, RunHandle, timed_out
from jobqueue.models import DependencyState, QueueLimits, Run
from jobqueue.policy.timeutil import Instant
from jobqueue.recurring.definitions import DEFAULT_MISFIRE, DEFAULT_OVERLAP, DEFAULT_TZ
from jobqueue.recurring.info import ScheduleInfo
from jobqueue.recurring.sync import Recurring
from jobqueue.settings import Settings
from jobqueue.store.connection import check, redact, sync_client
from jobqueue.store.embedded import configured_url, resolve_url
from jobqueue.store.events import Event
from jobqueue.store.groups import GroupInfo
from jobqueue.store.io import Steps, run_steps, server_time_steps
from jobqueue.store.keys import PartitionKeys
from jobqueue.store.scripts import ScriptRunner
from jobqueue.tasks import Task
from jobqueue.workflows.canvas import (
    Graph,
    Signature,
    batch_graph,
    chain_graph,
    chord_graph,
    group_graph,
    workflow_graph,
)

T = TypeVar("T")
log = logging.getLogger("jobqueue.client")

P = ParamSpec("P")
R = TypeVar("R")


class JobQueue(ClientCore):
    """``JobQueue.from_url(url)`` or ``JobQueue(redis_client)``."""

    recurring: Recurring

    def __init__(
        self,
        client: Any = None,
        *,
        settings: Settings | None = None,
        partitions: dict[str, int] | None = None,
        url: str | None = None,
        tasks: ClientBase | None = None,
    ) -> None:
        """With a client, use it; else connect lazily, at first use, to ``url`` (else
        $JOBQUEUE_REDIS_URL, else an embedded server). Lazy, so that an app module can create
        its JobQueue at import time and a worker or CLI can still point it elsewhere."""
        super().__init__(settings=settings, partitions=partitions, tasks=tasks)
        if url is not None:
            configured_url(url)  # an empty URL is refused now, not at first use
        self._client = client
        self._scripts = ScriptRunner(client) if client is not None else None
        self.url = url
        self._connect_lock = threading.Lock()
        self._waits: SyncWaits | None = None
        self.recurring = Recurring(self)  # the definitions store, on this connection

    @classmethod
    def from_url(
        cls,
        url: str | None = None,
        *,
        settings: Settings | None = None,
        partitions: dict[str, int] | None = None,
        tasks: ClientBase | None = None,
    ) -> JobQueue:
        """A JobQueue for ``url`` (redis://, rediss://, unix://, redis+cluster://); with no
        URL, $JOBQUEUE_REDIS_URL, else a private embedded server. Connects at first use.
        ``tasks``: a client whose registered tasks this one shares."""
        return cls(settings=settings, partitions=partitions, url=url, tasks=tasks)

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
            try:
                check(client, resolved)
            except BaseException:
                client.close()  # its pool's sockets; a caller may try again (the daemons do)
                raise
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
        if self._waits is not None:
            self._waits.close()
        if self._client is not None:
            self._client.close()

    def __repr__(self) -> str:
        if self.url:
            return f"JobQueue({redact(self.url)})"
        # A client given directly (JobQueue(redis_client)), or one not yet connected.
        if self._client is not None:
            return f"JobQueue(a {type(self._client).__name__} client)"
        return "JobQueue(not connected)"

    def run_steps(self, steps: Steps[T]) -> T:
        """Drive I/O-free steps (``jobqueue.store.io``) on this client's connection."""
        return run_steps(steps, self.redis, self.scripts)

    # -- queues ----------------------------------------------------------------------------

    def register_queue(self, queue: str) -> int:
        """Record the queue and its partition count in Redis once; a process that disagrees
        with the recorded count is refused (runs would be looked for in the wrong slots)."""
        return self.run_steps(self._register_queue(queue))

    def queues(self) -> dict[str, int]:
        """Every usable queue recorded in Redis, with its partition count (entries that are
        not usable are left out: see :meth:`queue_table`)."""
        return self.run_steps(self._queues())

    def queue_table(self) -> QueueTable:
        """``jq:queues`` as read, with the entries no command can use as anomalies."""
        return self.run_steps(self._queue_table())

    def pause_queue(self, queue: str) -> bool:
        """Stop claims from ``queue`` on every partition: workers take none of its runs (not
        even those whose lease expires) until :meth:`resume_queue`; enqueues, heartbeats and
        commits go on. True when this call paused it, False when it already was paused."""
        return self.run_steps(self._pause(queue, True))

    def resume_queue(self, queue: str) -> bool:
        """Let workers claim from ``queue`` again; idle workers are woken at once. True when
        this call resumed it, False when it was not paused."""
        return self.run_steps(self._pause(queue, False))

    def set_queue_concurrency(
        self,
        queue: str,
        limit: int | None,
        *,
        per_key: bool = False,
        task: str | None = None,
        exact: bool = False,
    ) -> bool:
        """At most ``limit`` runs of ``queue`` running at once in each of its partitions
        (exact for a queue of one partition, the default), enforced by the claim script: a
        slot is held from the claim until the commit, the cancel or the lease's expiry.
        With ``per_key=True``: at most ``limit`` runs of each limit_key at once (up to
        10,000); with ``task="name"``: at most ``limit`` runs of that task at once (up to
        10,000); a run held back waits, parked, without holding up the rest of the queue.
        ``None`` removes the limit. True when this call changed it.

        With ``exact=True``: at most ``limit`` runs of the whole queue at once across all
        its partitions and masters, through permits leased from the limit's own slot
        (docs/concepts.md#exact-limits); it adds a permit round trip to each claim and
        commit of the queue, and workers see a new exact limit within 5 s."""
        return self.run_steps(self._set_concurrency(queue, limit, per_key, task, exact))

    # -- fair shares between groups ------------------------------------------------------

    def set_fair_shares(self, queue: str, on: bool = True) -> bool:
        """Turn fair shares on (or off) for ``queue``: claims then serve its groups (a run's
        group is its limit_key; runs without one form the group '') in weighted turns,
        priority first within a group (docs/concepts.md#groups-and-fair-shares). True when
        this call changed it."""
        return self.run_steps(set_groups(self, queue, fair=on))

    def set_group(
        self, queue: str, group: str, *, weight: int | None = None, max_size: int | None = None
    ) -> bool:
        """A group's ``weight`` (1 to 1,000, default 1: its share of claims against the
        other groups with due runs) and ``max_size`` (the most runs waiting in it: an enqueue
        past it raises GroupFull; 0 removes the limit); None leaves a setting as it is. True
        when this call changed one."""
        return self.run_steps(
            set_groups(self, queue, group=group, weight=weight, max_size=max_size)
        )

    def pause_group(self, queue: str, group: str) -> bool:
        """Stop claims of ``group``'s runs (enqueues go on; its runs wait in line). True
        when this call paused it."""
        return self.run_steps(set_groups(self, queue, group=group, paused=True))

    def resume_group(self, queue: str, group: str) -> bool:
        """Claims of ``group``'s runs go on. True when this call resumed it."""
        return self.run_steps(set_groups(self, queue, group=group, paused=False))

    def groups(self, queue: str) -> Listing[GroupInfo]:
        """The groups of ``queue`` (with settings, runs in line or runs served), summed over
        its partitions: weight, max_size, paused, waiting, running and served. Foreign data
        met is in the listing's ``anomalies`` and its rows'."""
        return self.run_steps(read_groups(self, queue))[1]

    def fair_shares(self, queue: str) -> bool:
        """Whether fair shares are on for ``queue``."""
        return self.run_steps(read_fair(self, queue))[0]

    def set_queue_rate(
        self,
        queue: str,
        limit: int | None,
        per: float = 1.0,
        *,
        per_key: bool = False,
        margin: float = 0.0,
        exact: bool = False,
    ) -> bool:
        """At most ``limit`` claims of ``queue`` (with ``per_key=True``: of each limit_key)
        in any ``per`` seconds, in each of its partitions (exact for a queue of one
        partition, the default), enforced by the claim script across all workers (the
        server's clock; an expired lease taken back counts as a claim of the queue's rate).
        A run over the limit stays pending. ``None`` removes the limit. True when this call
        changed it.

        What is counted is claims; a task's code starts a little after its claim (within a
        batch, behind the runs claimed with it). ``margin`` (seconds) widens the window to
        ``per + margin``: when no start lags its claim by more than the margin, at most
        ``limit`` starts fall in any ``per`` seconds too (docs/operations.md, "Rate
        limits").

        With ``exact=True``: at most ``limit`` claims of the whole queue in any ``per``
        seconds across all its partitions and masters, through permits (see
        set_queue_concurrency); not with ``per_key``."""
        return self.run_steps(self._set_rate(queue, limit, per, per_key, margin, exact))

    def queue_limits(self, queue: str) -> QueueLimits:
        """``queue``'s flow limits (concurrency, rate as (count, window in ms), and per key
        and per task), None where it has none."""
        return self.run_steps(self._queue_limits(queue))

    def queue_paused(self, queue: str) -> bool:
        """Whether ``queue`` is paused (any of its partitions)."""
        return self.run_steps(self._queue_paused(queue))

    # -- enqueue ---------------------------------------------------------------------------

    @overload
    def enqueue(
        self, task: Task[P, R], /, *args: P.args, **kwargs: P.kwargs
    ) -> RunHandle[R]: ...

    @overload
    def enqueue(
        self, task: str, /, *args: Any, **kwargs: Any
    ) -> RunHandle[Any]: ...

    def enqueue(self, task: TaskRef, /, *args: Any, **kwargs: Any) -> RunHandle[Any]:
        """Create one run of ``task`` with these arguments; with a run id that already
        exists, nothing is written and the handle says ``created=False``. Run options (run
        id, delay, at, queue, priority, dedupe, limit_key) come with the task:
        ``jq.enqueue(task.with_options(...), ...)``."""
        found, kwargs, opts = self.split_run_options(task, kwargs)
        if opts.depends_on:  # a waiting run: a workflow of one step
            step = found.waiting_step(args, kwargs)
            flow = self._create_flow(group_graph([step]), None)
            return flow.runs[0]
        steps = self._enqueue(
            found, args, kwargs, opts.run_id, opts.delay, opts.at, opts.queue, opts.priority,
            opts.dedupe, opts.limit_key,
        )
        return self._handle(self.run_steps(steps))

    def enqueue_many(self, requests: Iterable[Request]) -> list[RunHandle[Any]]:
        """Validate all, then create all in one pipelined round trip (one script call per
        partition and chunk)."""
        return [self._handle(c) for c in self.run_steps(self._enqueue_many(requests))]

    def _handle(self, created: Created) -> RunHandle[Any]:
        return RunHandle(self, created.run_id, created.queue, created.created, created.outcome)

    # -- look-ups --------------------------------------------------------------------------

    def locate(self, run_id: str, queue: str | None = None) -> PartitionKeys | None:
        """The partition holding a run: in ``queue`` if given, else in any known queue."""
        return self.run_steps(self._locate(run_id, queue))

    def find_run(self, run_id: str, queue: str | None = None) -> Run | None:
        return self.run_steps(self._find_run(run_id, queue))

    def get_run(self, run_id: str, queue: str | None = None) -> Run:
        return self.run_steps(self._get_run(run_id, queue))

    def wait_run(
        self,
        run_id: str,
        queue: str | None = None,
        timeout: float | None = None,
        poll: float = DEFAULT_POLL_S,
    ) -> Run:
        """Block until the run finishes (done, dead or cancelled) and return it, woken by its
        partition's event log (see ``jobqueue.client.waits``; ``poll``: the longest pause
        between two reads where the log is off); RunTimeout after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        keys = self.run_steps(self._wait_keys(run_id, queue))
        waits = self._wait_hub()
        try:
            watch = waits.watch(keys, run_id, poll, deadline)
        except TimeoutError:
            raise timed_out(run_id, "unfinished", timeout) from None
        state, pause, registered = "unfinished", RETRY_FIRST_S, True
        try:
            while True:
                watch.woken.clear()  # before the read: a wake-up during it is kept
                try:
                    if waits.closed or not registered:  # close() (it marks the hub, then
                        waits.unwatch(keys, watch)      # wakes every waiter): the client
                        registered = False              # goes on, with new listeners
                        waits = self._wait_hub()
                        watch = waits.watch(keys, run_id, poll, deadline)
                        registered = True
                    handed: Run | None = watch.run
                    watch.run = None
                    if handed is not None and handed.finished:  # (read by its listener)
                        return handed
                    run = self.run_steps(self._read(keys, run_id))
                except TimeoutError:  # (registering again, past the deadline)
                    raise timed_out(run_id, state, timeout) from None
                except Exception as exc:  # a failover, Redis restarting: read again
                    left = None if deadline is None else deadline - time.monotonic()
                    if not retriable(exc) or (left is not None and left <= pause):
                        raise
                    time.sleep(pause)
                    pause = min(pause * 2, RETRY_MAX_S)
                    continue
                pause = RETRY_FIRST_S
                if run is None:
                    raise not_found(run_id, queue)
                if run.finished:
                    return run
                state = run.state
                left = None if deadline is None else deadline - time.monotonic()
                if (left is not None and left <= 0) or not watch.woken.wait(left):
                    raise timed_out(run_id, state, timeout)
        finally:
            waits.unwatch(keys, watch)

    def _wait_hub(self) -> SyncWaits:
        waits = self._waits
        if waits is None or waits.pid != os.getpid() or waits.closed:  # none yet, forked (its
            with self._connect_lock:         # threads stayed in the parent), or closed
                waits = self._waits
                if waits is None or waits.pid != os.getpid() or waits.closed:
                    waits = self._waits = SyncWaits(self.run_steps)
        return waits

    # -- events (docs/events.md) -----------------------------------------------------------

    @property
    def on_cluster(self) -> bool:
        return isinstance(self.redis, redis.cluster.RedisCluster)

    def events(
        self,
        queue: str | Sequence[str] | None = None,
        *,
        since: Since = None,
        run_id: str | None = None,
        kinds: Iterable[str] | None = None,
        follow: bool = True,
        block: float = 1.0,
    ) -> EventStream:
        """The events of ``queue`` (a name, names, or None: every queue), every partition,
        in the order written: ``for ev in jq.events("default"): ...``. ``since``: None for
        what comes next; ``ev.cursor`` (or ``stream.cursor``) to go on right after an event;
        an entry id; a ``datetime``; a ``timedelta`` (that long ago); ``0`` for all the log
        holds. ``run_id``: that run's events only (its partition alone is read); ``kinds``:
        those events only. ``follow=False`` stops once it has read up to now. ``block``: the
        longest single wait for more, in seconds (a follower checks ``close()`` then)."""
        chosen = check_kinds(kinds)
        start = reader_steps(self, queue_list(queue), since, run_id, chosen, self.on_cluster)
        again: Callable[[], Steps[Reader]] | None = None
        if queue is None and run_id is None:  # every queue: those made later too
            again = lambda: reader_steps(self, None, "0", None, chosen, self.on_cluster)  # noqa: E731
        return EventStream(self.run_steps, start, follow, block, again)

    def recent_events(
        self,
        queue: str | Sequence[str] | None = None,
        *,
        limit: int = 20,
        run_id: str | None = None,
        kinds: Iterable[str] | None = None,
    ) -> Listing[Event]:
        """The newest ``limit`` events (of ``queue``, every queue when None; of one run; of
        some kinds), oldest first; each event's ``cursor`` follows on right after it."""
        steps = recent_of_steps(self, queue_list(queue), limit, run_id, check_kinds(kinds))
        found: Listing[Event] = self.run_steps(steps)
        return found

    def set_queue_events(
        self,
        queue: str,
        *,
        enabled: bool = True,
        maxlen: int | None = None,
        max_age: float | None = None,
    ) -> EventSettings:
        """The event log of every partition of ``queue``: on or off (``enabled=False``: the
        scripts write no event; waits read the records instead), trimmed to about ``maxlen``
        entries (100 to 10,000,000; default 10,000) and to the last ``max_age`` seconds
        (1 s to 30 days; default a day). Returns the settings now."""
        maxlen, age_ms = check_event_settings(maxlen, max_age)
        count = self.register_queue(queue)
        partitions = [self.partition_keys(queue, p) for p in range(count)]
        self.run_steps(set_events_steps(partitions, enabled, maxlen, age_ms))
        return self.queue_events(queue)

    def queue_events(self, queue: str) -> EventSettings:
        """``queue``'s event log settings and how many entries each partition holds."""
        partitions = self.run_steps(partitions_steps(self, [queue]))
        settings: EventSettings = self.run_steps(event_settings_steps(queue, partitions))
        return settings

    # -- workflows (docs/workflows.md) -----------------------------------------------------

    @overload
    def chain(
        self,
        s1: Signature[R],
        /,
        *,
        on_failure: str = ...,
        flow_id: str | None = ...,
    ) -> FlowHandle[R]: ...

    @overload
    def chain(
        self,
        s1: Signature[Any],
        s2: Signature[R],
        /,
        *,
        on_failure: str = ...,
        flow_id: str | None = ...,
    ) -> FlowHandle[R]: ...

    @overload
    def chain(
        self,
        s1: Signature[Any],
        s2: Signature[Any],
        s3: Signature[R],
        /,
        *,
        on_failure: str = ...,
        flow_id: str | None = ...,
    ) -> FlowHandle[R]: ...

    @overload
    def chain(
        self,
        s1: Signature[Any],
        s2: Signature[Any],
        s3: Signature[Any],
        s4: Signature[R],
        /,
        *,
        on_failure: str = ...,
        flow_id: str | None = ...,
    ) -> FlowHandle[R]: ...

    @overload
    def chain(
        self,
        s1: Signature[Any],
        s2: Signature[Any],
        s3: Signature[Any],
        s4: Signature[Any],
        s5: Signature[R],
        /,
        *,
        on_failure: str = ...,
        flow_id: str | None = ...,
    ) -> FlowHandle[R]: ...

    @overload
    def chain(
        self,
        s1: Signature[Any],
        s2: Signature[Any],
        s3: Signature[Any],
        s4: Signature[Any],
        s5: Signature[Any],
        s6: Signature[R],
        /,
        *,
        on_failure: str = ...,
        flow_id: str | None = ...,
    ) -> FlowHandle[R]: ...

    @overload
    def chain(
        self, *steps: Signature[Any], on_failure: str = ..., flow_id: str | None = ...
    ) -> FlowHandle[Any]: ...

    def chain(
        self, *steps: Signature[Any], on_failure: str = "fail", flow_id: str | None = None
    ) -> FlowHandle[Any]:
        """Steps one after another: each waits on the one before it (a ``receiving`` step
        gets its result). ``on_failure``: what a step's death does to the next (see
        :data:`jobqueue.workflows.POLICIES`; ``fail``: the rest of the chain dies too). With
        ``flow_id`` (else random) the run ids are ``<flow_id>:<index>``, and creating the
        same chain again writes nothing."""
        return self._create_flow(chain_graph(steps, on_failure), flow_id)

    def group(
        self, steps: Sequence[Signature[R]], *, flow_id: str | None = None
    ) -> FlowHandle[R]:
        """Steps side by side (``results()`` waits for them all)."""
        return self._create_flow(group_graph(steps), flow_id)

    def chord(
        self,
        header: Sequence[Signature[Any]],
        callback: Signature[R],
        *,
        on_failure: str = "fail",
        flow_id: str | None = None,
    ) -> FlowHandle[R]:
        """The header's steps side by side, then ``callback`` once each finished, exactly
        once (a ``receiving`` callback gets their results as a list, in order)."""
        return self._create_flow(chord_graph(header, callback, on_failure), flow_id)

    def workflow(
        self, steps: Mapping[str, Signature[Any]], *, flow_id: str | None = None
    ) -> FlowHandle[Any]:
        """Named steps, each waiting on what its ``.after(...)`` names: other steps, or runs
        created before (their handles). The run ids are ``<flow_id>:<name>``."""
        return self._create_flow(workflow_graph(steps), flow_id)

    def batch(
        self,
        children: Sequence[Signature[Any]],
        *,
        on_success: Signature[Any] | None = None,
        on_dead: Signature[Any] | None = None,
        on_complete: Signature[Any] | None = None,
        batch_id: str | None = None,
    ) -> FlowHandle[Any]:
        """Children side by side, and callbacks that each run once: ``on_success`` when
        every child is done (it is cancelled at the first death), ``on_dead`` at the first
        child that dies or is cancelled (cancelled once all are done), ``on_complete`` when
        every child finished, whatever the outcomes. A running child may add more children
        (``ctx.add_to_flow``). A ``receiving`` callback gets the children's results as a list
        (None for a failed one). The handle names the callbacks (``batch["on_complete"]``);
        run ids are ``<batch_id>:<index>`` and ``<batch_id>:<callback>``."""
        callbacks = {"on_success": on_success, "on_dead": on_dead, "on_complete": on_complete}
        return self._create_flow(batch_graph(children, callbacks), batch_id)

    def _create_flow(self, graph: Graph, flow_id: str | None) -> FlowHandle[Any]:
        made = self.run_steps(create_flow(self, graph, flow_id))
        runs: list[RunHandle[Any]] = [
            RunHandle(self, rid, q, created) for rid, q, created in made.runs
        ]
        return FlowHandle(made.flow_id, [n.name for n in graph.nodes], runs)

    def dependencies(self, run_id: str, queue: str | None = None) -> list[DependencyState]:
        """See :meth:`RunHandle.dependencies`."""
        return self.run_steps(dependencies_steps(self, run_id, queue))

    def relay(self, queue: str) -> int:
        """Carry the outboxes of a queue's partitions to the runs waiting on their finished
        runs now (workers do it after their commits and every few seconds); returns the
        entries relayed."""
        self.register_queue(queue)
        return sum(relay_until_quiet(self, keys) for keys in self.all_partition_keys(queue))

    def run_states(self, run_ids: Iterable[str], queue: str | None = None) -> list[RunState]:
        """Where each run lives and its state ('missing' if not found), in few round trips."""
        return self.run_steps(self._run_states(run_ids, queue))

    # -- steering --------------------------------------------------------------------------

    def cancel(self, run_id: str, queue: str | None = None, reason: str = "cancelled") -> str:
        """Cancel a pending, waiting or running run; returns the state it was in. A running
        worker is fenced out at its next heartbeat. Refused (OperationRefused) if already
        finished. A workflow hears of it at once: the runs waiting on it (by their policy),
        and, for a waiting run, its unfinished dependencies (cancelled too)."""
        state = self.run_steps(self._cancel(run_id, queue, reason))
        try:
            relay_until_quiet(self, self.run_steps(self._located(run_id, queue)))
        except JobQueueError as exc:  # the workers' relay carries it soon
            log.warning("cancelled %s; telling its workflow failed for now: %s", run_id, exc)
        return state

    def purge_dead(self, run_ids: Iterable[str], queue: str | None = None) -> int:
        """Delete dead runs for good (record, history, dead-index entry), one purge call per
        partition in one round trip. Runs no longer dead (requeued meanwhile) or not found are
        left alone. Returns how many were purged. An outcome the runs' workflows have not
        heard of yet is delivered first."""
        return self.run_steps(purge_dead_steps(self, run_ids, queue))

    def requeue(self, run_id: str, queue: str | None = None, *, force: bool = False) -> str:
        """Put a dead or cancelled run (a done one with ``force=True``: it runs again) back to
        pending with its attempts reset; returns the state it was in. The record shows the
        new life only; its history keeps how the earlier attempts ended."""
        return self.run_steps(self._requeue(run_id, queue, force))

    def requeue_located(self, runs: list[tuple[str, PartitionKeys]]) -> list[tuple[bool, str]]:
        """Requeue runs already located (``run_states``) in one round trip: for each,
        whether it changed and the state it was in."""
        return self.run_steps(self._requeue_located(runs))

    def server_time_ms(self) -> int:
        return self.run_steps(server_time_steps())

    # -- recurring jobs --------------------------------------------------------------------
    # The definitions store is jobqueue.recurring.steps; the daemon is
    # jobqueue.recurring.daemon.Scheduler. ``now`` (ms) is for tests; the server clock otherwise.

    def schedule(
        self,
        job_id: str,
        task: TaskRef,
        *,
        cron: str | None = None,
        every: float | None = None,
        tz: str = DEFAULT_TZ,
        args: Iterable[Any] = (),
        kwargs: dict[str, Any] | None = None,
        misfire: str = DEFAULT_MISFIRE,
        jitter: float | None = None,
        overlap: str = DEFAULT_OVERLAP,
        queue: str | None = None,
        start_at: Instant | None = None,
        end_at: Instant | None = None,
        max_attempts: int | None = None,
        now: int | None = None,
    ) -> ScheduleInfo:
        """Create or update a recurring job (upsert). Everything is validated first: a bad
        cron, time zone, jitter (>= the period) or policy raises and writes nothing."""
        return self.run_steps(
            self._schedule(
                job_id,
                task,
                cron=cron,
                every=every,
                tz=tz,
                args=args,
                kwargs=kwargs,
                misfire=misfire,
                jitter=jitter,
                overlap=overlap,
                queue=queue,
                start_at=start_at,
                end_at=end_at,
                max_attempts=max_attempts,
                now=now,
            )
        )

    def unschedule(self, job_id: str) -> bool:
        return self.run_steps(self.recurring.unschedule_steps(job_id))

    def pause_schedule(self, job_id: str, now: int | None = None) -> ScheduleInfo:
        return self.run_steps(self.recurring.pause_steps(job_id, now))

    def resume_schedule(self, job_id: str, now: int | None = None) -> ScheduleInfo:
        return self.run_steps(self.recurring.resume_steps(job_id, now))

    def trigger(self, job_id: str, now: int | None = None) -> RunHandle[Any]:
        return self._handle(self.run_steps(self._trigger(job_id, now)))

    def backfill(
        self, job_id: str, start: Instant, end: Instant, now: int | None = None
    ) -> list[RunHandle[Any]]:
        return [self._handle(c) for c in self.run_steps(self._backfill(job_id, start, end, now))]

    def get_schedule(self, job_id: str) -> ScheduleInfo | None:
        return self.run_steps(self.recurring.get_steps(job_id))

    def list_schedules(self, limit: int | None = None) -> Listing[ScheduleInfo]:
        """Every recurring job (at most ``limit``), sorted, read page by page; a definition
        that cannot be used is left out, logged and kept in the listing's ``anomalies``."""
        return self.run_steps(self._list_schedules(limit))
