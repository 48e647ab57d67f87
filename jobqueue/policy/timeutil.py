"""Conversions of user-facing times (seconds, timedelta, datetime) to the ms the scripts use.

Nothing here reads a clock: the due time of a delayed run is computed by Redis (now + delay).
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta

from jobqueue.errors import ConfigError

Delay = float | int | timedelta
Instant = datetime | float | int


def delay_to_ms(delay: Delay | None) -> int:
    if delay is None:
        return 0
    seconds = delay.total_seconds() if isinstance(delay, timedelta) else delay
    if (
        not isinstance(seconds, int | float)
        or isinstance(seconds, bool)
        or not math.isfinite(seconds)
    ):
        raise ConfigError(f"delay must be a number of seconds or a timedelta, not {delay!r}")
    if seconds < 0:
        raise ConfigError(f"delay must not be negative (got {seconds} s)")
    return _finite_ms(seconds, "delay")


def _finite_ms(seconds: float, what: str) -> int:
    ms = seconds * 1000
    if not math.isfinite(ms):  # finite seconds can overflow to infinity in ms
        raise ConfigError(f"{what} of {seconds} s is out of range")
    return int(ms)


def instant_to_ms(at: Instant) -> int:
    """An aware datetime or epoch seconds; a naive datetime is refused (which zone would it be?)."""
    if isinstance(at, datetime):
        if at.tzinfo is None or at.utcoffset() is None:
            raise ConfigError(
                f"at={at.isoformat()} has no time zone; pass an aware datetime "
                "(e.g. datetime.now(timezone.utc) + ...)"
            )
        return int(at.timestamp() * 1000)
    if isinstance(at, bool) or not isinstance(at, int | float) or not math.isfinite(at):
        raise ConfigError(f"at must be an aware datetime or epoch seconds, not {at!r}")
    return _finite_ms(at, "at")


def seconds_to_ms(value: float, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ConfigError(f"{what} must be a positive number of seconds, not {value!r}")
    return max(1, int(value * 1000))
