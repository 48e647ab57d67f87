"""Deterministic jitter: spread a herd of jobs that share a fire time over a window.

Each job gets a fixed offset ``fnv1a_32(job_id) % window`` (Jenkins' ``H`` idea): the same job
always lands on the same offset, so every scheduler instance computes the same due time, while
a hundred thousand jobs firing "at minute 0" spread almost evenly over the window.
"""

from __future__ import annotations

from jobqueue.policy.hashing import fnv1a_32

_FNV_OFFSET = 0x811C9DC5
_FNV_PRIME = 0x01000193


def job_hash(job_id: str) -> int:
    """``fnv1a_32(job_id)``, faster for the usual ASCII ids (the scheduler hashes one per run
    of a herd): for ASCII, the UTF-16 code units ``fnv1a_32`` hashes are the bytes themselves."""
    if not job_id.isascii():
        return fnv1a_32(job_id)
    h = _FNV_OFFSET
    for b in job_id.encode():
        h = ((h ^ b) * _FNV_PRIME) & 0xFFFFFFFF
    return h


def jitter_ms(job_id: str, window_ms: int) -> int:
    """Offset in ``[0, window_ms)`` added to the job's fire time; 0 when there is no window."""
    if window_ms <= 0:
        return 0
    return job_hash(job_id) % window_ms


def herd_histogram(n_jobs: int, window_s: int, prefix: str = "job-") -> list[int]:
    """Jobs per second when ``<prefix>0 .. <prefix>{n_jobs-1}`` all fire at second 0.

    Each job is delayed by its jitter over a window of ``window_s`` whole seconds (the spread
    of a herd in docs/design.md). A window of 0 or less means no jitter: the whole herd lands
    on second 0.
    """
    if n_jobs < 0:
        raise ValueError(f"n_jobs must be >= 0, got {n_jobs}")
    counts = [0] * max(window_s, 1)
    for i in range(n_jobs):
        # The same function as production jitter, with the window counted in seconds.
        counts[jitter_ms(f"{prefix}{i}", window_s)] += 1
    return counts
