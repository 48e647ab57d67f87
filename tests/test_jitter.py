"""Jitter: a fixed, per-job offset that spreads a herd of same-time jobs over a window."""

from __future__ import annotations

import pytest

from jobqueue.policy.hashing import fnv1a_32
from jobqueue.policy.jitter import herd_histogram, jitter_ms, job_hash


def test_jitter_is_the_fnv1a_hash_of_the_job_id_modulo_the_window() -> None:
    assert jitter_ms("report", 60_000) == fnv1a_32("report") % 60_000


@pytest.mark.parametrize("job_id", ["job-42", "", "réunion", "日報", "emoji-\U0001f600"])
def test_the_fast_job_hash_is_fnv1a_for_ascii_and_other_ids(job_id: str) -> None:
    assert job_hash(job_id) == fnv1a_32(job_id)


def test_jitter_is_a_pure_function_of_job_id_and_window() -> None:
    # FNV-1a("a") = 0xE40C292C is the published test vector: every process, every host agrees.
    assert jitter_ms("a", 1000) == 0xE40C292C % 1000 == 220


def test_jitter_stays_inside_the_window() -> None:
    offsets = [jitter_ms(f"job-{i}", 7) for i in range(1000)]
    assert min(offsets) == 0
    assert max(offsets) == 6


@pytest.mark.parametrize("window_ms", [0, -1])
def test_jitter_is_zero_without_a_window(window_ms: int) -> None:
    assert jitter_ms("report", window_ms) == 0


def test_a_herd_of_100000_jobs_over_60_seconds_gives_1599_to_1730_per_second() -> None:
    per_second = herd_histogram(100_000, 60)

    assert len(per_second) == 60
    assert sum(per_second) == 100_000
    assert min(per_second) == 1_599
    assert max(per_second) == 1_730


def test_without_jitter_the_whole_herd_fires_in_second_zero() -> None:
    assert herd_histogram(100_000, 0) == [100_000]


def test_herd_histogram_counts_each_job_at_its_jitter_second() -> None:
    per_second = herd_histogram(3, 10, prefix="tenant-")

    expected = [0] * 10
    for i in range(3):
        expected[jitter_ms(f"tenant-{i}", 10)] += 1
    assert per_second == expected


def test_herd_histogram_rejects_a_negative_job_count() -> None:
    with pytest.raises(ValueError, match="n_jobs"):
        herd_histogram(-1, 60)
