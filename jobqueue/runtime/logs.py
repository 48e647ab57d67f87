"""Logging for the daemons: human-readable lines by default, one JSON object per line with
``--log-format json`` (for log shippers).

Every line about a run carries ``run_id``, ``fence`` and ``attempt``: the daemons pass them
with ``extra=run_fields(run)``; the text format prints them inside the message already, the
JSON format as fields of their own (and ``task``, ``queue``, ``outcome``, ``duration_ms`` on
the line of a finished run). With JSON logs the worker also turns what tasks print into log
lines (``capture_task_output``), so the stream stays one JSON object per line. Passwords in
URLs are masked in both formats, whatever the message (the same rule as
``connection.redact``), so a log line never leaks credentials.
"""

from __future__ import annotations

import io
import json
import logging
import sys
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

from jobqueue.context import current_run
from jobqueue.errors import JobQueueError
from jobqueue.store.connection import redact

LogFormat = Literal["text", "json"]
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
RUN_FIELDS = ("run_id", "fence", "attempt")
# also given as fields of their own in JSON, when a line has them
EXTRA_FIELDS = ("task", "queue", "outcome", "duration_ms", "stream")
TASK_OUTPUT_LOGGER = "jobqueue.task"


class RunLike(Protocol):
    @property
    def run_id(self) -> str: ...
    @property
    def fence(self) -> int: ...
    @property
    def attempt(self) -> int: ...


def log_with_traceback(
    logger: logging.Logger,
    level: int,
    msg: str,
    *args: Any,
    traceback: str | None,
    extra: dict[str, Any],
) -> None:
    """Log a line with a traceback already formatted (a failed attempt's, bounded by
    Settings.traceback_max_*): it goes where an exception's would, after the message in the
    text format and as ``exc`` in JSON, through any handler with a standard Formatter."""
    if not logger.isEnabledFor(level):
        return
    record = logger.makeRecord(logger.name, level, "(jobqueue)", 0, msg, args, None, extra=extra)
    if traceback:
        record.exc_text = traceback.rstrip("\n")
    logger.handle(record)


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
        for name in RUN_FIELDS + EXTRA_FIELDS:
            if hasattr(record, name):
                out[name] = getattr(record, name)
        if record.exc_info:
            out["exc"] = redact(self.formatException(record.exc_info))
        elif record.exc_text:  # a traceback formatted before (log_with_traceback)
            out["exc"] = redact(record.exc_text)
        return json.dumps(out, default=str)


class _Handler(logging.StreamHandler):  # type: ignore[type-arg]
    """Ours, so that a second ``configure`` replaces it instead of doubling every line.

    Writes to whatever ``sys.stderr`` is at the time of each line (like logging's last-resort
    handler), not the stream of the first call: in-process CLI invocations (tests, embedding)
    swap stderr and close the old one.
    """

    @property
    def stream(self) -> Any:
        stream = sys.stderr
        # captured task output is logged through this handler: write where it would have gone
        return stream.original if isinstance(stream, TaskOutput) else stream

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


def json_configured() -> bool:
    """Whether configure() installed the JSON format."""
    return any(
        isinstance(h, _Handler) and isinstance(h.formatter, JsonFormatter)
        for h in logging.getLogger().handlers
    )


class TaskOutput(io.TextIOBase):
    """A stand-in for sys.stdout / sys.stderr that logs each line written to it (logger
    ``jobqueue.task``; stdout at INFO, stderr at WARNING; ``stream`` says which), with the run
    fields of the run printing it. Lines are gathered per thread, so runs printing at once do
    not mix; a line still unfinished is logged at flush()."""

    def __init__(self, original: Any, name: str, level: int) -> None:
        super().__init__()
        self.original = original
        self.name = name
        self.level = level
        self._log = logging.getLogger(TASK_OUTPUT_LOGGER)
        self._local = threading.local()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "utf-8"

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def write(self, text: str) -> int:
        local = self._local
        if getattr(local, "emitting", False):  # logging's own complaints: never loop
            return int(self.original.write(text))
        pending = getattr(local, "pending", "") + text
        *lines, local.pending = pending.split("\n")
        for line in lines:
            self._emit(line)
        return len(text)

    def flush(self) -> None:
        local = self._local
        if getattr(local, "pending", "") and not getattr(local, "emitting", False):
            line, local.pending = local.pending, ""
            self._emit(line)

    def _emit(self, line: str) -> None:
        local = self._local
        local.emitting = True
        try:
            extra: dict[str, Any] = {"stream": self.name}
            try:
                ctx = current_run()
            except JobQueueError:
                pass  # printed outside a run (the app's import, a thread of its own)
            else:
                extra.update(run_fields(ctx), task=ctx.task, queue=ctx.queue)
            self._log.log(self.level, "%s", line, extra=extra)
        finally:
            local.emitting = False


def capture_task_output() -> Callable[[], None]:
    """Route sys.stdout and sys.stderr through logging (see TaskOutput); returns the undo."""
    saved = sys.stdout, sys.stderr
    sys.stdout = TaskOutput(saved[0], "stdout", logging.INFO)
    sys.stderr = TaskOutput(saved[1], "stderr", logging.WARNING)

    def restore() -> None:
        for stream in (sys.stdout, sys.stderr):
            if isinstance(stream, TaskOutput):
                stream.flush()
        sys.stdout, sys.stderr = saved

    return restore
