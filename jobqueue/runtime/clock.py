"""The clock a daemon measures durations and deadlines by, behind one small interface, so that
tests can drive leases, heartbeats, timeouts and back-off on a fake clock instead of sleeping.

What decides a run's fate is still the Redis server's clock: every script takes a ``now``, and
the real clock passes none (``now_ms()`` is None: the server's TIME decides). A fake clock
passes its own, so the server sees the test's time too, and a lease expires only when the
test moves the clock past it.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a clock that never goes back, for durations and deadlines."""
        ...

    def now_ms(self) -> int | None:
        """The ``now`` to give scripts: None lets the Redis server's clock decide."""
        ...

    def sleep(self, seconds: float) -> None:
        """Block for ``seconds`` of this clock's time."""
        ...

    def wait(self, event: threading.Event, timeout: float) -> bool:
        """Block until ``event`` is set (True) or ``timeout`` seconds of this clock's time
        have passed (False, unless it was set meanwhile)."""
        ...


class RealClock:
    """The process's monotonic clock; scripts read the server's."""

    def monotonic(self) -> float:
        return time.monotonic()

    def now_ms(self) -> int | None:
        return None

    def sleep(self, seconds: float) -> None:
        time.sleep(max(seconds, 0.0))

    def wait(self, event: threading.Event, timeout: float) -> bool:
        return event.wait(max(timeout, 0.0))


REAL_CLOCK = RealClock()


class FakeClock:
    """A clock for tests: it moves only when :meth:`advance` says so. Sleepers and waiters
    wake once it passes their deadline; a waiter also wakes when its event is set (checked
    every few milliseconds of real time). ``now_ms`` starts at ``now_ms`` and moves with it:
    start it ahead of the server's clock and every run enqueued meanwhile is due."""

    POLL_S = 0.005

    def __init__(self, now_ms: int = 0, monotonic: float = 1000.0) -> None:
        self._start_ms = now_ms
        self._start = monotonic
        self._now = monotonic
        self._moved = threading.Condition(threading.Lock())

    def monotonic(self) -> float:
        return self._now

    def now_ms(self) -> int:
        return self._start_ms + round((self._now - self._start) * 1000)

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock never goes back")
        with self._moved:
            self._now += seconds
            self._moved.notify_all()

    def sleep(self, seconds: float) -> None:
        deadline = self._now + seconds
        with self._moved:
            while self._now < deadline:
                self._moved.wait()

    def wait(self, event: threading.Event, timeout: float) -> bool:
        deadline = self._now + timeout
        while not event.is_set():
            with self._moved:
                if self._now >= deadline:
                    return event.is_set()
                self._moved.wait(self.POLL_S)
        return True
