"""Daemons act on SIGTERM from a helper thread: a signal handler that stopped them directly
could deadlock, since Python runs it in the main thread between two bytecodes, maybe while
that thread holds the very lock stopping needs (an Event's, inside every Event.wait)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from helpers import wait_for

from jobqueue.runtime.signals import SignalRelay

ROOT = Path(__file__).resolve().parent.parent

# The scheduler's main loop waits on its _stopping Event between ticks: the signal lands
# while the main thread holds that Event's lock (as inside Event.wait). A handler calling
# Event.set() there waits for itself forever; one that only notifies a thread does not.
SCHEDULER_SIGNALLED_HOLDING_ITS_EVENT_LOCK = """
import os, signal, time
import fakeredis
from jobqueue import JobQueue
from jobqueue.recurring.daemon import Scheduler

sched = Scheduler(JobQueue(fakeredis.FakeRedis(decode_responses=True)))
sched._signals.start()
signal.signal(signal.SIGTERM, sched._on_signal)
with sched._stopping._cond:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.3)  # the handler runs here, in this thread, with the lock held
assert sched._stopping.wait(5), "the stop never came"
print("stopped")
"""


def test_a_scheduler_signalled_while_its_main_thread_holds_its_stop_events_lock_stops() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", SCHEDULER_SIGNALLED_HOLDING_ITS_EVENT_LOCK],
        env=env, capture_output=True, text=True, timeout=20,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "stopped"


def test_the_relay_calls_back_on_its_thread_once_per_signal_and_ends_on_close() -> None:
    got: list[tuple[int, str]] = []
    arrived = threading.Semaphore(0)

    def on_signal(signum: int) -> None:
        got.append((signum, threading.current_thread().name))
        arrived.release()

    relay = SignalRelay(on_signal, "relay-under-test")
    relay.start()
    relay.notify(signal.SIGTERM)
    relay.notify(signal.SIGINT)
    assert arrived.acquire(timeout=5) and arrived.acquire(timeout=5)
    relay.close()
    assert got == [(signal.SIGTERM, "relay-under-test"), (signal.SIGINT, "relay-under-test")]
    wait_for(lambda: not any(t.name == "relay-under-test" for t in threading.enumerate()), 5,
             "the relay thread to end after close()")
    relay.notify(signal.SIGTERM)  # after close: ignored, never an error in a handler
