"""A TCP proxy in front of a server's unix socket that keeps every byte clients sent, so a
test can count how many times a command went over the wire, whatever the server then did with
it (Redis 7 runs a command whose client already left; Valkey may drop it unread)."""

from __future__ import annotations

import contextlib
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
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()

    def url(self, query: str = "") -> str:
        return f"redis://127.0.0.1:{self.port}/0" + (f"?{query}" if query else "")

    def count(self, command: bytes) -> int:
        """How many times clients sent ``command`` (a RESP bulk string: the command name as
        the client spelled it, e.g. b'INCR', b'EVALSHA')."""
        with self._lock:
            return self._sent.count(b"\r\n" + command + b"\r\n")

    def close(self) -> None:
        self._closing = True
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
            threading.Thread(target=self._pipe, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, False), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, record: bool) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                if record:
                    with self._lock:
                        self._sent += data
                sink.sendall(data)
        for s in (source, sink):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
