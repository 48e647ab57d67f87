"""A TCP proxy in front of a server's unix socket that keeps every byte clients sent, so a
test can count how many times a command went over the wire, whatever the server then did with
it (Redis 7 runs a command whose client already left; Valkey may drop it unread).

It can also hold back the server's replies on the connections open at that moment
(``hold_replies``) until told to let them through: to a client, a server that answers those
calls later than its socket timeout, for as long as the test wants, a late reply by
construction whatever the machine's load (a calibrated server stall raced the timeout on a
busy machine). A connection made after that, e.g. a client's reconnection to send a call
again, is answered at once, as by a server whose stall has ended: a re-send is counted and
runs."""

from __future__ import annotations

import contextlib
import re
import socket
import threading
from pathlib import Path


class CountingProxy:
    def __init__(self, unix_socket: Path) -> None:
        self._target = str(unix_socket)
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(16)
        self.port = int(self._listener.getsockname()[1])
        self._sent = bytearray()
        self._lock = threading.Lock()
        self._closing = False
        # One per connection: set, its replies flow; clear, they wait in the proxy.
        self._flowing: list[threading.Event] = []
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()

    def url(self, query: str = "") -> str:
        return f"redis://127.0.0.1:{self.port}/0" + (f"?{query}" if query else "")

    def count(self, command: bytes) -> int:
        """How many times clients sent ``command`` (a RESP bulk string: the command name as
        the client spelled it, e.g. b'INCR', b'EVALSHA')."""
        with self._lock:
            return self._sent.count(b"\r\n" + command + b"\r\n")

    def commands_sent(self) -> int:
        """How many commands clients sent (RESP arrays: pipelined ones each count)."""
        with self._lock:
            return len(re.findall(rb"(?:^|\r\n)\*[0-9]+\r\n\$", bytes(self._sent)))

    def hold_replies(self) -> None:
        """From now on, what the server sends on the connections open now waits in the proxy
        until release_replies()."""
        with self._lock:
            for flowing in self._flowing:
                flowing.clear()

    def release_replies(self) -> None:
        """Let the held replies (and those after) through, to the clients still connected."""
        with self._lock:
            for flowing in self._flowing:
                flowing.set()

    def close(self) -> None:
        self._closing = True
        self.release_replies()
        with contextlib.suppress(OSError):
            self._listener.close()

    def _accept(self) -> None:
        while not self._closing:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            server.connect(self._target)
            flowing = threading.Event()
            flowing.set()
            with self._lock:
                self._flowing.append(flowing)
            threading.Thread(target=self._pipe, args=(client, server, None), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, flowing), daemon=True).start()

    def _pipe(
        self, source: socket.socket, sink: socket.socket, flowing: threading.Event | None
    ) -> None:
        """Client to server (``flowing`` None: every byte recorded), or server to client
        (each reply waits while ``flowing`` is clear)."""
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                if flowing is None:
                    with self._lock:
                        self._sent += data
                else:
                    flowing.wait()
                sink.sendall(data)
        for s in (source, sink):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
