"""Clients made from URLs never send a command twice: one whose reply timed out may have run
on the server (a second claim would lease runs nobody starts). Pinned in jobqueue.store.connection,
whatever redis-py's defaults; these tests fail if a retry policy ever re-sends."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator

import pytest
import redis
from counting_proxy import CountingProxy
from redis.backoff import NoBackoff
from redis.retry import Retry
from server_stall import stall

from jobqueue.store.connection import async_client, sync_client
from jobqueue.store.embedded import EmbeddedServer


def keep_server_busy(url: str) -> threading.Thread:
    """A script that holds the server for about 0.8 s."""
    return stall(url, 0.8)


@pytest.fixture
def proxy(real_server: EmbeddedServer) -> Iterator[CountingProxy]:
    p = CountingProxy(real_server.socket)
    yield p
    p.close()


def _time_out_an_incr(client: redis.Redis, url: str) -> None:
    client.ping()
    busy = keep_server_busy(url)
    with pytest.raises(redis.exceptions.TimeoutError):
        client.incr("sent")
    busy.join(5)
    time.sleep(0.3)  # what a re-send would still have done by now


def test_a_command_whose_reply_timed_out_is_not_sent_again(
    real_server: EmbeddedServer, proxy: CountingProxy
) -> None:
    control = redis.Redis.from_url(real_server.url, decode_responses=True)
    control.delete("sent")
    _time_out_an_incr(sync_client(proxy.url("socket_timeout=0.2")), real_server.url)
    assert proxy.count(b"INCRBY") == 1
    # Sent once, so run at most once (Redis 7 runs it after the stall; Valkey may drop it).
    assert int(control.get("sent") or 0) <= 1


@pytest.mark.filterwarnings("ignore:Call to '__init__' function with deprecated usage")
def test_the_proxy_counts_a_resent_command(
    real_server: EmbeddedServer, proxy: CountingProxy
) -> None:
    """The check above can fail: redis-py's own retry policy sends a timed-out command again."""
    resending = redis.Redis.from_url(
        proxy.url("socket_timeout=0.2"), retry=Retry(NoBackoff(), 20), retry_on_timeout=True,
        protocol=2, lib_name=None, lib_version=None,  # a reconnection sends only the command
    )
    resending.ping()
    busy = keep_server_busy(real_server.url)
    with contextlib.suppress(redis.exceptions.TimeoutError):
        resending.incr("sent")
    busy.join(5)
    assert proxy.count(b"INCRBY") >= 2


async def _async_incr(url: str, server_url: str) -> None:
    client = async_client(url)
    try:
        await client.ping()
        busy = keep_server_busy(server_url)
        with pytest.raises(redis.exceptions.TimeoutError):
            await client.incr("sent-async")
        busy.join(5)
    finally:
        await client.aclose()


def test_the_async_client_does_not_send_a_timed_out_command_again(
    real_server: EmbeddedServer, proxy: CountingProxy
) -> None:
    control = redis.Redis.from_url(real_server.url, decode_responses=True)
    control.delete("sent-async")
    asyncio.run(_async_incr(proxy.url("socket_timeout=0.2"), real_server.url))
    time.sleep(0.3)
    assert proxy.count(b"INCRBY") == 1
    assert int(control.get("sent-async") or 0) <= 1


def test_a_connection_the_server_closed_while_idle_is_replaced_transparently(
    real_server: EmbeddedServer,
) -> None:
    client = sync_client(real_server.url)
    own_id = client.client_id()
    control = redis.Redis.from_url(real_server.url)
    assert control.client_kill_filter(_id=own_id) == 1
    assert client.ping()  # the pool replaces it: no command was lost or sent twice
