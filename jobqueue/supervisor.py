"""``jobqueue worker --processes P``: P worker processes under one parent that restarts a
child that dies and passes SIGTERM/SIGINT on for a graceful drain."""

from __future__ import annotations

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


def _spawn(argv: list[str], url: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, SUPERVISED_ENV: "1"}
    if url:
        env["JOBQUEUE_REDIS_URL"] = url  # children share the parent's (possibly embedded) server
    return subprocess.Popen([sys.executable, "-m", "jobqueue.cli", *argv[1:]], env=env)


def supervise(processes: int, argv: list[str], url: str) -> int:
    children = [_spawn(argv, url) for _ in range(processes)]
    stopping = False
    backoff = 0.5

    def forward(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    log.info("supervising %d worker processes: %s", processes, [c.pid for c in children])
    while True:
        if stopping:
            for child in children:
                child.wait()
            return 0
        for i, child in enumerate(children):
            code = child.poll()
            if code is not None and not stopping:
                log.warning(
                    "worker pid %d exited with %s; restarting in %.1fs", child.pid, code, backoff
                )
                time.sleep(backoff)
                backoff = min(backoff * 2, _RESTART_BACKOFF_MAX_S)
                children[i] = _spawn(argv, url)
            elif code is None:
                backoff = max(0.5, backoff * 0.9)
        time.sleep(0.2)
