"""Hold a (single-threaded) Redis server busy for a while, on any server: a Lua loop of a
calibrated length. Not a loop on TIME: Valkey freezes TIME for the length of a script, so
such a loop never ends there. (Where the test owns the connection, the counting proxy's
hold_replies makes a late reply by construction; this is for a server behind a client the
test does not route, e.g. a cluster node.)"""

from __future__ import annotations

import threading
import time
from functools import cache

import redis

_LOOP = "local n = tonumber(ARGV[1]); local x = 0; for i = 1, n do x = x + i end; return 1"


@cache
def _iterations_per_second(url: str) -> float:
    """Measured on a loop of 0.25 s or more, less an empty call's round trip: on a busy
    machine a short loop's time is mostly latency, which made the rate look several times
    lower and the stall that much shorter than asked."""
    client = redis.Redis.from_url(url)
    try:
        n = 2_000_000
        while True:
            start = time.perf_counter()
            client.eval(_LOOP, 0, 1)
            empty = time.perf_counter() - start
            start = time.perf_counter()
            client.eval(_LOOP, 0, n)
            took = time.perf_counter() - start - empty
            if took > 0.25:
                return n / took
            n *= 4
    finally:
        client.close()


def stall(url: str, seconds: float) -> threading.Thread:
    """Start a script that holds the server about ``seconds``; returns once it is sent (its
    reply is read by the thread returned), so that any call made after is queued behind it."""
    n = int(_iterations_per_second(url) * seconds)
    client = redis.Redis.from_url(url)
    conn = client.connection_pool.get_connection()
    conn.send_command("EVAL", _LOOP, 0, n)

    def finish() -> None:
        try:
            conn.read_response()
        finally:
            client.connection_pool.release(conn)
            client.close()

    thread = threading.Thread(target=finish, daemon=True)
    thread.start()
    # Kept: time for the server to read the EVAL (no connection can see a script start:
    # the server answers nothing else while it runs).
    time.sleep(0.1)
    return thread
