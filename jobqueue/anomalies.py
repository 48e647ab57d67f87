"""Foreign or corrupt data met in jobqueue's own keys, and how reading paths carry it.

jobqueue writes its keys in one shape only (see ``keys.py``), but another program, a hand-typed
``redis-cli`` command or a half-restored backup can leave something else there: a string
where a sorted set belongs, a counter that says ``many``, a partition count of ``99999999``.
A reading path (a listing, ``show``, a dashboard page, metrics) must then neither crash nor
hang: it reads what it can and reports each such finding as an :class:`Anomaly`, on the row
it concerns or beside the listing (:class:`Listing`). A command that cannot do what was asked
because of such data raises ``CorruptData`` (exit 1), naming the key.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import redis

T = TypeVar("T")

# The latest instant a time in ms may be: 9999-12-31T23:59:59.999Z, the last one datetime can
# show (jobqueue's own latest is the buffer-one hold, 9999-12-31). A score or field beyond it
# (or before 1970) is foreign data: formatting it as a date would raise.
MAX_TIME_MS = 253402300799999

# What jobqueue writes for an integer: an optional minus and ASCII digits. int() would also
# take " 7", "7_0" or Arabic-Indic digits, none of which jobqueue ever stores.
_STORED_INT = re.compile(r"-?[0-9]{1,19}")


@dataclass(frozen=True)
class Anomaly:
    """One finding: the key (and field, when the key is a hash) and what is wrong with it."""

    key: str
    problem: str

    def __str__(self) -> str:
        return f"{self.key}: {self.problem}"

    def to_dict(self) -> dict[str, str]:
        return {"key": self.key, "problem": self.problem}


class Listing(list[T]):
    """A reading function's rows, plus ``anomalies``: what it met but could not show as a row
    (a definition that is not JSON, a key of the wrong type, a queue whose partition count is
    not usable), and ``truncated``: whether its limit left rows out. A list, so callers that
    only want the rows need not change."""

    def __init__(
        self, rows: Iterable[T] = (), anomalies: Iterable[Anomaly] = (), truncated: bool = False
    ) -> None:
        super().__init__(rows)
        self.anomalies: list[Anomaly] = list(anomalies)
        # True when more rows exist than the listing's limit let it show: a caller says so
        # (a top-N listing never passes for the whole).
        self.truncated = truncated


def stored_int(value: Any) -> int | None:
    """An integer as jobqueue stores it, or None for anything else (garbage, None, bytes)."""
    if isinstance(value, str) and _STORED_INT.fullmatch(value):
        return int(value)
    return None


def score_ms(score: Any) -> int | None:
    """A sorted-set score as the time in ms jobqueue stores, or None: no score, +-inf (which
    another program can store and ``int()`` cannot convert), or a time no date can show."""
    if isinstance(score, int | float) and math.isfinite(score) and is_time(int(score)):
        return int(score)
    return None


def is_time(ms: int) -> bool:
    """Whether ``ms`` is a time jobqueue could have stored (1970 to the end of year 9999)."""
    return 0 <= ms <= MAX_TIME_MS


def is_wrong_type(reply: Any) -> bool:
    """Whether a reply is Redis's WRONGTYPE error: the key holds another type than the
    command reads (a string where a hash belongs, ...)."""
    return isinstance(reply, redis.exceptions.ResponseError) and str(reply).startswith(
        "WRONGTYPE"
    )


def checked(reply: Any, key: str, kind: str, anomalies: list[Anomaly], empty: Any) -> Any:
    """A reply of a pipeline run with ``raise_on_error=False``: a WRONGTYPE error is recorded
    as an anomaly of ``key`` (which should be a ``kind``) and read as ``empty``, so the rest of
    the listing goes on; any other error (the server's, not the data's) is raised."""
    if is_wrong_type(reply):
        anomalies.append(Anomaly(key, f"holds another type, not a {kind}"))
        return empty
    if isinstance(reply, Exception):
        raise reply
    return reply


def unique(anomalies: Iterable[Anomaly]) -> list[Anomaly]:
    """Each anomaly once, in the order first met (a key read by several rows is one finding)."""
    return list(dict.fromkeys(anomalies))
