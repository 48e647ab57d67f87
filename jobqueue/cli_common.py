"""What the CLI's modules share: the error-to-exit-code group, the state passed to every
command, and small argument and output helpers."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import click
import redis

from .client import JobQueue
from .errors import (
    ConfigError,
    ConnectionFailed,
    InvalidRunId,
    JobQueueError,
    OperationRefused,
    PayloadError,
    RunNotFound,
    UnknownTask,
)

EXIT_REFUSED, EXIT_USAGE, EXIT_UNREACHABLE = 1, 2, 3

def exit_code(exc: JobQueueError) -> int:
    if isinstance(exc, ConnectionFailed):
        return EXIT_UNREACHABLE
    if isinstance(exc, ConfigError | PayloadError | InvalidRunId | UnknownTask):
        return EXIT_USAGE
    if isinstance(exc, OperationRefused | RunNotFound):
        return EXIT_REFUSED
    return EXIT_REFUSED


class Group(click.Group):
    """Turns jobqueue's typed errors into one line and an exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except JobQueueError as exc:
            click.echo(f"error: {exc}", err=True)
            ctx.exit(exit_code(exc))
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
            # The server went away after the first PING (restart, failover, network).
            click.echo(f"error: lost the connection to Redis: {exc}", err=True)
            ctx.exit(EXIT_UNREACHABLE)


class State:
    """ctx.obj: the URL, and the JobQueue once connected. A caller may pass one in (tests do,
    with a JobQueue over fakeredis: ``CliRunner().invoke(main, args, obj=State(None, jq))``)."""

    def __init__(self, url: str | None, jq: JobQueue | None = None) -> None:
        self.url = url
        self._jq: JobQueue | None = jq

    def jq(self, app: JobQueue | None = None) -> JobQueue:
        if app is not None:
            if self.url:
                app.use_url(self.url)
            self._jq = app
        if self._jq is None:
            self._jq = JobQueue.from_url(self.url)
        self._jq.connect()
        return self._jq


pass_state = click.make_pass_decorator(State)



def ms_to_text(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


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
    """What enqueue and trigger print: created, or already there (nothing written)."""
    if as_json:
        click.echo(
            json.dumps({"run_id": handle.run_id, "queue": handle.queue, "created": handle.created})
        )
    elif handle.created:
        click.echo(f"created {handle.run_id} in queue {handle.queue}{created_note}")
    else:
        click.echo(f"exists  {handle.run_id} in queue {handle.queue} (nothing written)")




yes_option = click.option(
    "--yes", is_flag=True, help="Accepted for scripts (this command changes one run; no prompt)."
)
