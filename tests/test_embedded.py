"""The embedded server: private, on a unix socket, and never outliving its parent."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import redis
from helpers import pid_alive, wait_for

from jobqueue.store.embedded import EmbeddedServer, remove_stale_directories, resolve_url


def test_embedded_server_answers_on_a_private_unix_socket() -> None:
    server = EmbeddedServer().start()
    try:
        assert server.url.startswith("unix:///tmp/jq-")
        assert oct(server.directory.stat().st_mode & 0o777) == "0o700"
        client = redis.Redis.from_url(server.url)
        assert client.ping()
        assert client.config_get("appendonly")["appendonly"] in ("no", b"no")
        assert client.config_get("save")["save"] in ("", b"")
    finally:
        server.stop()


def test_stop_kills_the_server_and_removes_its_directory() -> None:
    server = EmbeddedServer().start()
    assert server.process is not None
    pid = server.process.pid
    server.stop()
    assert not pid_alive(pid)
    assert not server.directory.exists()


def test_server_dies_when_its_parent_is_killed_with_sigkill() -> None:
    # The parent sleeps (kept): it lives until the test kills it.
    child = subprocess.Popen(
        [sys.executable, "-c",
         "from jobqueue.store.embedded import EmbeddedServer; import time\n"
         "s = EmbeddedServer().start(); print(s.process.pid, flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True,
    )
    assert child.stdout is not None
    server_pid = int(child.stdout.readline())
    assert pid_alive(server_pid)
    child.send_signal(signal.SIGKILL)
    child.wait()
    wait_for(lambda: not pid_alive(server_pid), 5,
             "embedded redis to die with its SIGKILLed parent", interval=0.05)


def test_the_directory_of_a_sigkilled_owner_is_removed_by_the_next_server() -> None:
    # The owner sleeps (kept): it lives until the test kills it.
    child = subprocess.Popen(
        [sys.executable, "-c",
         "from jobqueue.store.embedded import EmbeddedServer; import time\n"
         "s = EmbeddedServer().start(); print(s.directory, flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert child.stdout is not None
    left_behind = Path(child.stdout.readline().strip())
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert left_behind.exists()  # no atexit ran
    mine = EmbeddedServer()  # creating one cleans up; this process's own directory stays
    try:
        assert not left_behind.exists()
        assert mine.directory.exists()
        assert remove_stale_directories() == []
    finally:
        mine.stop()


def test_server_stops_when_its_parent_exits_normally() -> None:
    out = subprocess.run(
        [sys.executable, "-c",
         "from jobqueue.store.embedded import EmbeddedServer\n"
         "s = EmbeddedServer().start(); print(s.process.pid)"],
        capture_output=True, text=True, check=True,
    )
    server_pid = int(out.stdout)
    wait_for(lambda: not pid_alive(server_pid), 5, "the server to stop", interval=0.05)


def test_explicit_url_wins_over_environment_and_embedded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("JOBQUEUE_REDIS_URL", "redis://env-host:6379/0")
    assert resolve_url("redis://explicit:6379/0") == "redis://explicit:6379/0"
    assert resolve_url(None) == "redis://env-host:6379/0"


SLOW_LISTENER = """
import socket, sys, time
path = sys.argv[sys.argv.index('--unixsocket') + 1]
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(path)          # the socket file exists from here on...
time.sleep(0.5)       # ...but connections are refused until listen()
s.listen(8)
while True:
    conn, _ = s.accept()
    conn.close()
"""


def test_start_returns_only_once_the_server_accepts_connections(tmp_path: Path) -> None:
    """A server creates its socket file at bind(), before it listens: start() must not take
    the file for readiness (a command sent then is refused: 'Connection refused')."""
    binary = tmp_path / "slow-listener"
    binary.write_text(f"#!{sys.executable}\n{SLOW_LISTENER}")
    binary.chmod(0o755)
    server = EmbeddedServer(str(binary)).start()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.connect(str(server.socket))  # refused if start() returned at bind()
    finally:
        server.stop()
