"""Clients made from URLs never send a command twice: one whose reply timed out may have run
on the server (a second claim would lease runs nobody starts). Pinned in jobqueue.store.connection,
whatever redis-py's defaults; these tests fail if a retry policy ever re-sends.

A reply later than the socket timeout (a server stalled by a slow script, a fork) is made by
the counting proxy holding back the replies on the client's connection until it has timed out:
certain however busy the machine, where a calibrated stall of the server raced the timeout. A
re-send would go over a new connection, which the proxy answers (and counts)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
import redis
from counting_proxy import CountingProxy
from redis.backoff import NoBackoff
from redis.retry import Retry

from jobqueue.store.connection import async_client, sync_client
from jobqueue.store.embedded import EmbeddedServer


@pytest.fixture
def proxy(real_server: EmbeddedServer) -> Iterator[CountingProxy]:
    p = CountingProxy(real_server.socket)
    yield p
    p.close()


def _time_out_an_incr(client: redis.Redis, proxy: CountingProxy) -> None:
    client.ping()
    proxy.hold_replies()
    with pytest.raises(redis.exceptions.TimeoutError):
        client.incr("sent")
    proxy.release_replies()
    time.sleep(0.3)  # kept: a window in which a re-send would have come


def test_a_command_whose_reply_timed_out_is_not_sent_again(
    real_server: EmbeddedServer, proxy: CountingProxy
) -> None:
    control = redis.Redis.from_url(real_server.url, decode_responses=True)
    control.delete("sent")
    _time_out_an_incr(sync_client(proxy.url("socket_timeout=0.2")), proxy)
    assert proxy.count(b"INCRBY") == 1
    # Sent once, so run at most once.
    assert int(control.get("sent") or 0) <= 1


@pytest.mark.filterwarnings("ignore:Call to '__init__' function with deprecated usage")
def test_the_proxy_counts_a_resent_command(proxy: CountingProxy) -> None:
    """The check above can fail: redis-py's own retry policy sends a timed-out command again."""
    resending = redis.Redis.from_url(
        proxy.url("socket_timeout=0.2"), retry=Retry(NoBackoff(), 1), retry_on_timeout=True,
        protocol=2, lib_name=None, lib_version=None,  # a reconnection sends only the command
    )
    resending.ping()
    proxy.hold_replies()  # the first try times out; its retry, on a new connection, is answered
    resending.incr("sent")
    proxy.release_replies()
    assert proxy.count(b"INCRBY") == 2


async def _async_incr(proxy: CountingProxy) -> None:
    client = async_client(proxy.url("socket_timeout=0.2"))
    try:
        await client.ping()
        proxy.hold_replies()
        with pytest.raises(redis.exceptions.TimeoutError):
            await client.incr("sent-async")
        proxy.release_replies()
    finally:
        await client.aclose()


def test_the_async_client_does_not_send_a_timed_out_command_again(
    real_server: EmbeddedServer, proxy: CountingProxy
) -> None:
    control = redis.Redis.from_url(real_server.url, decode_responses=True)
    control.delete("sent-async")
    asyncio.run(_async_incr(proxy))
    time.sleep(0.3)  # kept: a window in which a re-send would have come
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
