"""The back-off every retry and cool-down loop of the worker uses (jobqueue.policy.backoff)."""

from __future__ import annotations

import random

import pytest

from jobqueue.policy.backoff import Backoff


def test_without_jitter_the_pause_starts_at_base_and_doubles_up_to_the_cap() -> None:
    backoff = Backoff(0.5, 10.0, jitter=False)
    assert [backoff.next() for _ in range(8)] == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0, 10.0]


def test_reset_starts_again_at_base() -> None:
    backoff = Backoff(0.1, 5.0, jitter=False)
    for _ in range(4):
        backoff.next()
    backoff.reset()
    assert backoff.next() == 0.1


def test_with_jitter_each_pause_is_drawn_between_half_and_all_of_its_ceiling() -> None:
    backoff = Backoff(0.1, 5.0, rng=random.Random(7))
    ceilings = [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0]
    for ceiling in ceilings:
        assert ceiling / 2 <= backoff.next() <= ceiling


def test_relax_shrinks_the_next_pause_towards_base_but_never_below() -> None:
    backoff = Backoff(0.5, 10.0, jitter=False)
    for _ in range(6):
        backoff.next()  # the next would be 10
    backoff.relax(0.5)
    assert backoff.next() == 5.0  # and the one after doubles again
    for _ in range(20):
        backoff.relax(0.5)
    assert backoff.next() == 0.5


@pytest.mark.parametrize(("base", "cap"), [(0.0, 1.0), (-1.0, 1.0), (2.0, 1.0)])
def test_a_base_that_is_not_positive_or_above_the_cap_is_refused(base: float, cap: float) -> None:
    with pytest.raises(ValueError):
        Backoff(base, cap)
