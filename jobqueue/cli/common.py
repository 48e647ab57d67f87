"""What the CLI's modules share: the error-to-exit-code group, the state passed to every
command, and small argument and output helpers."""

from __future__ import annotations

import importlib
import json
import logging
import math
import os
import re
import sys
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

import click
import redis

from jobqueue.anomalies import Anomaly, unique
from jobqueue.client.sync import JobQueue
from jobqueue.errors import (
    ConfigError,
    ConnectionFailed,
    InvalidRunId,
    JobQueueError,
    OperationRefused,
    PayloadError,
    RunNotFound,
    UnknownTask,
)
from jobqueue.store.embedded import ENV_URL, configured_url

EXIT_REFUSED, EXIT_USAGE, EXIT_UNREACHABLE = 1, 2, 3
# What a shell reports for a process ended by SIGINT (128 + 2): Ctrl-C is not a refusal.
EXIT_INTERRUPTED = 130


def exit_code(exc: JobQueueError) -> int:
    if isinstance(exc, ConnectionFailed):
        return EXIT_UNREACHABLE
    if isinstance(exc, ConfigError | PayloadError | InvalidRunId):
        return EXIT_USAGE
    # An unknown task is "not found", like an unknown run.
    if isinstance(exc, OperationRefused | RunNotFound | UnknownTask):
        return EXIT_REFUSED
    return EXIT_REFUSED


_LINE_BREAKING = re.compile(r"[\x00-\x1f\x7f\x85\u2028\u2029]")


def one_line(text: str) -> str:
    """A message as one line: control characters, which a message may quote from a user's
    argument or from Redis (a foreign job id, a queue name, a Lua error), are escaped as
    ``\\n`` etc. rather than breaking the line that scripts and the README promise."""
    return _LINE_BREAKING.sub(lambda m: m.group().encode("unicode_escape").decode(), text)


def one_line_usage(exc: click.UsageError) -> click.UsageError:
    """Click's usage error (Usage, Try, Error) with its Error line kept one line: Click quotes
    arguments as given, e.g. "Got unexpected extra argument (q<newline>)"."""
    text = exc.format_message()
    if text == one_line(text):
        return exc
    return click.UsageError(one_line(text), exc.ctx)


class FiniteFloat(click.FloatRange):
    """click.FloatRange that also refuses NaN and infinity: NaN passes every range check
    (all its comparisons are false), so ``--interval nan`` was a busy loop."""

    name = "finite float"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number


def invoke_translating(ctx: click.Context, invoke: Any) -> Any:
    """``invoke()``, with jobqueue's typed errors turned into one line and an exit code."""
    try:
        return invoke()
    except click.UsageError as exc:
        raise one_line_usage(exc) from None
    except KeyboardInterrupt:
        # click would print "Aborted!" and exit 1, the code of a refusal.
        click.echo("\nAborted!", err=True)
        ctx.exit(EXIT_INTERRUPTED)
    except JobQueueError as exc:
        click.echo(f"error: {one_line(str(exc))}", err=True)
        ctx.exit(exit_code(exc))
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
        # The server went away after the first PING (restart, failover, network).
        click.echo(f"error: lost the connection to Redis: {exc}", err=True)
        ctx.exit(EXIT_UNREACHABLE)


class Group(click.Group):
    """Turns jobqueue's typed errors into one line and an exit code."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            raise one_line_usage(exc) from None

    def invoke(self, ctx: click.Context) -> Any:
        return invoke_translating(ctx, lambda: super(Group, self).invoke(ctx))


def load_app(spec: str) -> JobQueue:
    """``module`` or ``module:attribute`` naming a JobQueue (the operator's own code)."""
    module_name, _, attr = spec.partition(":")
    if not module_name.strip() or module_name.startswith("."):
        raise ConfigError(
            f"--app {spec!r} names no module (expected module:attribute, e.g. app:jq)"
        )
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # like uvicorn/celery: apps next to where you run
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"cannot import app module {module_name!r}: {exc}") from None
    except Exception as exc:  # the app's own code failed: its error, not ours
        logging.getLogger("jobqueue").debug("importing %r failed", module_name, exc_info=True)
        raise ConfigError(
            f"importing {module_name!r} raised {type(exc).__name__}: {exc} "
            "(--log-level debug shows the traceback)"
        ) from None
    app = getattr(module, attr or "jq", None)
    if type(app).__name__ == "AsyncJobQueue":  # not imported here: aio is for apps
        raise ConfigError(
            f"{spec!r} is an AsyncJobQueue, a client for asyncio apps; the daemons need a "
            "JobQueue with the tasks registered on it (`async def` tasks included: the worker "
            "runs them on its own event loop)"
        )
    if not isinstance(app, JobQueue):
        raise ConfigError(f"{spec!r} is not a JobQueue (expected module:attribute, e.g. app:jq)")
    return app


