"""Logging for the daemons: human-readable lines by default, one JSON object per line with
``--log-format json`` (for log shippers).

Every line about a run carries ``run_id``, ``fence`` and ``attempt``: the daemons pass them
with ``extra=run_fields(run)``; the text format prints them inside the message already, the
JSON format as fields of their own. Passwords in URLs are masked in both formats, whatever
the message (the same rule as ``connection.redact``), so a log line never leaks credentials.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

from jobqueue.store.connection import redact

LogFormat = Literal["text", "json"]
FORMATS: tuple[LogFormat, ...] = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
RUN_FIELDS = ("run_id", "fence", "attempt")


class RunLike(Protocol):
    @property
    def run_id(self) -> str: ...
    @property
    def fence(self) -> int: ...
    @property
    def attempt(self) -> int: ...


def run_fields(run: RunLike) -> dict[str, Any]:
    """The ``extra=`` of a log call about one run."""
    return {"run_id": run.run_id, "fence": run.fence, "attempt": run.attempt}


class RedactingFilter(logging.Filter):
    """Masks URL passwords in the final message (arguments included)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        masked = redact(message)
        if masked != message:
            record.msg, record.args = masked, None
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts (UTC, ms), level, logger, msg, the run fields when the
    line is about a run, and exc (the traceback text) when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for name in RUN_FIELDS:
            if hasattr(record, name):
                out[name] = getattr(record, name)
        if record.exc_info:
            out["exc"] = redact(self.formatException(record.exc_info))
        return json.dumps(out, default=str)


class _Handler(logging.StreamHandler):  # type: ignore[type-arg]
    """Ours, so that a second ``configure`` replaces it instead of doubling every line.

    Writes to whatever ``sys.stderr`` is at the time of each line (like logging's last-resort
    handler), not the stream of the first call: in-process CLI invocations (tests, embedding)
    swap stderr and close the old one.
    """

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def configure(level: str = "INFO", fmt: LogFormat = "text") -> None:
    """Install one stderr handler on the root logger (replacing any from an earlier call)."""
    handler = _Handler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    handler.addFilter(RedactingFilter())
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _Handler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
