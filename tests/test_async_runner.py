"""The asyncio twin of a sync client (jobqueue.store.twin) and the AsyncScriptRunner on it:
the worker's event loop must get from it what the sync ScriptRunner gives (the same replies,
errors as values, NOSCRIPT recovered), over the same options (TLS, ACL user), and blocking
waits that a cancel does not leave half-read in a pool."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import fakeredis
import pytest
import redis
import redis.asyncio
import redis.asyncio.connection
from helpers import spec, wait_for_async
from test_tls_acl import TlsServer, tls_server  # noqa: F401  (the fixture, shared)

from jobqueue.errors import ConfigError, ScriptError, ServerRefused
from jobqueue.store.connection import sync_client
from jobqueue.store.keys import PartitionKeys
from jobqueue.store.runs import CLAIM, CREATE_RUN, HEARTBEAT
from jobqueue.store.scripts import AsyncScriptRunner, Call, ScriptRunner
from jobqueue.store.twin import async_twin

T = TypeVar("T")
A, B = PartitionKeys("default", 0), PartitionKeys("other", 1)
BAD = PartitionKeys("bad", 0)  # its due index is a string: claim.lua refuses it


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def batches() -> list[list[Call]]:
    """Calls in three rounds, each round's replies depending on the rounds before (a clock
    given explicitly: the replies are the same whoever sends them)."""
    specs = [spec(f"r{i}") for i in range(3)]
    return [
        [CREATE_RUN.call(A, specs, now=0), CREATE_RUN.call(B, specs[:1], now=0)],
        [
            CLAIM.call(A, 2, "w1", 30_000, 60_000, now=1_000),
            CLAIM.call(BAD, 1, "w1", 30_000, 60_000, now=1_000),
            CLAIM.call(B, 5, "w2", 30_000, 60_000, now=1_000),
        ],
        [
            HEARTBEAT.call(A, [("r0", 1), ("r1", 1)], 30_000, now=2_000),
            CREATE_RUN.call(A, specs[:1], now=2_000),  # exists already
        ],
    ]


def comparable(replies: list[Any]) -> list[Any]:
    return [(type(r).__name__, str(r)) if isinstance(r, Exception) else r for r in replies]


async def each_async(client: Any, rounds: list[list[Call]]) -> list[list[Any]]:
    twin = async_twin(client)
    runner = AsyncScriptRunner(twin)
    try:
        return [comparable(await runner.run_each(calls)) for calls in rounds]
    finally:
        await runner.aclose()
        await twin.aclose()


def reset(client: Any) -> None:
    client.flushall()
    client.script_flush()
    client.set(BAD.due, "not a sorted set")


def test_run_each_replies_equal_the_sync_runners_on_the_same_calls(redis_client: Any) -> None:
    reset(redis_client)
    sync = [comparable(ScriptRunner(redis_client).run_each(calls)) for calls in batches()]
    reset(redis_client)
    assert run(each_async(redis_client, batches())) == sync
    assert sync[1][1][0] == "ScriptError"  # the rounds do hold an error value


def test_run_each_returns_an_error_as_its_calls_value_and_runs_the_others(
    redis_client: Any,
) -> None:
    reset(redis_client)
    first, second, *_ = batches()
    got = run(each_async(redis_client, [first, second]))[1]
    assert got[1][0] == ScriptError.__name__
    claimed = [len(CLAIM.parse(r).runs) for r in (got[0], got[2])]
    assert claimed == [2, 1]  # the claims on both sides of it ran


def test_noscript_after_a_script_flush_is_recovered_by_run_each_and_run_many(
    redis_client: Any,
) -> None:
    reset(redis_client)

    async def scenario() -> tuple[list[Any], list[Any]]:
        twin = async_twin(redis_client)
        runner = AsyncScriptRunner(twin)
        try:
            await runner.run_each([CREATE_RUN.call(A, [spec("x")], now=0)])
            redis_client.script_flush()
            each = await runner.run_each([CREATE_RUN.call(A, [spec("y")], now=0)])
            redis_client.script_flush()
            many = await runner.run_many([CREATE_RUN.call(B, [spec("z")], now=0)])
            return each, many
        finally:
            await runner.aclose()
            await twin.aclose()

    assert run(scenario()) == ([[0, 1]], [[0, 1]])


def test_the_twin_of_a_fake_client_shares_its_server_and_options() -> None:
    server = fakeredis.FakeServer()
    sync = fakeredis.FakeRedis(server=server, decode_responses=True, encoding_errors="replace")
    sync.set("k", "v")

    async def read() -> tuple[Any, str]:
        twin = async_twin(sync)
        try:
            kw = twin.connection_pool.connection_kwargs
            return await twin.get("k"), kw["encoding_errors"]
        finally:
            await twin.aclose()

    assert run(read()) == ("v", "replace")


def test_the_twin_of_a_redis_client_has_its_connection_options(real_server: Any) -> None:
    sync = redis.Redis.from_url(
        real_server.url, db=3, client_name="jq-twin", socket_timeout=7, decode_responses=True
    )
    sync.set("k", "v")

    async def read() -> tuple[Any, Any, Any]:
        twin = async_twin(sync)
        try:
            pool = twin.connection_pool
            return await twin.get("k"), await twin.client_getname(), pool.connection_kwargs
        finally:
            await twin.aclose()

    try:
        value, name, kwargs = run(read())
    finally:
        sync.flushdb()
        sync.close()
    assert (value, name) == ("v", "jq-twin")
    assert (kwargs["db"], kwargs["socket_timeout"]) == (3, 7)


def test_the_twin_of_a_url_client_blocks_for_a_free_connection_like_it() -> None:
    sync = sync_client("redis://127.0.0.1:1/0?max_connections=7&timeout=2")

    async def pool_of() -> Any:
        twin = async_twin(sync)
        try:
            return twin.connection_pool
        finally:
            await twin.aclose()

    pool = run(pool_of())
    assert isinstance(pool, redis.asyncio.BlockingConnectionPool)
    assert (pool.max_connections, pool.timeout) == (7, 2)
    sync.close()


def test_a_client_type_the_twin_cannot_mirror_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="no asyncio twin"):
        async_twin(object())


def test_the_twin_of_a_redis_subclass_mirrors_its_connection_options() -> None:
    """A subclass (an app's instrumented client) keeps working with the worker: its pool's
    options are mirrored; its overridden methods are not."""

    class Custom(redis.Redis):  # type: ignore[type-arg]
        pass

    twin = async_twin(Custom(host="127.0.0.1", port=1, db=3))
    assert isinstance(twin, redis.asyncio.Redis)
    assert twin.connection_pool.connection_kwargs["db"] == 3


def test_a_tls_setting_the_asyncio_connection_lacks_is_refused_never_dropped() -> None:
    sync = redis.Redis(host="127.0.0.1", port=1, ssl=True, ssl_validate_ocsp=True)
    with pytest.raises(ConfigError, match="ssl_validate_ocsp"):
        async_twin(sync)
    unset = redis.Redis(host="127.0.0.1", port=1, ssl=True, ssl_validate_ocsp=False)
    pool = async_twin(unset).connection_pool
    assert pool.connection_class is redis.asyncio.connection.SSLConnection
    assert "ssl_validate_ocsp" not in pool.connection_kwargs


def test_run_each_is_refused_on_redis_asyncios_own_cluster_client() -> None:
    class NativeCluster:
        def get_node_from_key(self, key: str) -> None:
            raise AssertionError("not called")

    with pytest.raises(ConfigError, match="async_twin"):
        run(AsyncScriptRunner(NativeCluster()).run_each([CLAIM.call(A, 1, "w", 1, 1)]))


def test_the_twin_of_a_tls_url_with_an_acl_user_runs_scripts_and_waits(
    tls_server: TlsServer,  # noqa: F811
) -> None:
    sync = sync_client(tls_server.url())

    async def scenario() -> tuple[Any, list[Any], str | None]:
        twin = async_twin(sync)
        runner = AsyncScriptRunner(twin)
        try:
            kwargs = twin.connection_pool.connection_kwargs
            created = await runner.run_each(
                [CREATE_RUN.call(A, [spec("t1")], now=0)]
            )
            await twin.lpush(A.wake, "1")
            woken = await runner.wait_on_lists([B.wake, A.wake], 2)
            return kwargs, created, woken
        finally:
            await runner.aclose()
            await twin.aclose()

    try:
        kwargs, created, woken = run(scenario())
    finally:
        sync.close()
    assert (kwargs["username"], kwargs["password"]) == ("jqapp", tls_server.password)
    assert kwargs["ssl_ca_certs"] == str(tls_server.ca)
    assert created == [[0, 1]]
    assert woken == A.wake


async def blocked_in_blpop(redis_client: Any) -> None:
    """Until the server shows a connection blocked in BLPOP. fakeredis lists none: there, a
    window (kept) for the wait to block."""
    if isinstance(redis_client, fakeredis.FakeRedis):
        await asyncio.sleep(0.2)
        return

    def blocked() -> bool:
        return any(
            c.get("cmd") == "blpop" and "b" in c.get("flags", "")
            for c in redis_client.client_list()
        )

    await wait_for_async(blocked, what="a connection blocked in BLPOP")


def test_wait_on_lists_returns_the_key_a_token_was_popped_from(redis_client: Any) -> None:
    redis_client.flushall()

    async def scenario() -> tuple[str | None, str | None]:
        twin = async_twin(redis_client)
        runner = AsyncScriptRunner(twin)
        try:
            waiting = asyncio.create_task(runner.wait_on_lists([A.wake, B.wake], 5))
            await blocked_in_blpop(redis_client)  # the token comes while the wait blocks
            redis_client.lpush(B.wake, "1")
            woken = await waiting
            timed_out = await runner.wait_on_lists([A.wake, B.wake], 0.2)
            return woken, timed_out
        finally:
            await runner.aclose()
            await twin.aclose()

    assert run(scenario()) == (B.wake, None)
    assert redis_client.llen(B.wake) == 0


@pytest.mark.real_only
def test_a_wait_its_server_ends_early_is_refused_for_now_not_a_script_error(
    redis_client: Any,
) -> None:
    """A blocking wait the server ends with UNBLOCKED (as a demoted master does to its
    waiters in a failover; forced here by CLIENT UNBLOCK ... ERROR) took nothing: it is a
    refusal for now, which the worker waits out, and the next wait works."""
    redis_client.flushall()

    async def scenario() -> tuple[BaseException | None, str | None]:
        twin = async_twin(redis_client)
        runner = AsyncScriptRunner(twin)
        try:
            waiting = asyncio.create_task(runner.wait_on_lists([A.wake], 5))
            await blocked_in_blpop(redis_client)
            (waiter,) = [c for c in redis_client.client_list() if c.get("cmd") == "blpop"]
            redis_client.client_unblock(int(waiter["id"]), error=True)
            ended = await asyncio.gather(waiting, return_exceptions=True)
            redis_client.lpush(A.wake, "1")
            again = await runner.wait_on_lists([A.wake], 5)
            return ended[0], again
        finally:
            await runner.aclose()
            await twin.aclose()

    ended, again = run(scenario())
    assert isinstance(ended, ServerRefused), ended
    assert again == A.wake


def test_a_cancelled_wait_leaves_the_client_usable_and_takes_no_token(
    redis_client: Any,
) -> None:
    redis_client.flushall()

    async def scenario() -> tuple[Any, int, str | None, list[Any]]:
        twin = async_twin(redis_client)
        runner = AsyncScriptRunner(twin)
        try:
            waiting = asyncio.create_task(runner.wait_on_lists([A.wake], 10))
            await blocked_in_blpop(redis_client)  # cancelled while it blocks on the server
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            ping = await twin.ping()
            await twin.lpush(A.wake, "1")
            await asyncio.sleep(0.05)  # kept: a window for a BLPOP left behind to take it
            left = await twin.llen(A.wake)  # the cancelled BLPOP did not take it
            woken = await runner.wait_on_lists([A.wake], 2)
            created = await runner.run_each(
                [CREATE_RUN.call(A, [spec("c")], now=0)]
            )
            return ping, left, woken, created
        finally:
            await runner.aclose()
            await twin.aclose()

    assert run(asyncio.wait_for(scenario(), 20)) == (True, 1, A.wake, [[0, 1]])