# Commands that may run on a private throwaway server without --embedded, with a warning:
# they only read (nothing is lost), or they are daemons that serve whatever server they get.
# Every other command changes data that would die with the server, and is refused.
NO_URL_WARNS = frozenset(
    {
        "show", "leases", "runs", "queues", "stats", "workers", "dead list", "check", "top",
        "schedules", "schedules list", "schedules show", "schedules partitions",
        "worker", "scheduler", "dashboard",
    }
)  # fmt: skip
NO_URL = f"no Redis URL: pass --redis-url or set {ENV_URL}"
THROWAWAY_WARNING = (
    f"warning: {NO_URL}; using a private throwaway server: nothing persists after this command"
)


def command_path() -> str:
    """The running subcommand without the program name, e.g. "dead retry"; the older group
    name ``schedule`` counts as ``schedules``."""
    ctx, names = click.get_current_context(silent=True), []
    while ctx is not None and ctx.parent is not None:
        names.append(ctx.info_name or "")
        ctx = ctx.parent
    names.reverse()
    if names and names[0] == "schedule":
        names[0] = "schedules"
    return " ".join(names)


class State:
    """ctx.obj: the URL, and the JobQueue once connected. A caller may pass one in (tests do,
    with a JobQueue over fakeredis: ``CliRunner().invoke(main, args, obj=State(None, jq))``).

    ``embedded``: the user asked for a private throwaway server (--embedded) when no URL is
    configured; without it, commands whose effect would die with that server are refused."""

    def __init__(self, url: str | None, jq: JobQueue | None = None, embedded: bool = False) -> None:
        self.url = url
        self.embedded = embedded
        self._jq: JobQueue | None = jq

    def jq(
        self, app: JobQueue | None = None, *, patient: bool = False, timeout: float | None = None
    ) -> JobQueue:
        """The JobQueue, connected. ``patient`` (the daemons): while Redis is unreachable,
        try again with a back-off, for ever or for ``timeout`` seconds."""
        if app is not None:
            if self.url is not None:
                app.use_url(self.url)  # refuses an empty one
            self._jq = app
        if self._jq is None:
            self._jq = JobQueue.from_url(self.url)
        if not self._jq.connected and configured_url(self._jq.url) is None:
            self._no_url()
        if patient:
            from jobqueue.runtime.startup import connect_when_up

            connect_when_up(self._jq, timeout)
        else:
            self._jq.connect()
        return self._jq

    def _no_url(self) -> None:
        if self.embedded:
            return
        if command_path() not in NO_URL_WARNS:
            raise ConfigError(
                f"{NO_URL} (or --embedded to use a private throwaway server that keeps nothing)"
            )
        click.echo(THROWAWAY_WARNING, err=True)


pass_state = click.make_pass_decorator(State)



def warn_anomalies(anomalies: Iterable[Anomaly]) -> None:
    """Foreign or corrupt data a reading command met: one ``anomaly:`` line each on stderr
    (stdout stays the listing, or one JSON document), the exit code unchanged."""
    for anomaly in unique(anomalies):
        click.echo(f"anomaly: {one_line(str(anomaly))}", err=True)


def anomaly_cell(anomalies: Sequence[Anomaly]) -> str:
    """A marked row's last cell: its first anomaly, short (the full text is on stderr)."""
    if not anomalies:
        return ""
    first = anomalies[0]
    # The key without its hash tag ("due", "stats", "run:<id>"): the row says which partition.
    text = f"{first.key.rpartition('}:')[2]}: {first.problem}"
    more = f" (+{len(anomalies) - 1})" if len(anomalies) > 1 else ""
    return text[:60] + more


def ms_to_text(ms: int | None) -> str:
    if ms is None:
        return "-"
    try:
        return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")
    except (ValueError, OverflowError, OSError):  # foreign data: no date is that far out
        return f"{ms} ms (not a date)"


def json_arg(text: str, what: str, kind: type) -> Any:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise click.BadParameter(f"not valid JSON: {exc}", param_hint=what) from None
    except RecursionError:
        raise click.BadParameter("JSON nested too deeply", param_hint=what) from None
    if not isinstance(value, kind):
        raise click.BadParameter(f"must be a JSON {kind.__name__}", param_hint=what)
    return value


def echo_handle(handle: Any, as_json: bool, created_note: str = "") -> None:
    """What enqueue and trigger print: created, or already there (nothing written), or under
    a deduplication key deduplicated or replaced (the run holding the key)."""
    outcome = handle.outcome
    if as_json:
        click.echo(
            json.dumps(
                {
                    "run_id": handle.run_id,
                    "queue": handle.queue,
                    "created": handle.created,
                    "outcome": outcome,
                }
            )
        )
    elif outcome == "deduplicated":
        click.echo(f"deduplicated: {handle.run_id} in queue {handle.queue} holds the key "
                   "(nothing written)")
    elif outcome == "replaced":
        click.echo(f"replaced the arguments and due time of {handle.run_id} in queue "
                   f"{handle.queue}")
    elif handle.created:
        click.echo(f"created {handle.run_id} in queue {handle.queue}{created_note}")
    else:
        click.echo(f"exists  {handle.run_id} in queue {handle.queue} (nothing written)")




yes_option = click.option(
    "--yes", is_flag=True, help="Accepted for scripts (this command changes one run; no prompt)."
)
