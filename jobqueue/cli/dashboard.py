"""The ``jobqueue dashboard`` command. Imports the web stack only when run, so the CLI works
without the ``dashboard`` extra and says in one line what to install when it is missing."""

from __future__ import annotations

import ipaddress
from typing import Any

import click

from jobqueue.cli.common import FiniteFloat
from jobqueue.dashboard.sampler import DEFAULT_SAMPLE_EVERY_S
from jobqueue.errors import ConfigError

EXTRA_MISSING = (
    "the dashboard needs starlette, jinja2 and uvicorn: pip install starlette jinja2 uvicorn "
    "(the dashboard extra of jobqueue-redis)"
)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535))
@click.option(
    "--auth",
    metavar="USER:PASSWORD",
    envvar="JOBQUEUE_DASHBOARD_AUTH",
    help="Require HTTP Basic auth (env JOBQUEUE_DASHBOARD_AUTH).",
)
@click.option(
    "--token",
    envvar="JOBQUEUE_DASHBOARD_TOKEN",
    help="Require this token: 'Authorization: Bearer T', or open /?token=T once in a browser "
    "(env JOBQUEUE_DASHBOARD_TOKEN).",
)
@click.option(
    "--insecure",
    is_flag=True,
    help="Allow a non-loopback --host without --auth or --token. The dashboard can retry, "
    "purge and cancel runs and pause schedules and queues: without auth, anyone who can "
    "reach the port can do that.",
)
@click.option(
    "--sample-every",
    default=DEFAULT_SAMPLE_EVERY_S,
    show_default=True,
    type=FiniteFloat(1),
    help="Seconds between the history sampler's looks: the first dashboard to look in a minute "
    "writes that minute's point of each queue's depth and lateness to Redis.",
)
@click.option(
    "--read-only",
    is_flag=True,
    help="Show no action button and refuse every change (403): a dashboard to look, not to "
    "retry, purge, cancel or pause.",
)
@click.option(
    "--connect-timeout",
    type=FiniteFloat(0),
    help="Seconds to keep trying while Redis is unreachable at start, then exit 3. "
    "[default: for ever, with a log line per try]",
)
@click.pass_obj
def dashboard(
    state: Any,
    host: str,
    port: int,
    auth: str | None,
    token: str | None,
    insecure: bool,
    sample_every: float,
    read_only: bool,
    connect_timeout: float | None,
) -> None:
    """Serve the web dashboard: queues with charts, leases, runs, schedules, dead runs,
    workers. Binds to loopback unless told otherwise."""
    try:
        import uvicorn

        from jobqueue.dashboard.app import create_app
        from jobqueue.dashboard.security import Credentials
    except ImportError:
        raise ConfigError(EXTRA_MISSING) from None
    if auth and token:
        raise ConfigError("give --auth or --token, not both")
    try:
        credentials = Credentials.parse_basic(auth) if auth else Credentials(token=token or None)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    loopback = is_loopback(host)
    if not loopback and not credentials.required and not insecure:
        raise ConfigError(
            f"refusing to serve on non-loopback {host} without --auth or --token "
            "(anyone reaching it could retry, purge or cancel runs); add --insecure to do so"
        )
    jq = state.jq(patient=True, timeout=connect_timeout)
    # A loopback dashboard checks the Host header: a web page cannot reach it by DNS
    # rebinding (a name of theirs resolving to 127.0.0.1).
    allowed = ["127.0.0.1", "localhost", "::1", "[::1]", host] if loopback else None
    app = create_app(
        jq,
        credentials=credentials,
        sample_every_s=sample_every,
        allowed_hosts=allowed,
        read_only=read_only,
    )
    shown = f"[{host}]" if ":" in host else host
    click.echo(f"jobqueue dashboard on http://{shown}:{port}/", err=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")
