"""Daemons started before their Redis (docker compose, Kubernetes) wait for it, with a log
line per try, instead of exiting; ``--connect-timeout`` gives up (exit 3, one error line).
Refused credentials are not waited for. Real processes on a TCP port that nothing listens on
until the test starts a server there."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from helpers import wait_for

from jobqueue.client.sync import JobQueue
from jobqueue.store.embedded import find_server_binary

ROOT = Path(__file__).resolve().parents[1]
APPS = Path(__file__).resolve().parent / "apps"
NOT_YET = "Redis not reachable yet"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture
def start_server(port: int) -> Iterator[object]:
    """Starts a redis-server on ``port`` when called; stops it at teardown."""
    started: list[subprocess.Popen[bytes]] = []

    def start(*extra: str) -> None:
        started.append(subprocess.Popen(
            [find_server_binary(), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", *extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        ))  # fmt: skip
        client = redis.Redis(port=port)
        wait_for(lambda: _answers(client), 20, "the server to answer")

    yield start
    for p in started:
        p.kill()
        p.wait(10)


def _answers(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except (redis.exceptions.AuthenticationError, redis.exceptions.ResponseError):
        return True  # up, and asking for a password
    except redis.exceptions.RedisError:
        return False


def daemon(url: str, log: Path, *args: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(APPS), str(ROOT)]),
           "PYTHONUNBUFFERED": "1"}  # fmt: skip
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "jobqueue.cli", "--redis-url", url, *args],
            stdout=out, stderr=subprocess.STDOUT, env=env, cwd=str(APPS),
        )  # fmt: skip


def tries_logged(log: Path) -> int:
    return log.read_text(errors="replace").count(NOT_YET)


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait(10)


def test_a_worker_started_before_redis_waits_for_it_then_works(
    port: int, start_server: object, procs: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    url = f"redis://127.0.0.1:{port}/0"
    log = tmp_path / "worker.log"
    worker = daemon(url, log, "worker", "--app", "chaos_app:jq", "--lease", "2")
    procs.append(worker)
    wait_for(lambda: tries_logged(log) >= 2, 30, "two tries logged")
    assert worker.poll() is None  # still waiting, not exited
    start_server()  # type: ignore[operator]
    jq = JobQueue.from_url(url)
    jq.declare_task("work", max_attempts=10)
    handle = jq.enqueue("work", 0.0, 0.0)
    assert handle.wait(timeout=30).state == "done"
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(15) == 0
    assert "connected to" in log.read_text()


@pytest.mark.parametrize("command", [["worker", "--app", "chaos_app:jq"], ["scheduler"]])
def test_a_daemon_gives_up_after_its_connect_timeout_with_exit_3(
    port: int, procs: list[subprocess.Popen[bytes]], tmp_path: Path, command: list[str]
) -> None:
    log = tmp_path / "daemon.log"
    started = time.monotonic()
    proc = daemon(f"redis://127.0.0.1:{port}/0", log, *command, "--connect-timeout", "1")
    procs.append(proc)
    assert proc.wait(60) == 3
    text = log.read_text()
    assert tries_logged(log) >= 1
    assert "Traceback" not in text
    (error,) = [line for line in text.splitlines() if line.startswith("error: ")]
    assert "--connect-timeout" in error
    assert time.monotonic() - started >= 1


def test_refused_credentials_are_not_waited_for(
    port: int, start_server: object, procs: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    start_server("--requirepass", "right")  # type: ignore[operator]
    log = tmp_path / "daemon.log"
    proc = daemon(f"redis://:wrong@127.0.0.1:{port}/0", log, "scheduler")
    procs.append(proc)
    assert proc.wait(60) == 3
    assert tries_logged(log) == 0
    assert "wrong" not in log.read_text()
