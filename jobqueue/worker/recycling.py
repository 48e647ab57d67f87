"""Recycling a worker child (``jobqueue worker --max-runs-per-child K`` /
``--max-memory-per-child MB``): after K finished runs, or once its resident memory passed MB
after a run finished, a child stops claiming, lets its runs finish and commit (the graceful
drain), and exits EXIT_RECYCLED; its supervisor starts a replacement at once, without the
back-off of a crash. For task code that leaks memory or state.

The worker's side is one call: after each batch of commits answered, ``Recycling.answered(n)``
with the number of runs answered; a reason string the first time the child should recycle,
else None. RSS is read at most every ``check_every_s`` (not once per run at high rates).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable

# The exit code of a child that recycled itself: not 3 (the CLI: Redis unreachable) nor 4
# (jobqueue.worker.daemon.EXIT_UNHEALTHY). Its supervisor replaces it at once, no back-off.
EXIT_RECYCLED = 5
# How often at most the resident memory is read, after runs finished.
MEMORY_CHECK_S = 0.1
# The supervisor's pipe (the file descriptor in this variable) for a recycled child's reason.
REPORT_FD_ENV = "JOBQUEUE_SUPERVISOR_REPORT_FD"

MB = 1024 * 1024


def _statm_rss() -> int | None:
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _peak_rss() -> int:
    try:
        import resource
    except ImportError:  # (no resource module: Windows)
        return 0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # bytes on macOS, else KiB


def rss_bytes() -> int:
    """This process's resident memory now (Linux: /proc/self/statm); elsewhere its peak so
    far (getrusage), which never goes down; 0 where neither is available."""
    current = _statm_rss()
    return current if current is not None else _peak_rss()


class Recycling:
    """When a worker child should recycle: ``max_runs`` runs answered, or its RSS over
    ``max_memory_bytes`` (read at most every ``check_every_s``, after runs finished).
    Called from one thread (the committer's)."""

    def __init__(
        self,
        max_runs: int | None = None,
        max_memory_bytes: int | None = None,
        *,
        check_every_s: float = MEMORY_CHECK_S,
        rss: Callable[[], int] = rss_bytes,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_runs is not None and max_runs < 1:
            raise ValueError("max_runs must be at least 1")
        if max_memory_bytes is not None and max_memory_bytes <= 0:
            raise ValueError("max_memory_bytes must be positive")
        self.max_runs = max_runs
        self.max_memory_bytes = max_memory_bytes
        self.check_every_s = check_every_s
        self._rss = rss
        self._monotonic = monotonic
        self._next_check = float("-inf")  # the first run finished is checked
        self.runs = 0  # runs answered so far
        self.reason: str | None = None  # set once, when answered() first returned it

    def answered(self, n: int) -> str | None:
        """``n`` more runs answered (their commits accepted, refused or given up on). The
        reason to recycle the first time there is one (then ``reason``), else None; None
        again after that (the child is draining)."""
        self.runs += n
        if self.reason is not None or n <= 0:
            return None
        if self.max_runs is not None and self.runs >= self.max_runs:
            rss = self._rss()
            self.reason = (
                f"{self.runs} runs done (max {self.max_runs} per child); RSS {rss / MB:.1f} MB"
            )
            return self.reason
        if self.max_memory_bytes is not None:
            now = self._monotonic()
            if now >= self._next_check:
                self._next_check = now + self.check_every_s
                rss = self._rss()
                if rss > self.max_memory_bytes:
                    self.reason = (
                        f"RSS {rss / MB:.1f} MB over the max of "
                        f"{self.max_memory_bytes / MB:g} MB per child; {self.runs} runs done"
                    )
                    return self.reason
        return None


def report_to_supervisor(reason: str) -> None:
    """Tell the supervisor (its pipe, when this child has one) why this child exits
    EXIT_RECYCLED: one line, ``<pid> <reason>``; lost, harmlessly, when the pipe is full."""
    fd = os.environ.get(REPORT_FD_ENV)
    if not fd:
        return
    line = f"{os.getpid()} {reason}".replace("\n", " ")[:1000] + "\n"
    with contextlib.suppress(OSError, ValueError):
        os.write(int(fd), line.encode("utf-8", "replace"))
