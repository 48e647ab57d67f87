"""What the overlap policies need at fire time: the state of each job's previous run, looked up
in the queue that run went to, and ``buffer-one``'s buffered runs, released once their
predecessor has finished (``sched_release.lua``)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from jobqueue.errors import JobQueueError
from jobqueue.recurring.planning import UNFINISHED
from jobqueue.recurring.steps import buffered_entries_steps, run_states_steps
from jobqueue.store.keys import (
    PartitionKeys,
    SchedKeys,
    fire_run_id,
    partition_of,
    validate_queue_name,
)
from jobqueue.store.schedules import (
    SCHED_RELEASE,
    SCHED_UNHOLD,
)

if TYPE_CHECKING:
    from jobqueue.client.sync import JobQueue

log = logging.getLogger("jobqueue.scheduler")


class BufferedRuns:
    """The previous runs of the jobs with an overlap policy, and the release of buffered runs."""

    def __init__(self, jq: JobQueue) -> None:
        self.jq = jq

    def run_keys(self, job: str, queue: str) -> PartitionKeys | None:
        """The partition of ``queue`` that holds the job's runs (None: an unusable queue name,
        e.g. a corrupt state text, which is logged)."""
        try:
            count = self.jq.register_queue(validate_queue_name(queue))
        except (ValueError, JobQueueError) as exc:
            log.error("recurring job %s: unusable queue %r: %s", job, queue, exc)
            return None
        return self.jq.partition_keys(queue, partition_of(job, count))

    def previous_states(self, jobs: list[tuple[str, str, int | None]]) -> list[str | None]:
        """The state of each job's previous run, given (job, queue of that run, its fire)
        (None: none, or expired)."""
        out: list[str | None] = [None] * len(jobs)
        wanted = []
        for i, (job, queue, last) in enumerate(jobs):
            pk = None if last is None else self.run_keys(job, queue)
            if pk is not None and last is not None:
                wanted.append((i, pk.run(fire_run_id(job, last))))
        states = self.jq.run_steps(run_states_steps([key for _, key in wanted]))
        for (i, _), state in zip(wanted, states, strict=True):
            out[i] = state
        return out

    def release_buffered(self, sk: SchedKeys, now: int | None = None) -> int:
        """buffer-one: release the buffered runs whose predecessor has finished (sched_release.lua,
        one atomic check-and-release in the run's slot), then forget the entries whose run no
        longer waits (compare-and-set). Returns how many runs were released.

        A predecessor in another queue (the job's queue changed between the two fires) is in
        another slot: its state is read first, and the buffered run is released (with no
        predecessor to check in its own slot) only once that state is finished. Finished is
        final but for an operator's requeue, which the one-slot check cannot prevent either.
        """
        entries = self.jq.run_steps(buffered_entries_steps(sk))
        if not entries:
            return 0
        by_pk: dict[PartitionKeys, list[tuple[str, str, tuple[str, str, int]]]] = {}
        # (predecessor's partition, buffered run's partition, job, entry text, buffered run)
        elsewhere: list[tuple[PartitionKeys, PartitionKeys, str, str, tuple[str, str, int]]] = []
        for job, text in entries.items():
            try:
                fire_s, pred_s, due_s, queue, *rest = text.split(" ")
                fire, pred, due = int(fire_s), int(pred_s), int(due_s)
                pred_queue = rest[0] if rest else queue
                if len(rest) > 1:
                    raise ValueError("too many fields")
                count = self.jq.register_queue(queue)
            except (ValueError, JobQueueError) as exc:
                log.error("recurring job %s: unusable buffered entry %r: %s", job, text, exc)
                continue
            pk = self.jq.partition_keys(queue, partition_of(job, count))
            pred_id = "" if pred < 0 else fire_run_id(job, pred)
            buffered = (fire_run_id(job, fire), pred_id, due)
            if pred_id and pred_queue != queue:
                pred_pk = self.run_keys(job, pred_queue)
                if pred_pk is None:
                    continue
                elsewhere.append((pred_pk, pk, job, text, buffered))
                continue
            by_pk.setdefault(pk, []).append((job, text, buffered))
        if elsewhere:
            pred_keys = [pred_pk.run(pred_id) for pred_pk, _, _, _, (_, pred_id, _) in elsewhere]
            states = self.jq.run_steps(run_states_steps(pred_keys))
            for (_, pk, job, text, (run_id, _, due)), state in zip(elsewhere, states, strict=True):
                if state is None or state not in UNFINISHED:
                    by_pk.setdefault(pk, []).append((job, text, (run_id, "", due)))
        calls = [
            SCHED_RELEASE.call(pk, [h for _, _, h in items], now) for pk, items in by_pk.items()
        ]
        released, done = 0, []
        for (pk, items), reply in zip(by_pk.items(), self.jq.scripts.run_each(calls), strict=True):
            if isinstance(reply, Exception):  # its master down: released at a later tick
                log.warning("buffered runs in %s not released yet (%s)", pk.prefix, reply)
                continue
            for (job, text, _), result in zip(items, SCHED_RELEASE.parse(reply), strict=True):
                released += result == 1
                if result:
                    done.append((job, text))
        if done:
            self.jq.scripts.run(SCHED_UNHOLD.call(sk, done, now))
        return released
