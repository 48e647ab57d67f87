"""Conversions of user-facing times (seconds, timedelta, datetime) to the ms the scripts use,
and back to text for people (the CLI and the dashboard).

Nothing here reads a clock: the due time of a delayed run is computed by Redis (now + delay).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

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


_AGO = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_AGO_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}


def when_to_ms(text: str, now_ms: int, what: str = "time") -> int:
    """A time a person types, in ms: a duration ago ('90s', '10m', '2h', '1d', '1w'), or an
    ISO 8601 time ('2026-12-04T10:00', UTC unless it names its zone). ConfigError names
    what is wrong."""
    value = text.strip()
    ago = _AGO.fullmatch(value)
    if ago:
        return now_ms - _finite_ms(float(ago.group(1)) * _AGO_SECONDS[ago.group(2)], what)
    try:
        at = datetime.fromisoformat(value)
    except ValueError:
        raise ConfigError(
            f"{what}: {text[:60]!r} is neither a duration ago (10m, 2h, 1d) nor an ISO time "
            "(2026-12-04T10:00)"
        ) from None
    return int((at if at.tzinfo is not None else at.replace(tzinfo=UTC)).timestamp() * 1000)


def seconds_to_ms(value: float, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ConfigError(f"{what} must be a positive number of seconds, not {value!r}")
    return max(1, int(value * 1000))


# -- showing times -------------------------------------------------------------------------
# Both ways: absolute (UTC, so two operators in different zones read the same thing) and
# relative to the server's clock (what matters at 3 a.m.: "due 4 minutes ago"). The CLI and
# the dashboard write times with these.


def abs_time(ms: int | None) -> str:
    """``2026-11-29 23:01:02`` (UTC), or ``-``."""
    if ms is None:
        return "-"
    try:
        return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")
    except (ValueError, OverflowError, OSError):  # foreign data: no date is that far out
        return f"{ms} ms (not a date)"


def duration(ms: int | None) -> str:
    """Signed duration, e.g. ``12.3s``, ``-4.0s`` (expired), ``5m07s``, ``2h05m``, ``3d04h``."""
    if ms is None:
        return "-"
    sign, ms = ("-" if ms < 0 else ""), abs(ms)
    if ms < 60_000:
        return f"{sign}{ms / 1000:.1f}s"
    if ms < 3_600_000:
        return f"{sign}{ms // 60_000}m{(ms // 1000) % 60:02d}s"
    if ms < 86_400_000:
        return f"{sign}{ms // 3_600_000}h{(ms // 60_000) % 60:02d}m"
    return f"{sign}{ms // 86_400_000}d{(ms // 3_600_000) % 24:02d}h"


def relative(ms: int | None, now_ms: int) -> str:
    """``in 5.0s`` or ``3m02s ago`` from the server's ``now``."""
    if ms is None:
        return "-"
    delta = ms - now_ms
    return f"in {duration(delta)}" if delta > 0 else f"{duration(-delta)} ago"


def when(ms: int | None, now_ms: int) -> str:
    """Absolute and relative: ``2026-11-29 23:01:02 (3.2s ago)``."""
    if ms is None:
        return "-"
    return f"{abs_time(ms)} ({relative(ms, now_ms)})"


# Instants the scripts write into history lines as epoch ms ("retry at 1796194568799",
# "due at ...", "due=..."): shown like every other time by the CLI and the dashboard.
_EPOCH_IN_TEXT = re.compile(r"((?:retry at|due at|due=) ?)(\d{12,})")


def instants_shown(text: str, show: Callable[[int], str]) -> str:
    """``text`` with the epoch-ms instants a history line holds rendered by ``show``."""
    return _EPOCH_IN_TEXT.sub(lambda m: m.group(1) + show(int(m.group(2))), text)
