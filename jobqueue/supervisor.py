"""``jobqueue worker --processes P``: P worker processes under one parent that restarts a
child that dies and passes SIGTERM/SIGINT on for a graceful drain.

Each child runs in its own process group, so a Ctrl-C at a terminal (SIGINT to the whole
foreground group) reaches the children once, through the supervisor; were they in its group,
they would get it twice and take the second as "exit at once". A child whose supervisor dies
(even by SIGKILL) gets SIGTERM and drains, rather than working on unsupervised.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from types import FrameType

log = logging.getLogger("jobqueue.supervisor")

SUPERVISED_ENV = "JOBQUEUE_SUPERVISED"
_RESTART_BACKOFF_MAX_S = 10.0
_PR_SET_PDEATHSIG = 1


def _child_setup() -> None:
    """In the child, before exec: own process group; SIGTERM when the supervisor dies."""
    os.setpgid(0, 0)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _spawn(argv: list[str], url: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, SUPERVISED_ENV: "1"}
    if url:
        env["JOBQUEUE_REDIS_URL"] = url  # children share the parent's (possibly embedded) server
    return subprocess.Popen(
        [sys.executable, "-m", "jobqueue.cli", *argv[1:]], env=env, preexec_fn=_child_setup
    )


def supervise(processes: int, argv: list[str], url: str) -> int:
    """Run ``processes`` workers until SIGTERM/SIGINT; returns 0 when every child drained
    cleanly (exit 0), else 1."""
    children: list[subprocess.Popen[bytes]] = []
    stopping = False
    signals: list[int] = []

    def forward(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        signals.append(signum)
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    for _ in range(processes):
        if not stopping:
            children.append(_spawn(argv, url))
    log.info("supervising %d worker processes: %s", processes, [c.pid for c in children])
    backoff = 0.5
    while not stopping:
        for i, child in enumerate(children):
            code = child.poll()
            if code is None:
                backoff = max(0.5, backoff * 0.9)
                continue
            log.warning(
                "worker pid %d exited with %s; restarting in %.1fs", child.pid, code, backoff
            )
            deadline = time.monotonic() + backoff
            while not stopping and time.monotonic() < deadline:
                time.sleep(0.05)
            if stopping:
                break  # a signal came during the backoff: do not start a child it missed
            backoff = min(backoff * 2, _RESTART_BACKOFF_MAX_S)
            children[i] = _spawn(argv, url)
            log.info("started worker pid %d", children[i].pid)
        time.sleep(0.2)
    log.info("signal %s: waiting for %d workers to drain", signals[0], len(children))
    codes = {child.pid: child.wait() for child in children}
    failed = {pid: code for pid, code in codes.items() if code != 0}
    if failed:
        log.warning("workers exited uncleanly: %s", failed)
    return 1 if failed else 0
