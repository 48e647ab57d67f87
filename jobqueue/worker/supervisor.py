"""``jobqueue worker --processes P`` (``auto``: one per CPU): P worker processes under one
parent that restarts a child that dies and passes SIGTERM/SIGINT on for a graceful drain.

Each child runs in its own process group, so a Ctrl-C at a terminal (SIGINT to the whole
foreground group) reaches the children once, through the supervisor; were they in its group,
they would get it twice and take the second as "exit at once". A child whose supervisor dies
(even by SIGKILL) gets SIGTERM and drains, rather than working on unsupervised.

A child that exits EXIT_RECYCLED (``--max-runs-per-child``, ``--max-memory-per-child``: it
drained and committed its runs) is replaced at once, without the back-off of a crash and
without counting as one; it tells why through a pipe (jobqueue.worker.recycling), and the
supervisor logs one INFO line per recycle.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from types import FrameType

from jobqueue.policy.backoff import Backoff
from jobqueue.worker.config import DEFAULT_GRACE_S
from jobqueue.worker.recycling import EXIT_RECYCLED, REPORT_FD_ENV

log = logging.getLogger("jobqueue.supervisor")

SUPERVISED_ENV = "JOBQUEUE_SUPERVISED"
_RESTART_BACKOFF_S = 0.5
_RESTART_BACKOFF_MAX_S = 10.0
_PR_SET_PDEATHSIG = 1


_SIGNALS = {signal.SIGTERM, signal.SIGINT}
# A child that has not drained this long after the grace period is killed (its worker's own
# watchdog exits it at grace + 9 s; this is for one that hangs even so).
KILL_MARGIN_S = 15.0


def cpu_count() -> int:
    """The CPUs this process may run on (``--processes auto``): its affinity mask where the
    platform has one (a container or taskset limits it), else every CPU of the machine."""
    counter = getattr(os, "process_cpu_count", None)  # Python 3.13+
    if counter is not None:
        return int(counter() or 1)
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def child_setup() -> None:
    """In the child, before exec: own process group; SIGTERM when the supervisor dies; the
    signals the supervisor blocked while spawning it unblocked again (a mask is inherited)."""
    os.setpgid(0, 0)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)


def spawn_child(argv: list[str], url: str) -> subprocess.Popen[bytes]:
    """A worker child running this command line (``--processes`` left to the parent)."""
    env = {**os.environ, SUPERVISED_ENV: "1"}
    if url:
        env["JOBQUEUE_REDIS_URL"] = url  # children share the parent's (possibly embedded) server
    report = env.get(REPORT_FD_ENV)  # (set by supervise(): the pipe for recycling reasons)
    return subprocess.Popen(
        [sys.executable, "-m", "jobqueue.cli", *argv[1:]],
        env=env,
        preexec_fn=child_setup,
        pass_fds=(int(report),) if report else (),
    )


def _grace_from(argv: list[str]) -> float:
    """The children's --grace (the supervisor waits that long, plus a margin, for them)."""
    for i, arg in enumerate(argv):
        value = None
        if arg == "--grace" and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith("--grace="):
            value = arg.split("=", 1)[1]
        if value is not None:
            try:
                return float(value)
            except ValueError:
                break
    return DEFAULT_GRACE_S


def _clean(code: int, stopping: bool) -> bool:
    # A child signalled before its interpreter installed its handler dies of the signal;
    # it held no run then, so once we are stopping that is a clean exit too. A child that
    # recycled itself as the signal came drained its runs too.
    return code in (0, EXIT_RECYCLED) or (stopping and code in (-signal.SIGTERM, -signal.SIGINT))


