"""A test mode: run what is due, in this process, before the call returns.

``run_due(jq)`` is a burst worker (``jobqueue worker --burst``) driven from the caller: the
same claim, heartbeat and commit scripts on the same Redis (a real server or fakeredis), so a
test sees what production does: retries, dead-lettering, fences, history. It returns once
nothing is due and no run is held; a run retried after a back-off, or enqueued with a delay,
is left pending for a later call.

In pytest::

    from jobqueue.testing import run_due

    def test_invoice_is_sent(jq):                 # a JobQueue on fakeredis, say
        handle = send_invoice.enqueue(42, amount=990)
        run_due(jq)
        assert handle.refresh().result == "sent"
"""

from __future__ import annotations

from collections.abc import Iterable

from jobqueue.client.sync import JobQueue
from jobqueue.worker.daemon import Worker
from jobqueue.worker.runs import WorkerStats


def run_due(
    jq: JobQueue,
    queues: Iterable[str] | None = None,
    *,
    concurrency: int = 1,
    lease: float | None = None,
) -> WorkerStats:
    """Run every run of ``queues`` that is due now (and any that is due by the time the runs
    held finish); returns the worker's counters (claimed, completed, failed, ...). Default
    queues: the default queue and every queue a task registered on ``jq`` names.
    ``concurrency`` 1: one run at a time, in order of priority, then of due time. A
    task raising fails its run as in production (retried or dead): the exception is in the
    run's ``error``, not raised here."""
    if queues is None:
        queues = [jq.settings.default_queue]
        queues += sorted({t.options.queue for t in jq.registry.all()} - set(queues))
    worker = Worker(
        jq,
        queues,
        concurrency=concurrency,
        lease=lease,
        install_signal_handlers=False,
        burst=True,
    )
    code = worker.run()
    if code != 0:
        raise RuntimeError(f"the in-process worker gave up: {worker.unhealthy}")
    return worker.stats
