"""``jobqueue top``: the terminal loop around ``top_view.render`` (read, draw, wait for a key).

Only the standard library drives the terminal: ``tty.setcbreak`` so single keys arrive without
Enter (cbreak rather than full raw mode keeps output post-processing, so ``\\n`` still returns
the carriage, and keeps Ctrl-C a signal), ``select`` to wait for a key or the next refresh,
and the alternate screen so the operator's scrollback is left as it was.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import sys
import termios
import time
import tty
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any, TextIO

import click

from jobqueue.cli.common import FiniteFloat
from jobqueue.cli.top_view import render
from jobqueue.ops import queries

QUIT_KEYS = frozenset(b"qQ\x03")  # \x03: Ctrl-C, should the terminal deliver it as a byte

# Alternate screen on / cursor hidden, and back.
_ENTER, _LEAVE = "\x1b[?1049h\x1b[?25l", "\x1b[?25h\x1b[?1049l"
_HOME, _CLEAR_LINE, _CLEAR_BELOW = "\x1b[H", "\x1b[K", "\x1b[J"


class Keys:
    """Waits for a refresh interval, returning early when a quit key is pressed. Only a TTY
    is read: piped stdin is left alone (the loop then ends by --iterations or Ctrl-C)."""

    def __init__(self, stream: TextIO) -> None:
        self.fd: int | None = None
        try:
            if stream.isatty():
                self.fd = stream.fileno()
        except (AttributeError, ValueError, OSError):
            self.fd = None

    def wait_for_quit(self, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if self.fd is None:
                time.sleep(left)
                return False
            readable, _, _ = select.select([self.fd], [], [], left)
            if readable:
                data = os.read(self.fd, 64)
                if not data:  # the terminal hung up: nothing more will come
                    self.fd = None
                elif QUIT_KEYS.intersection(data):
                    return True
        return False


@contextmanager
def cbreak(fd: int | None) -> Iterator[None]:
    """Single keys without Enter and without echo; the terminal restored however we leave."""
    if fd is None:
        yield
        return
    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


@contextmanager
def alternate_screen(out: TextIO) -> Iterator[None]:
    out.write(_ENTER)
    out.flush()
    try:
        yield
    finally:
        out.write(_LEAVE)
        out.flush()


def draw(out: TextIO, lines: list[str]) -> None:
    """Overwrite in place (home, each line cleared to its end, the rest cleared): no flicker."""
    out.write(_HOME + "".join(f"{line}{_CLEAR_LINE}\n" for line in lines) + _CLEAR_BELOW)
    out.flush()


def live(
    jq: Any,
    queue: str | None,
    interval: float,
    lease_limit: int,
    iterations: int | None,
    stdin: TextIO,
    out: TextIO,
) -> None:
    keys = Keys(stdin)
    previous = None
    frames = 0
    with cbreak(keys.fd), alternate_screen(out):
        while True:
            snap = queries.top_snapshot(jq, queue, lease_limit=lease_limit)
            size = shutil.get_terminal_size()
            draw(
                out,
                render(
                    snap,
                    width=size.columns,
                    height=max(size.lines - 1, 1),
                    previous=previous,
                    interval=interval,
                ),
            )
            previous, frames = snap, frames + 1
            if iterations is not None and frames >= iterations:
                return
            if keys.wait_for_quit(interval):
                return


@click.command()
@click.option("--queue", help="Only this queue.")
@click.option(
    "--interval", default=1.0, show_default=True, type=FiniteFloat(0.1), help="Seconds."
)
@click.option(
    "--leases",
    "lease_limit",
    default=10,
    show_default=True,
    type=click.IntRange(1, 1000),
    help="How many leases (those with least time left) to show.",
)
@click.option("--once", is_flag=True, help="Print one frame and exit.")
@click.option("--iterations", type=click.IntRange(1), help="Stop after N frames.")
@click.option("--json", "as_json", is_flag=True, help="One snapshot as JSON, then exit.")
@click.pass_obj
def top(
    state: Any,
    queue: str | None,
    interval: float,
    lease_limit: int,
    once: bool,
    iterations: int | None,
    as_json: bool,
) -> None:
    """A live view of queues, throughput, lateness and leases; q (or Ctrl-C) quits.

    When stdout is not a terminal (a pipe, a file, a script), one frame is printed.
    """
    jq = state.jq()
    out = sys.stdout
    if as_json:
        snap = queries.top_snapshot(jq, queue, lease_limit=lease_limit)
        click.echo(json.dumps(snap.to_dict()))
        return
    if once or not out.isatty():
        snap = queries.top_snapshot(jq, queue, lease_limit=lease_limit)
        width = shutil.get_terminal_size().columns if out.isatty() else 10_000
        click.echo("\n".join(render(snap, width=width, height=10_000)))
        return
    # Ctrl-C is a way out too, not an error: the terminal is restored on the way.
    with suppress(KeyboardInterrupt):
        live(jq, queue, interval, lease_limit, iterations, sys.stdin, out)