class _Reports:
    """The pipe recycled children write their reason to (one line each, ``<pid> <reason>``,
    atomic: under PIPE_BUF), its write end passed to each child in REPORT_FD_ENV; both ends
    non-blocking: a child never waits on it, the supervisor reads what is there."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.read_fd, False)
        os.set_blocking(self.write_fd, False)  # (the children's end shares this flag)
        self._saved = os.environ.get(REPORT_FD_ENV)
        os.environ[REPORT_FD_ENV] = str(self.write_fd)
        self._buffer = b""
        self._reasons: dict[int, str] = {}

    def reason(self, pid: int) -> str | None:
        """What child ``pid`` reported, if it did (read once it exited: its line is in)."""
        with contextlib.suppress(BlockingIOError, OSError):
            while chunk := os.read(self.read_fd, 65536):
                self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            head, _, text = line.decode("utf-8", "replace").partition(" ")
            with contextlib.suppress(ValueError):
                self._reasons[int(head)] = text
        return self._reasons.pop(pid, None)

    def close(self) -> None:
        if self._saved is None:
            os.environ.pop(REPORT_FD_ENV, None)
        else:
            os.environ[REPORT_FD_ENV] = self._saved
        for fd in (self.read_fd, self.write_fd):
            with contextlib.suppress(OSError):
                os.close(fd)


def supervise(
    processes: int,
    argv: list[str],
    url: str,
    grace: float | None = None,
    *,
    spawn_child: Callable[[list[str], str], subprocess.Popen[bytes]] = spawn_child,
    kill_margin: float = KILL_MARGIN_S,
) -> int:
    """Run ``processes`` workers until SIGTERM/SIGINT; returns 0 when every child drained
    cleanly, else 1. A child that has not drained ``grace`` + ``kill_margin`` seconds after
    the signal is killed; ``spawn_child`` starts each child (tests give their own)."""
    children: list[subprocess.Popen[bytes]] = []
    stopping = False
    signals: list[int] = []
    grace_s = _grace_from(argv) if grace is None else grace

    def forward(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        signals.append(signum)
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    def spawn() -> subprocess.Popen[bytes] | None:
        """A new child, unless stopping. The signals are blocked while it is created and
        recorded: forward() cannot run in between and miss it (it would never drain, and
        the final wait would hang); a signal that came meanwhile is handled on unblock."""
        old = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
        try:
            if stopping:
                return None
            child = spawn_child(argv, url)
            children.append(child)
            if stopping:
                # The mask is per thread: a signal the kernel gave another thread still runs
                # forward() in this one, possibly before the append. Catch this child up.
                child.send_signal(signals[-1])
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
        return child

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    reports = _Reports()
    try:
        return _supervise(processes, children, spawn, lambda: stopping, signals, reports,
                          grace_s + kill_margin)
    finally:
        reports.close()


def _supervise(
    processes: int,
    children: list[subprocess.Popen[bytes]],
    spawn: Callable[[], subprocess.Popen[bytes] | None],
    is_stopping: Callable[[], bool],
    signals: list[int],
    reports: _Reports,
    wait_s: float,
) -> int:
    for _ in range(processes):
        spawn()
    log.info("supervising %d worker processes: %s", processes, [c.pid for c in children])
    # Children dying one after another are restarted ever more slowly; while they live, the
    # pause shrinks back. A recycled child is no crash: replaced at once, the pause untouched.
    backoff = Backoff(_RESTART_BACKOFF_S, _RESTART_BACKOFF_MAX_S, jitter=False)
    recycled = 0
    while not is_stopping():
        for child in list(children):
            code = child.poll()
            if code is None:
                backoff.relax(0.9)
                continue
            if code == EXIT_RECYCLED:
                children.remove(child)
                new = spawn()
                recycled += 1
                log.info(
                    "recycled worker pid %d (%s); started worker pid %s (recycles: %d)",
                    child.pid,
                    reports.reason(child.pid) or "no reason reported",
                    new.pid if new is not None else "none: stopping",
                    recycled,
                )
                continue
            pause = backoff.next()
            log.warning(
                "worker pid %d exited with %s; restarting in %.1fs", child.pid, code, pause
            )
            deadline = time.monotonic() + pause
            while not is_stopping() and time.monotonic() < deadline:
                time.sleep(0.05)
            if is_stopping():
                break  # a signal came during the backoff: do not start a child it missed
            children.remove(child)  # the dead child: forward() need not signal it again
            new = spawn()
            if new is not None:
                log.info("started worker pid %d", new.pid)
        time.sleep(0.2)
    log.info("signal %s: waiting for %d workers to drain", signals[0], len(children))
    codes = _wait_all(children, wait_s)
    failed = {pid: code for pid, code in codes.items() if not _clean(code, True)}
    if failed:
        log.warning("workers exited uncleanly: %s", failed)
    return 1 if failed else 0


def _wait_all(children: list[subprocess.Popen[bytes]], timeout: float) -> dict[int, int]:
    """Every child's exit code; one still running after ``timeout`` is killed (SIGKILL)."""
    deadline = time.monotonic() + timeout
    codes: dict[int, int] = {}
    for child in list(children):
        try:
            codes[child.pid] = child.wait(max(deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            log.error(
                "worker pid %d did not drain %.0fs after the signal; killing it",
                child.pid,
                timeout,
            )
            child.kill()
            codes[child.pid] = child.wait()
    return codes
