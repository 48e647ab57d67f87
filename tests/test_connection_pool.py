"""A client's connections are a bounded pool (100 by default, per node on a cluster; the URL's
``max_connections`` and ``timeout`` set it): a burst of concurrent calls, from threads or
asyncio tasks, waits for a free connection instead of failing, and a call that finds every
connection busy for the pool's whole wait gets ``PoolExhausted``, never sent.

These run against the real server only: the pool is redis-py's, between the client and a
socket (fakeredis has none)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis
from helpers import settle, wait_for, wait_for_async

from jobqueue.client.aio import AsyncJobQueue
from jobqueue.client.sync import JobQueue
from jobqueue.errors import ConfigError, ConnectionFailed, PoolExhausted
from jobqueue.store.connection import POOL_SIZE, POOL_TIMEOUT_S, pool_bound
from jobqueue.store.embedded import EmbeddedServer


@pytest.fixture
def url(real_server: EmbeddedServer) -> Iterator[str]:
    redis.Redis.from_url(real_server.url).flushall()
    yield real_server.url


def with_options(url: str, **options: Any) -> str:
    sep = "&" if "?" in url else "?"
    return url + sep + "&".join(f"{k}={v}" for k, v in options.items())


def app(url: str) -> JobQueue:
    jq = JobQueue.from_url(url)

    @jq.task
    def add(x: int) -> int:
        return x

    return jq


def states(jq: JobQueue, run_ids: list[str]) -> set[str]:
    return {s.state for s in jq.run_states(run_ids)}


@contextmanager
def only_connection_held(client: Any, url: str) -> Iterator[None]:
    """The client's one pooled connection blocked in a BLPOP until the block ends (released
    by a push from another connection): busy for as long as the test needs, by construction."""
    thread = threading.Thread(target=client.blpop, args=("pool-test:hold", 0), daemon=True)
    thread.start()
    other = redis.Redis.from_url(url, decode_responses=True)
    wait_for(lambda: any(c.get("cmd") == "blpop" for c in other.client_list()),
             what="the holding BLPOP to reach the server")
    try:
        yield
    finally:
        other.lpush("pool-test:hold", "go")
        thread.join(10)
        other.close()


def test_the_pool_bound_and_wait_default_to_100_connections_and_20_seconds() -> None:
    assert (POOL_SIZE, POOL_TIMEOUT_S) == (100, 20.0)
    assert pool_bound("redis://h:1/0") == (100, 20.0)


def test_the_url_sets_the_pool_bound_and_wait() -> None:
    assert pool_bound("redis://h:1/0?max_connections=7&timeout=1.5") == (7, 1.5)


@pytest.mark.parametrize(
    "query", ["max_connections=0", "max_connections=many", "timeout=-1", "timeout=soon"]
)
def test_a_bad_pool_option_in_the_url_is_a_config_error(query: str) -> None:
    with pytest.raises(ConfigError, match="pool option"):
        JobQueue.from_url(f"redis://127.0.0.1:1/0?{query}").connect()


def test_five_thousand_concurrent_async_enqueues_are_all_created(url: str) -> None:
    jq = app(url)
    ids = [f"burst-{i}" for i in range(5000)]

    async def burst() -> list[bool]:
        ajq = AsyncJobQueue.from_url(url, tasks=jq)
        try:
            handles = await asyncio.gather(
                *(ajq.enqueue(jq.resolve_task("add").with_options(run_id=r), i)
                  for i, r in enumerate(ids))
            )
        finally:
            await ajq.close()
        return [h.created for h in handles]

    assert all(asyncio.run(burst()))
    assert states(jq, ids) == {"pending"}


def test_a_burst_of_first_async_enqueues_registers_its_queue_once(url: str) -> None:
    """The first enqueues of a process record their queue; gathered, they wait on one
    registration instead of each sending their own (which doubled a burst's work)."""
    jq = app(url)
    server = redis.Redis.from_url(url)

    def registrations() -> int:
        return int(server.info("commandstats").get("cmdstat_hsetnx", {}).get("calls", 0))

    async def burst() -> None:
        ajq = AsyncJobQueue.from_url(url, tasks=jq)
        try:
            await asyncio.gather(*(ajq.enqueue(jq.resolve_task("add"), i) for i in range(500)))
        finally:
            await ajq.close()

    before = registrations()
    asyncio.run(burst())
    assert registrations() - before == 1
    server.close()


def test_an_async_connect_outlasted_by_a_busy_event_loop_is_tried_again(url: str) -> None:
    """A burst keeps the event loop busy: a connect can see its socket_connect_timeout pass
    before the loop gets back to it, though the server answered at once. Nothing was sent
    on that connection, so it is tried again within the pool's wait, not raised as an
    unreachable server. Forced: the loop is blocked for 4x the connect timeout while the
    first connect is under way."""
    jq = app(url)

    async def enqueue_while_the_loop_is_blocked() -> bool:
        ajq = AsyncJobQueue.from_url(with_options(url, socket_connect_timeout=0.1), tasks=jq)
        try:
            call = asyncio.ensure_future(ajq.enqueue(jq.resolve_task("add"), 1))
            await asyncio.sleep(0)  # the call is now connecting
            time.sleep(0.4)  # what 5,000 gathered calls do to the loop on a loaded machine
            return (await call).created
        finally:
            await ajq.close()

    assert asyncio.run(enqueue_while_the_loop_is_blocked())


@contextmanager
def writes_held(url: str) -> Iterator[Any]:
    """The server holds every write (CLIENT PAUSE WRITE) until the block ends: a script
    call sent meanwhile keeps its connection busy for as long as the test needs. Yields a
    connection of its own, for reads (they go on)."""
    other = redis.Redis.from_url(url, decode_responses=True)
    other.client_pause(60_000, all=False)
    try:
        yield other
    finally:
        other.client_unpause()
        other.close()


def test_five_hundred_threads_enqueueing_at_once_are_all_created(url: str) -> None:
    """The server holds the writes until every thread has started its enqueue and 100 of
    them fill the pool: the other 400 find no free connection, and wait for one."""
    jq = app(url)
    jq.connect()
    add = jq.resolve_task("add")
    ids = [f"thread-{i}" for i in range(500)]
    started: list[int] = []
    created: list[bool] = []
    errors: list[BaseException] = []

    def enqueue(i: int) -> None:
        started.append(i)
        try:
            created.append(add.with_options(run_id=ids[i]).enqueue(i).created)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=enqueue, args=(i,)) for i in range(len(ids))]
    with writes_held(url) as reads:
        for t in threads:
            t.start()

        def pool_full() -> bool:
            assert errors == []
            return len(started) == len(ids) and len(reads.client_list()) >= POOL_SIZE + 1

        wait_for(pool_full, 30, "the calls to fill the pool", interval=0.02)
        # Kept: a window for the last threads to start to reach the pool (no sign of a thread
        # waiting for a connection), none failing meanwhile.
        time.sleep(0.5)
        assert errors == []
    for t in threads:
        t.join()
    assert errors == []
    assert created == [True] * len(ids)
    assert states(jq, ids) == {"pending"}


