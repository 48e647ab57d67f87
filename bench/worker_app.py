"""The app bench/worker.py runs its worker processes with: one no-op task."""

from __future__ import annotations

from jobqueue import JobQueue

jq = JobQueue()


@jq.task
def noop() -> None:
    """Does nothing: what is measured is the queue's own cost per run."""
