"""How the CLI and ``jobqueue top`` write times and tables: pure functions, no I/O.

Times are shown both ways: absolute (UTC, so two operators in different zones read the same
thing) and relative to the server's clock (what matters at 3 a.m.: "due 4 minutes ago").
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any


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


def table(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> str:
    """Left-aligned columns two spaces apart, headers first; trailing blanks trimmed."""
    return "\n".join(table_lines(rows, headers))


def table_lines(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> list[str]:
    cells = [[str(h) for h in headers], *[[str(c) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