def test_a_call_that_finds_every_connection_busy_waits_for_one(url: str) -> None:
    jq = app(with_options(url, max_connections=1, timeout=30))
    jq.connect()
    got: list[bool] = []
    with only_connection_held(jq.redis, url):
        waiter = threading.Thread(
            target=lambda: got.append(jq.resolve_task("add").enqueue(1).created)
        )
        waiter.start()
        waiter.join(0.3)
        assert got == []  # still waiting: the one connection is held
    waiter.join(10)
    assert got == [True]


def test_a_call_that_finds_every_connection_busy_for_the_whole_wait_raises_pool_exhausted(
    url: str,
) -> None:
    jq = app(with_options(url, max_connections=1, timeout=0.2))
    jq.connect()
    with only_connection_held(jq.redis, url), pytest.raises(PoolExhausted) as raised:
        jq.resolve_task("add").with_options(run_id="never-sent").enqueue(1)
    assert isinstance(raised.value, ConnectionFailed)  # retried like an outage by daemons
    assert "max_connections" in str(raised.value)
    assert states(jq, ["never-sent"]) == {"missing"}


def test_a_look_up_that_finds_every_connection_busy_raises_pool_exhausted(url: str) -> None:
    jq = app(with_options(url, max_connections=1, timeout=0.2))
    jq.connect()
    with only_connection_held(jq.redis, url), pytest.raises(PoolExhausted):
        jq.queues()


async def blpop_blocked(other: Any) -> None:
    """Until the server shows a connection in BLPOP (``other`` is a connection of its own)."""

    async def seen() -> bool:
        return any(c.get("cmd") == "blpop" for c in await other.client_list())

    await wait_for_async(seen, what="a connection blocked in BLPOP")


def test_an_async_call_that_finds_every_connection_busy_waits_then_raises_pool_exhausted(
    url: str,
) -> None:
    jq = app(url)

    async def go() -> tuple[bool, type[BaseException] | None]:
        ajq = AsyncJobQueue.from_url(with_options(url, max_connections=1, timeout=0.3), tasks=jq)
        add = jq.resolve_task("add")
        try:
            hold = asyncio.create_task(ajq.redis.blpop("pool-test:hold", 0))
            other = redis.asyncio.Redis.from_url(url, decode_responses=True)
            await blpop_blocked(other)
            # A call that waits, and gets the connection back when the hold ends...
            waiting = asyncio.create_task(ajq.enqueue(add.with_options(run_id="waited"), 1))
            await settle()  # it waits for the pool's one connection
            assert not waiting.done()
            await other.lpush("pool-test:hold", "go")
            await hold
            created = (await waiting).created
            # ... and one whose wait runs out while the connection stays held.
            hold = asyncio.create_task(ajq.redis.blpop("pool-test:hold", 0))
            await blpop_blocked(other)
            error: type[BaseException] | None = None
            try:
                await ajq.enqueue(add.with_options(run_id="never-sent"), 1)
            except PoolExhausted as exc:
                error = type(exc)
            await other.lpush("pool-test:hold", "go")
            await hold
            await other.aclose()
            return created, error
        finally:
            await ajq.close()

    assert asyncio.run(go()) == (True, PoolExhausted)
    assert states(jq, ["waited", "never-sent"]) == {"pending", "missing"}
