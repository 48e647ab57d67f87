"""`jobqueue events`: the queues' event logs, newest first then as they come (--follow)."""

from __future__ import annotations

import json
import re
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import click

from jobqueue.cli.common import ms_to_text, one_line, pass_state, warn_anomalies
from jobqueue.cli.output import json_option
from jobqueue.errors import ConfigError
from jobqueue.store.events import KINDS, Event

_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def since_value(text: str) -> Any:
    """--since as the API takes it: a duration ago, a time, or the text itself (0, a cursor
    or an entry id, which the API checks)."""
    m = _DURATION.fullmatch(text.strip())
    if m:
        return timedelta(seconds=float(m.group(1)) * _UNITS[m.group(2)])
    if re.fullmatch(r"\d{4}-\d{2}-\d{2}([T ].*)?", text.strip()):
        try:
            at = datetime.fromisoformat(text.strip())
        except ValueError:
            raise ConfigError(f"--since: {text!r} is not an ISO 8601 time") from None
        return at if at.tzinfo is not None else at.replace(tzinfo=UTC)
    return text


def describe(ev: Event) -> str:
    """What an event adds, in words."""
    parts = []
    if ev.attempt is not None:
        parts.append(f"attempt {ev.attempt}")
    if ev.worker:
        parts.append(f"by {ev.worker}")
    if ev.task:
        parts.append(f"task {ev.task}")
    if ev.due_ms is not None:
        parts.append(f"due {ms_to_text(ev.due_ms)}")
    if ev.progress is not None:
        parts.append(f"{ev.progress:g}%")
    if ev.hand_backs is not None:
        parts.append(f"handed back {ev.hand_backs}x")
    if ev.state:
        parts.append(f"was {ev.state}")
    if ev.text:
        parts.append(ev.text)
    return one_line(", ".join(parts))[:200]


def _line(ev: Event, as_json: bool) -> str:
    if as_json:
        return json.dumps(ev.to_dict(), ensure_ascii=False)
    where = f"{ev.queue}#{ev.partition}"
    run = one_line(ev.run_id)
    return f"{ms_to_text(ev.at_ms)}  {where:<14} {ev.kind:<9}  {run}  {describe(ev)}"


@click.command()
@click.option("--queue", "queues", multiple=True,
              help="Only this queue (repeat for several). Default: every queue.")
@click.option("--run", "run_id", help="Only this run's events (its partition's log alone).")
@click.option("--kind", "kinds", multiple=True, type=click.Choice(KINDS),
              help="Only events of this kind (repeat for several).")
@click.option("--follow", "-f", is_flag=True,
              help="Then print the events as they come, until Ctrl-C.")
@click.option("--since",
              help="From there instead of the newest --limit: a cursor (--json gives each "
                   "event's), an entry id, a time (ISO 8601; UTC unless it says), a "
                   "duration ago (30s, 10m, 2h, 1d), or 0 for all the logs hold.")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(0, 100_000),
              help="Without --since: how many of the newest events to print first.")
@json_option
@pass_state
def events(
    state: Any,
    queues: tuple[str, ...],
    run_id: str | None,
    kinds: tuple[str, ...],
    follow: bool,
    since: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """What happened to runs, from the queues' event logs (one per queue partition, written
    by the same scripts that make each change): created, claimed, progress, retry,
    completed, dead, cancelled, expired (a lease taken back), refused (a stale commit),
    released, waiting and ready (workflows), ... Oldest first; with --json one object per
    line, each with the cursor that --since takes to go on right after it."""
    jq = state.jq()
    chosen = list(queues) or None
    picked = list(kinds) or None
    _note_logs_off(jq, chosen)
    try:
        if since is None:
            shown = jq.recent_events(chosen, limit=limit, run_id=run_id, kinds=picked)
            warn_anomalies(shown.anomalies)
            for ev in shown:
                click.echo(_line(ev, as_json))
            if not follow:
                return
            after: Any = shown[-1].cursor if shown else (0 if limit else None)
        else:
            after = since_value(since)
        stream = jq.events(chosen, since=after, run_id=run_id, kinds=picked, follow=follow)
        for ev in stream:
            click.echo(_line(ev, as_json))
            if follow:
                sys.stdout.flush()
        warn_anomalies(stream.reader.anomalies if stream.reader else [])
    except KeyboardInterrupt:
        return
    except BrokenPipeError:  # `jobqueue events -f | head`: the reader left
        sys.stderr.close()


def _note_logs_off(jq: Any, queues: list[str] | None) -> None:
    for name in queues if queues is not None else sorted(jq.queues()):
        if not jq.queue_events(name).enabled:
            click.echo(f"warning: queue {name}'s event log is off: no new event is written "
                       f"(jobqueue queue events {name} --on)", err=True)
