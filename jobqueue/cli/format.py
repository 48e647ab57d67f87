"""How the CLI and ``jobqueue top`` write times and tables: pure functions, no I/O. Times are
written by ``jobqueue.policy.timeutil`` (the dashboard's too), re-exported here."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jobqueue.policy.timeutil import abs_time, duration, relative, when

__all__ = ["abs_time", "duration", "rate", "relative", "table", "table_lines", "when"]


def rate(count: int | None, window_ms: int | None) -> str:
    """A rate limit as the CLI writes it: '50/1.0s', '600/1m30s'; '-' for none."""
    if count is None or window_ms is None:
        return "-"
    return f"{count}/{duration(window_ms)}"


def table(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> str:
    """Left-aligned columns two spaces apart, headers first; trailing blanks trimmed."""
    return "\n".join(table_lines(rows, headers))


def table_lines(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> list[str]:
    cells = [[str(h) for h in headers], *[[str(c) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
