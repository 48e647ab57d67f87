"""The clock the worker measures time by (jobqueue.runtime.clock): the real one lets the Redis
server's clock decide, a fake one moves only when a test says so."""

from __future__ import annotations

import threading

import pytest
from helpers import wait_for

from jobqueue.runtime.clock import REAL_CLOCK, FakeClock


def test_the_real_clock_passes_no_time_to_the_scripts() -> None:
    assert REAL_CLOCK.now_ms() is None  # the server's TIME decides


def test_the_real_clock_waits_on_its_event() -> None:
    event = threading.Event()
    event.set()
    assert REAL_CLOCK.wait(event, 5.0) is True


def test_a_fake_clock_moves_only_when_advanced_and_its_ms_with_it() -> None:
    clock = FakeClock(now_ms=5_000, monotonic=100.0)
    assert (clock.monotonic(), clock.now_ms()) == (100.0, 5_000)
    clock.advance(1.25)
    assert (clock.monotonic(), clock.now_ms()) == (101.25, 6_250)


def test_a_fake_sleep_ends_once_the_clock_has_moved_past_it() -> None:
    clock = FakeClock()
    woke = threading.Event()
    sleeper = threading.Thread(target=lambda: (clock.sleep(1.0), woke.set()), daemon=True)
    sleeper.start()
    clock.advance(0.5)
    assert not woke.wait(0.05)
    clock.advance(0.5)
    assert woke.wait(5)


def test_a_fake_wait_ends_at_its_timeout_on_the_clock_or_when_its_event_is_set() -> None:
    clock = FakeClock()
    event = threading.Event()
    results: list[bool] = []
    waiter = threading.Thread(target=lambda: results.append(clock.wait(event, 2.0)), daemon=True)
    waiter.start()
    clock.advance(2.0)
    waiter.join(5)
    assert results == [False]

    waiter = threading.Thread(target=lambda: results.append(clock.wait(event, 2.0)), daemon=True)
    waiter.start()
    event.set()
    wait_for(lambda: len(results) == 2, what="the waiter")
    assert results == [False, True]


def test_a_fake_clock_never_goes_back() -> None:
    clock = FakeClock()
    with pytest.raises(ValueError):
        clock.advance(-1.0)
    assert clock.monotonic() == 1000.0
