"""Acting on SIGTERM/SIGINT from a helper thread, never inside the signal handler.

A Python signal handler runs in the main thread between two bytecodes, possibly while that
thread holds a lock the handler's work would need: ``threading.Event.set()`` takes the
Event's non-reentrant lock, which the main thread holds for an instant inside every
``Event.wait()``; a worker's own lock; logging's or a connection's. A handler that stops a
daemon directly therefore deadlocks once in a while. The handler only writes the signal
number to a pipe (async-signal-safe, no lock); a daemon thread reads it and does the work.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable

_CLOSE = b"\0"  # no signal has number 0


class SignalRelay:
    """Calls ``on_signal(signum)`` on a thread named ``name`` for every signal passed to
    :meth:`notify` (from a signal handler)."""

    def __init__(self, on_signal: Callable[[int], None], name: str) -> None:
        self._on_signal = on_signal
        self._name = name
        self._write_fd: int | None = None

    def start(self) -> None:
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)  # a full pipe must not block a signal handler
        self._write_fd = write_fd
        threading.Thread(target=self._relay, args=(read_fd,), name=self._name, daemon=True).start()

    def notify(self, signum: int) -> None:
        """The only thing a handler does: async-signal-safe, takes no lock."""
        fd = self._write_fd
        if fd is not None:
            with contextlib.suppress(OSError):
                os.write(fd, bytes([signum & 0xFF]))

    def close(self) -> None:
        fd, self._write_fd = self._write_fd, None
        if fd is None:
            return
        with contextlib.suppress(OSError):
            os.write(fd, _CLOSE)
        os.close(fd)

    def _relay(self, read_fd: int) -> None:
        try:
            while True:
                try:
                    data = os.read(read_fd, 64)
                except OSError:
                    return
                for signum in data:
                    if signum == 0:
                        return
                    self._on_signal(signum)
                if not data:
                    return
        finally:
            with contextlib.suppress(OSError):
                os.close(read_fd)
