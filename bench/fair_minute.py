"""Fair shares over a minute with real worker processes: group a of weight 3 and group b of
weight 1 in one queue, both kept busy, drained by ``jobqueue worker --processes P`` started
from the shell on TCP loopback. The task is one ``INCR`` on its own connection (I/O, not a
no-op). Every --window seconds the groups' served counts (claim.lua's count of runs claimed
per group) are read; printed: each window's shares and a:b ratio, and the minute's.

A feeder keeps each group at least --backlog runs waiting (a group that runs dry would be
served less through no fault of the ring). What is measured is the claims' split, so the
figures do not depend on the machine's speed; how many runs a minute holds does.

    python bench/fair_minute.py                 # 60 s, 2 worker processes of 16 slots
    python bench/fair_minute.py --seconds 10    # a smoke run
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime

import redis
from _common import BenchError, bench_server, fail, format_table, say
from worker import Workers

from jobqueue.client.base import Request
from jobqueue.client.sync import JobQueue
from jobqueue.errors import JobQueueError
from jobqueue.store.keys import PartitionKeys

QUEUE = "default"
PK = PartitionKeys(QUEUE, 0)  # the queue has one partition
WEIGHTS = {"a": 3, "b": 1}
CHUNK = 2_000


def served(client: redis.Redis) -> dict[str, int]:
    return {g: int(n) for g, n in client.hgetall(PK.gserved).items()}


def feed(jq: JobQueue, backlog: int, stop: threading.Event) -> None:
    """Tops each group up to ``backlog`` waiting runs, every 50 ms."""
    while not stop.is_set():
        for g in WEIGHTS:
            missing = backlog - int(jq.redis.zcard(PK.gq(g)))
            if missing > 0:
                n = min(missing, CHUNK)
                jq.enqueue_many(Request("incr", (0,), limit_key=g) for _ in range(n))
        stop.wait(0.05)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="how long (default 60)")
    parser.add_argument("--window", type=float, default=10.0, help="seconds per window")
    parser.add_argument("--processes", type=int, default=2, help="worker processes (2)")
    parser.add_argument("--concurrency", type=int, default=16, help="slots per process (16)")
    parser.add_argument("--backlog", type=int, default=5_000, help="runs kept waiting (5,000)")
    parser.add_argument("--url", help="an empty Redis to use instead of a private one")
    parser.add_argument("--flush", action="store_true", help="allow wiping a non-empty --url")
    args = parser.parse_args(argv)
    rows: list[list[str]] = []
    stop = threading.Event()
    try:
        with bench_server(args.url, allow_flush=args.flush, tcp=not args.url) as server:
            jq = JobQueue(redis.Redis.from_url(server.url, decode_responses=True))
            jq.declare_task("incr")
            jq.set_fair_shares(QUEUE)
            for g, w in WEIGHTS.items():
                jq.set_group(QUEUE, g, weight=w)
            say("jobqueue fair shares over time, worker processes, one sitting")
            say(f"  sitting: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; weights {WEIGHTS}; "
                f"{args.processes} x jobqueue worker --concurrency {args.concurrency}; "
                f"task: one INCR")
            jq.pause_queue(QUEUE)  # the backlogs go in first, so the first claim sees both
            feeder = threading.Thread(target=feed, args=(jq, args.backlog, stop), daemon=True)
            feeder.start()
            while any(int(jq.redis.zcard(PK.gq(g))) < args.backlog for g in WEIGHTS):
                time.sleep(0.05)
            workers = Workers(server.url, args.concurrency, args.processes,
                              env={"BENCH_TASK_URL": server.url})
            try:
                workers.wait_registered(jq.redis)
                jq.resume_queue(QUEUE)
                start, last = time.monotonic(), served(jq.redis)
                first = dict(last)
                k = 0
                while time.monotonic() - start < args.seconds:
                    time.sleep(min(args.window, args.seconds - (time.monotonic() - start)))
                    now = served(jq.redis)
                    k += 1
                    rows.append(row(f"window {k}", now, last))
                    last = now
                total = time.monotonic() - start
                rows.append(row(f"all {total:.0f} s", last, first))
            finally:
                stop.set()
                workers.stop()
            feeder.join(5)
    except (BenchError, JobQueueError, redis.exceptions.RedisError) as exc:
        stop.set()
        return fail(str(exc))
    say(format_table(["", "runs of a", "runs of b", "a share", "a:b", "off 3:1"], rows,
                     "lrrrrr"))
    return 0


def row(label: str, now: dict[str, int], before: dict[str, int]) -> list[str]:
    a = now.get("a", 0) - before.get("a", 0)
    b = now.get("b", 0) - before.get("b", 0)
    ratio = a / b if b else float("inf")
    share = a / (a + b) if a + b else 0.0
    return [label, f"{a:,}", f"{b:,}", f"{share:.3f}", f"{ratio:.3f}",
            f"{(ratio - 3) / 3:+.2%}" if b else "-"]


if __name__ == "__main__":
    sys.exit(main())
