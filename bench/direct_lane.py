"""The direct connection on vs off: does the sync client's private script connection pay for
itself?

    .venv/bin/python bench/direct_lane.py [--rounds R] [--n N] [--warmup W]

The direct connection (class ``DirectLane`` in jobqueue/store/scripts.py, issue 33) sent a
plain ``redis.Redis`` client's sync script calls over a per-thread connection with hiredis
packing, bypassing redis-py's command path. The project kept it only if a benchmark showed, in
one sitting, a gain of 20 % or more on a realistic workload. This script measures, in one
sitting, on two private redis-servers started here (one on a unix socket, one on TCP loopback
127.0.0.1):

* (a) ``jq.enqueue(task, i)`` one at a time, N calls (default 5,000);
* (b) the realistic sync-client workload: ``jq.enqueue(task, payload)`` one at a time, N
  calls, the payload a small JSON-able dict of 10 fields (strings, ints, a float, a bool, a
  short list, None) that changes with i.

The direct connection serves only a ``redis.Redis`` on a plain ``redis.ConnectionPool``: since the
bounded pool (commit 96a016b) ``JobQueue.from_url`` builds its client on a
``BlockingConnectionPool``, so it is inactive there. "on" and "off" therefore both use
``JobQueue(redis.Redis.from_url(url, decode_responses=True, ...))`` (a client the user made),
"off" with ``ScriptRunner._lane = None`` (the client's normal redis-py path); "from_url" is
the default ``JobQueue.from_url(url)`` client, shown for reference.

Each round runs every (transport, workload) pair on the three sides, interleaved, their order
rotating from round to round; each side gets a fresh JobQueue (its own pool), a flushed server
and W warm-up calls on the same path. Every round is printed, then the medians, the ratio
off/on (> 1: the direct connection is faster) and the gain in percent.

Three sittings on 2026-12-04 (2 CPUs, redis 7.0.15, redis-py 8.2.0 with hiredis; medians,
us per call, on / off / from_url; gain = (off - on) / off). The longest, 11 rounds:

    unix  a: enqueue(task, i)               153.6 / 220.0 / 233.0   30.2 %
    unix  b: enqueue(task, 10-field dict)   145.4 / 214.2 / 198.1   32.1 %
    tcp   a: enqueue(task, i)               145.9 / 268.4 / 248.4   45.6 %
    tcp   b: enqueue(task, 10-field dict)   213.1 / 250.2 / 255.5   14.8 %  (off/on 1.174)

Two 7-round sittings gave tcp b 14.3 % and 24.7 % (per-round ratios 0.58-1.83 across all
three: noise of a shared 2-CPU machine). (b) over TCP loopback, the realistic deployment, is
under the 20 % issue 33 asks in the longest sitting and in two of three, and the default
``JobQueue.from_url`` client never had the direct connection (from_url ~ off): it
was removed. This script now says so and exits; to measure again, run it from a checkout of
the commit before the removal (48b2bb5: ``git worktree add /tmp/lane 48b2bb5``, then
``PYTHONPATH=/tmp/lane python bench/direct_lane.py``). Note the import: without PYTHONPATH
the venv's jobqueue is imported, wherever that checkout is.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import redis
from _common import BenchServer, bench_server, describe_environment

from jobqueue import JobQueue

TASK_NAME = "bench_direct_lane"


def noop(*args: Any) -> None:
    """The registered task; never executed here (no worker runs)."""


def payload(i: int) -> dict[str, Any]:
    """A small, realistic JSON payload: ten fields."""
    return {
        "user_id": 100_000 + i,
        "email": f"user{i}@example.com",
        "action": "send_welcome",
        "template": "welcome-v2",
        "locale": "en-GB",
        "attempt": i % 3,
        "score": i * 0.25,
        "tags": ["signup", "web"],
        "verified": bool(i & 1),
        "referrer": None,
    }


def workload_a(jq: JobQueue, task: Any, i: int) -> None:
    jq.enqueue(task, i)


def workload_b(jq: JobQueue, task: Any, i: int) -> None:
    jq.enqueue(task, payload(i))


WORKLOADS: dict[str, Callable[[JobQueue, Any, int], None]] = {
    "a: enqueue(task, i)": workload_a,
    "b: enqueue(task, 10-field dict)": workload_b,
}


def lane_supported() -> bool:
    from jobqueue.store import scripts

    return hasattr(scripts, "DirectLane")


SIDES = ("on", "off", "from_url")


def open_queue(server: BenchServer, side: str) -> tuple[JobQueue, Any]:
    if side == "from_url":
        jq = JobQueue.from_url(server.url)
        jq.connect()
    else:
        # The options jobqueue's own clients use (store/connection.py), on redis-py's plain pool.
        client = redis.Redis.from_url(
            server.url, decode_responses=True, encoding_errors="replace",
            socket_connect_timeout=5, socket_timeout=10, health_check_interval=30,
        )
        jq = JobQueue(client)
    task = jq.task(name=TASK_NAME)(noop)
    runner: Any = jq._scripts
    lane = getattr(runner, "_lane", None)
    if side == "on" and lane is None:
        raise SystemExit("The direct connection (DirectLane) is not active on this client: "
                         "nothing to compare")
    if side == "off" and lane is not None:
        runner.close()
        runner._lane = None
    return jq, task


def measure(
    server: BenchServer,
    work: Callable[[JobQueue, Any, int], None],
    side: str,
    n: int,
    warmup: int,
) -> float:
    """Seconds for n calls of ``work`` (after warm-up) on one side."""
    server.flush()
    jq, task = open_queue(server, side)
    try:
        for i in range(1, warmup + 1):
            work(jq, task, -i)
        start = time.perf_counter()
        for i in range(n):
            work(jq, task, i)
        elapsed = time.perf_counter() - start
    finally:
        jq.close()
    return elapsed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=7, help="rounds per side (default 7)")
    parser.add_argument("--n", type=int, default=5_000, help="calls per round (default 5,000)")
    parser.add_argument("--warmup", type=int, default=500, help="warm-up calls (default 500)")
    args = parser.parse_args(argv)
    if not lane_supported():
        print("The direct connection (DirectLane) is gone from jobqueue.store.scripts: "
              "nothing to compare.")
        return 0
    print(f"sitting: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; "
          f"{args.rounds} rounds x {args.n:,} calls (+{args.warmup} warm-up)")
    # results[(transport, workload, side)] = [seconds per round]
    results: dict[tuple[str, str, str], list[float]] = {}
    with bench_server(None, allow_flush=False) as unix, \
            bench_server(None, allow_flush=False, tcp=True) as tcp:
        servers = {"unix": unix, "tcp": tcp}
        for line in describe_environment(unix).lines():
            print(line)
        print(f"tcp server: {tcp.url}")
        print()
        print(f"{'round':>5}  {'transport':<9} {'workload':<32} {'on':>8} {'off':>8} "
              f"{'from_url':>8}  (us per call; order)")
        for r in range(args.rounds):
            order = SIDES[r % 3:] + SIDES[:r % 3]
            if r % 2:
                order = order[::-1]
            for transport, server in servers.items():
                for name, work in WORKLOADS.items():
                    got = {}
                    for side in order:
                        got[side] = measure(server, work, side, args.n, args.warmup)
                        results.setdefault((transport, name, side), []).append(got[side])
                    us = " ".join(f"{got[side] / args.n * 1e6:>8.1f}" for side in SIDES)
                    print(f"{r + 1:>5}  {transport:<9} {name:<32} {us}  ({','.join(order)})")
    print()
    print(f"{'transport':<9} {'workload':<32} {'on us':>8} {'off us':>8} {'url us':>8} "
          f"{'off/on':>7} {'gain':>7}  per-round off/on")
    for transport in ("unix", "tcp"):
        for name in WORKLOADS:
            on = results[(transport, name, "on")]
            off = results[(transport, name, "off")]
            url = results[(transport, name, "from_url")]
            m_on, m_off = statistics.median(on), statistics.median(off)
            ratio = m_off / m_on
            # gain: time the direct connection saves, as a share of the time without it
            gain = (m_off - m_on) / m_off * 100
            per_round = " ".join(f"{b / a:.3f}" for a, b in zip(on, off, strict=True))
            print(f"{transport:<9} {name:<32} {m_on / args.n * 1e6:>8.1f} "
                  f"{m_off / args.n * 1e6:>8.1f} {statistics.median(url) / args.n * 1e6:>8.1f} "
                  f"{ratio:>7.3f} {gain:>6.1f}%  {per_round}")
    print()
    print("off/on > 1: the direct connection is faster. gain = (off - on) / off; "
          "throughput gain = off/on - 1.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
