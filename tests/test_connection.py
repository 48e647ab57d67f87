"""Clients made from URLs never send a command twice: one whose reply timed out may have run
on the server (a second claim would lease runs nobody starts). Pinned in jobqueue.connection,
whatever redis-py's defaults; these tests fail if a retry policy ever re-sends."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import redis

from jobqueue.connection import async_client, sync_client
from jobqueue.embedded import EmbeddedServer

BUSY_SCRIPT = """
local t = redis.call('TIME')
local stop = t[1] + t[2] / 1e6 + 0.8
repeat t = redis.call('TIME') until t[1] + t[2] / 1e6 > stop
return 1
"""


def keep_server_busy(url: str) -> threading.Thread:
    """A script that holds the (single-threaded) server for about a second."""
    client = redis.Redis.from_url(url)

    def busy() -> None:
        client.eval(BUSY_SCRIPT, 0)

    thread = threading.Thread(target=busy, daemon=True)
    thread.start()
    time.sleep(0.1)  # the script runs now
    return thread


def test_a_command_whose_reply_timed_out_is_not_sent_again(real_server: EmbeddedServer) -> None:
    control = redis.Redis.from_url(real_server.url, decode_responses=True)
    control.delete("sent")
    client = sync_client(f"{real_server.url}?socket_timeout=0.2")
    client.ping()
    busy = keep_server_busy(real_server.url)
    with pytest.raises(redis.exceptions.TimeoutError):
        client.incr("sent")
    busy.join(5)
    time.sleep(0.2)
    assert control.get("sent") == "1"


async def _async_incr(url: str) -> None:
    client = async_client(f"{url}?socket_timeout=0.2")
    try:
        await client.ping()
        busy = keep_server_busy(url)
        with pytest.raises(redis.exceptions.TimeoutError):
            await client.incr("sent-async")
        busy.join(5)
    finally:
        await client.aclose()


def test_the_async_client_does_not_send_a_timed_out_command_again(
    real_server: EmbeddedServer,
) -> None:
    control = redis.Redis.from_url(real_server.url, decode_responses=True)
    control.delete("sent-async")
    asyncio.run(_async_incr(real_server.url))
    time.sleep(0.2)
    assert control.get("sent-async") == "1"


def test_a_connection_the_server_closed_while_idle_is_replaced_transparently(
    real_server: EmbeddedServer,
) -> None:
    client = sync_client(real_server.url)
    own_id = client.client_id()
    control = redis.Redis.from_url(real_server.url)
    assert control.client_kill_filter(_id=own_id) == 1
    assert client.ping()  # the pool replaces it: no command was lost or sent twice
