"""What durable writes cost: enqueue one at a time, and claim+complete, on a master with one
replica, with Settings(durable_replicas=1) (WAIT after each create and each claim) against the
default (no WAIT), in one sitting on the same pair of servers. Prints runs/s and the ratio.

    python bench/durability.py [--n 5000] [--repeat 3]

Both servers are private (unix socket + loopback TCP for replication) and stop at the end.
"""

from __future__ import annotations

import argparse
import socket
import sys
import time
from collections.abc import Sequence

import redis
from _common import fmt_int, say

from jobqueue import JobQueue, Request, Settings
from jobqueue.store.embedded import EmbeddedServer, find_server_binary
from jobqueue.store.runs import CLAIM, COMPLETE


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_pair() -> tuple[EmbeddedServer, EmbeddedServer]:
    port = _free_port()
    master = EmbeddedServer(
        find_server_binary(),
        extra_args=("--port", str(port), "--repl-diskless-sync-delay", "0"),
    ).start()
    replica = EmbeddedServer(
        find_server_binary(), extra_args=("--replicaof", "127.0.0.1", str(port))
    ).start()
    probe = redis.Redis.from_url(master.url)
    deadline = time.monotonic() + 30
    while (probe.info("replication").get("slave0") or {}).get("state") != "online":
        if time.monotonic() > deadline:
            raise SystemExit("the replica never came online")
        time.sleep(0.02)
    probe.close()
    return master, replica


def enqueue_rate(url: str, settings: Settings, n: int) -> float:
    jq = JobQueue.from_url(url, settings=settings)
    jq.declare_task("noop")
    jq.enqueue("noop", -1)  # connect, load the script
    start = time.perf_counter()
    for i in range(n):
        jq.enqueue("noop", i)
    rate = n / (time.perf_counter() - start)
    jq.redis.flushall()
    jq.close()
    return rate


def claim_complete_rate(url: str, settings: Settings, n: int, batch: int = 100) -> float:
    """Claims of `batch` runs (durable when asked) and one batched complete per claim: what a
    worker does, without the task."""
    jq = JobQueue.from_url(url, settings=settings)
    jq.declare_task("noop")
    jq.enqueue_many(Request("noop", (i,)) for i in range(n))
    pk = jq.keys_for("default", "x")
    start = time.perf_counter()
    done = 0
    while done < n:
        call = CLAIM.call(pk, batch, "bench", 30_000, 60_000)
        if settings.durable:
            (reply,), _ = jq.scripts.run_durable(
                [call], settings.durable_replicas, False, settings.durable_timeout_ms
            )
        else:
            reply = jq.scripts.run(call)
        runs = CLAIM.parse(reply).runs
        if not runs:
            break
        items = [(r.run_id, r.fence, "null") for r in runs]
        jq.scripts.run(COMPLETE.call(pk, items, 60_000))
        done += len(runs)
    rate = done / (time.perf_counter() - start)
    jq.redis.flushall()
    jq.close()
    return rate


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=5000, help="runs per figure")
    parser.add_argument("--repeat", type=int, default=3, help="best of this many")
    args = parser.parse_args(argv)
    master, replica = start_pair()
    try:
        plain, durable = Settings(), Settings(durable_replicas=1)
        rows = []
        for name, measure in (("enqueue one at a time", enqueue_rate),
                              ("claim(100) + complete", claim_complete_rate)):
            fast = max(measure(master.url, plain, args.n) for _ in range(args.repeat))
            safe = max(measure(master.url, durable, args.n) for _ in range(args.repeat))
            rows.append((name, fast, safe))
        say("durable writes: a master with one replica on this machine, "
            f"N = {fmt_int(args.n)}, best of {args.repeat}")
        say(f"{'path':<24}{'default /s':>12}{'durable_replicas=1 /s':>24}{'ratio':>8}")
        for name, fast, safe in rows:
            say(f"{name:<24}{fmt_int(fast):>12}{fmt_int(safe):>24}{safe / fast:>8.2f}")
    finally:
        replica.stop()
        master.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
