"""What a queue's rate limit counts, measured: claims, and the task starts that follow them.

    .venv/bin/python bench/rate_limit.py [--n N] [--limit L] [--concurrency C]
                                         [--margins 0,0.05,0.1]

For each margin: a private server, a rate of L runs per second with that margin
(``set_queue_rate(q, L, per=1, margin=M)``), N runs due at once, and ONE ``jobqueue worker``
process (``--concurrency C``) that drains them; each run's code records when it started. It
prints the most claims (the records' ``started``, the server's clock) and the most task
starts (the host's clock, the same machine) in any 1,000 ms window, and how far starts lag
their claims (median, p99, max). A limit holds for callers of an external API when the most
starts in any second stays at or under L.
"""

from __future__ import annotations

import argparse
import bisect
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import redis

from jobqueue import JobQueue
from jobqueue.store.embedded import EmbeddedServer, find_server_binary

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def most_in_window(times_ms: list[float], window_ms: float) -> int:
    """The most of ``times_ms`` in any half-open window [t, t + window_ms)."""
    times = sorted(times_ms)
    return max(
        (bisect.bisect_left(times, t + window_ms) - i for i, t in enumerate(times)), default=0
    )


def sitting(n: int, limit: int, margin: float, concurrency: int) -> dict[str, float]:
    server = EmbeddedServer(find_server_binary()).start()
    try:
        url = server.url
        r = redis.Redis.from_url(url, decode_responses=True)
        jq = JobQueue.from_url(url)
        jq.declare_task("call", max_attempts=1)
        jq.set_queue_rate("default", limit, per=1.0, margin=margin)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT)]),
               "BENCH_TASK_URL": url}  # fmt: skip
        worker = subprocess.Popen(
            [sys.executable, "-m", "jobqueue.cli", "--redis-url", url, "--log-level", "WARNING",
             "worker", "--app", "rate_app:jq", "--concurrency", str(concurrency)],
            env=env, cwd=str(HERE),
        )  # fmt: skip
        try:
            handles = jq.enqueue_many(
                [__import__("jobqueue").Request("call", (i,)) for i in range(n)]
            )
            deadline = time.monotonic() + n / limit * 2 + 60
            while r.llen("rate:starts") < n:
                if time.monotonic() > deadline:
                    raise SystemExit(f"only {r.llen('rate:starts')} of {n} runs started")
                time.sleep(0.2)
        finally:
            worker.terminate()
            worker.wait(30)
        starts: dict[int, float] = {}
        for entry in r.lrange("rate:starts", 0, -1):
            i, ms = entry.split()
            starts[int(i)] = float(ms)
        claims = {i: float(jq.get_run(h.run_id).started_ms or 0) for i, h in enumerate(handles)}
        lags = sorted(starts[i] - claims[i] for i in starts)
        return {
            "claims": most_in_window(list(claims.values()), 1000),
            "starts": most_in_window(list(starts.values()), 1000),
            "lag_p50": statistics.median(lags),
            "lag_p99": lags[int(len(lags) * 0.99) - 1],
            "lag_max": lags[-1],
        }
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--limit", type=int, default=20)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--margins", default="0,0.05,0.1")
    args = parser.parse_args()
    print(f"rate {args.limit}/s, {args.n} runs, one worker of --concurrency {args.concurrency}")
    print(f"{'margin':>7} {'claims/1s':>10} {'starts/1s':>10} {'lag p50':>9} {'p99':>8} "
          f"{'max':>8}")  # fmt: skip
    for margin in (float(m) for m in args.margins.split(",")):
        got = sitting(args.n, args.limit, margin, args.concurrency)
        print(f"{margin:>6g}s {got['claims']:>10.0f} {got['starts']:>10.0f} "
              f"{got['lag_p50']:>7.1f}ms {got['lag_p99']:>6.1f}ms {got['lag_max']:>6.1f}ms")


if __name__ == "__main__":
    main()
