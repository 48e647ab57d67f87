"""What the commands print listings with, and how they ask: ``emit`` (a table or JSON, with
the anomalies found on stderr), ``progress`` (a bar on a terminal only), ``confirm`` (before a
destructive or bulk change) and the ``--json`` option."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import click

from jobqueue.anomalies import Anomaly
from jobqueue.cli.common import anomaly_cell, warn_anomalies
from jobqueue.cli.format import table
from jobqueue.errors import OperationRefused
from jobqueue.ops.queries import all_anomalies


def emit(
    as_json: bool,
    data: list[dict[str, Any]],
    rows: list[list[Any]],
    headers: list[str],
    empty: str,
    found: Sequence[Any] = (),
) -> None:
    """A listing: JSON, or a table. ``found``: the rows as read (a Listing, one per row);
    every anomaly goes to stderr, and when rows carry some, the table gets an ANOMALY column
    marking them."""
    warn_anomalies(all_anomalies(found))
    if getattr(found, "truncated", False):
        click.echo(f"note: more than {len(data):,} exist: only the first {len(data):,} are "
                   "shown (raise --limit)", err=True)
    if as_json:
        click.echo(json.dumps(data, default=str))
    elif not rows:
        click.echo(empty)
    else:
        marks = [anomaly_cell(_row_anomalies(item)) for item in found] if found else []
        if any(marks):
            rows = [[*row, mark] for row, mark in zip(rows, marks, strict=True)]
            headers = [*headers, "ANOMALY"]
        click.echo(table(rows, headers))


def _row_anomalies(item: Any) -> tuple[Anomaly, ...]:
    anomalies: tuple[Anomaly, ...] = getattr(item, "anomalies", ())
    return anomalies


def stdout_is_terminal() -> bool:
    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):
        return False


@contextmanager
def progress(length: int, label: str) -> Iterator[Callable[[int], None]]:
    """A progress bar (click's) on a terminal; silence in a pipe, a file or CI, where a bar
    is only noise in a log. Yields ``advance(n)``."""
    if length < 2 or not stdout_is_terminal():
        yield lambda n: None
        return
    with click.progressbar(length=length, label=label, file=sys.stdout) as bar:
        yield bar.update


def confirm(what: str, yes: bool, skip: str = "--yes") -> None:
    """Ask before a destructive or bulk change unless --yes. 'No', or no answer at all (end of
    input, which click turns into Abort), is a refusal: one ``error:`` line, exit 1, nothing
    changed."""
    if yes:
        return
    try:
        answered = click.confirm(what, default=False)
    except click.Abort:
        answered = False
    if not answered:
        raise OperationRefused(f"not confirmed: nothing changed ({skip} skips the question)")


json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
