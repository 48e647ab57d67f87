"""Settings: the tunables every process shares, validated at construction; and the run
context's fenced-write arguments."""

from __future__ import annotations

import math

import pytest

from jobqueue.context import RunContext
from jobqueue.errors import ConfigError
from jobqueue.settings import Settings


@pytest.mark.parametrize("field", ["done_retention_s", "dead_retention_s", "default_lease_s"])
@pytest.mark.parametrize("value", [0, -1, math.nan, math.inf])
def test_a_retention_or_lease_that_is_not_a_positive_finite_number_is_refused(
    field: str, value: float
) -> None:
    with pytest.raises(ConfigError):
        Settings(**{field: value})


def test_a_sub_millisecond_retention_or_lease_becomes_one_millisecond_never_zero() -> None:
    """The scripts read 0 ms as 'no expiry': a tiny positive setting must not mean forever."""
    tiny = Settings(done_retention_s=0.0004, dead_retention_s=0.0001, default_lease_s=0.0002)
    assert (tiny.done_retention_ms, tiny.dead_retention_ms, tiny.default_lease_ms) == (1, 1, 1)


def test_seconds_become_whole_milliseconds_without_float_noise() -> None:
    assert Settings(default_lease_s=0.3, done_retention_s=1.001).default_lease_ms == 300
    assert Settings(done_retention_s=1.001).done_retention_ms == 1001


def written(calls: list[tuple[str, str, int, str, float | None]]) -> RunContext:
    def writer(resource: str, value: str, fence: int, run_id: str, ttl: float | None) -> bool:
        calls.append((resource, value, fence, run_id, ttl))
        return True

    return RunContext(
        run_id="r",
        fence=7,
        attempt=1,
        max_attempts=3,
        task="t",
        queue="default",
        job_id="",
        scheduled_for_ms=None,
        _writer=writer,
    )


def test_fenced_write_passes_the_runs_fence_and_the_ttl() -> None:
    calls: list[tuple[str, str, int, str, float | None]] = []
    ctx = written(calls)
    assert ctx.fenced_write("res", "v", ttl=60)
    assert ctx.fenced_write("res", "w")
    assert calls == [("res", "v", 7, "r", 60), ("res", "w", 7, "r", None)]


@pytest.mark.parametrize("ttl", [0, -5, math.nan, math.inf])
def test_fenced_write_refuses_a_ttl_that_is_not_positive(ttl: float) -> None:
    with pytest.raises(ValueError, match="ttl must be positive"):
        written([]).fenced_write("res", "v", ttl=ttl)
