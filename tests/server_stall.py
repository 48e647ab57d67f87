"""Hold a (single-threaded) Redis server busy for a while, on any server: a Lua loop of a
calibrated length. Not a loop on TIME: Valkey freezes TIME for the length of a script, so
such a loop never ends there."""

from __future__ import annotations

import threading
import time
from functools import cache

import redis

_LOOP = "local n = tonumber(ARGV[1]); local x = 0; for i = 1, n do x = x + i end; return 1"


@cache
def _iterations_per_second(url: str) -> float:
    client = redis.Redis.from_url(url)
    try:
        n = 2_000_000
        while True:
            start = time.perf_counter()
            client.eval(_LOOP, 0, n)
            took = time.perf_counter() - start
            if took > 0.05:
                return n / took
            n *= 4
    finally:
        client.close()


def stall(url: str, seconds: float) -> threading.Thread:
    """Start a script that holds the server about ``seconds``; returns once it runs."""
    n = int(_iterations_per_second(url) * seconds)
    client = redis.Redis.from_url(url)
    thread = threading.Thread(target=lambda: client.eval(_LOOP, 0, n), daemon=True)
    thread.start()
    time.sleep(0.1)  # the script runs now
    return thread
