"""What a page of a run listing costs when the indexes hold a million runs, first page to last,
in one sitting on one server, with redis-benchmark's EVALSHA round trip as the yardstick.

The server is filled through the scripts themselves (create_run, claim, complete, fail,
cancel): N runs finished over the fill, one in every 10,000 cancelled instead, 1,000 dead
with errors, and 10,000 left pending, in a queue of ``--partitions`` partitions. Then:

* walk: every page of the finished runs (``state=done``, ``--page`` rows a page) from the
  first to the last, following the cursors; each page's time, and the first tenth of the
  pages against the last tenth (a cost that grows with the depth would show there);
* cancelled: every page of ``state=cancelled``: the done index read to the end with a record
  read per entry, ``scan_limit`` (10,000) entries a page;
* error filter: the dead runs whose error holds "timeout", every page;
* time range: a window of a tenth of the fill, counted exactly, its first page;
* all states: the first page without a filter, and its count.

With ``--bullmq`` the same server then runs BullMQ's side (bench/bullmq/bench.mjs ``list``,
Node.js): ``--bullmq-n`` jobs (100,000) drained with completed jobs kept, then every page of
``getJobs(['completed'], start, end)`` of the same page size, each page timed; our own walk of
the done runs is timed again at that size for the comparison (both fills flushed first).

Target (issue 32): the last page of a 1 M-run listing costs what the first does (bounded per
page, not growing with the depth). Run ``python bench/listing.py`` (``--quick`` for 100,000
runs, ``--tcp`` for loopback).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from typing import NamedTuple

from _common import (
    QUICK_BASELINE_REQUESTS,
    BenchError,
    bench_server,
    describe_environment,
    fail,
    format_table,
    run_baselines,
    say,
)
from vs_bullmq import ensure_bullmq, node

from jobqueue import JobQueue
from jobqueue.client.base import Request
from jobqueue.ops.listing import RunQuery, runs_page
from jobqueue.store.runs import CLAIM, COMPLETE, FAIL

DEFAULT_N, QUICK_N = 1_000_000, 100_000
BATCH = 10_000
CLAIM_LIMIT = 1_000
DEAD, PENDING = 1_000, 10_000
DAY = 86_400_000
TARGET_DEPTH_RATIO = 1.5  # the last tenth of the pages against the first


def fill(jq: JobQueue, n: int) -> tuple[int, int]:
    """N finished runs (done, and cancelled one in 10,000), DEAD dead, PENDING pending.
    Returns the fill's first and last server times."""
    started = jq.server_time_ms()
    parts = jq.partitions_of("default")
    for start in range(0, n, BATCH):
        ids = [f"r{i:07d}" for i in range(start, min(start + BATCH, n))]
        jq.enqueue_many(Request("report", run_id=rid) for rid in ids)
        jq.cancel(ids[len(ids) // 2])
        for p in range(parts):
            keys = jq.partition_keys("default", p)
            while True:
                claimed = CLAIM.parse(jq.scripts.run(
                    CLAIM.call(keys, CLAIM_LIMIT, "bench", 600_000, DAY)))
                if not claimed.runs:
                    break
                items = [(r.run_id, r.fence, "null") for r in claimed.runs]
                jq.scripts.run(COMPLETE.call(keys, items, DAY))
        if (start // BATCH) % 10 == 0:
            say(f"  filled {start + len(ids):,} of {n:,}")
    dead = [f"x{i:05d}" for i in range(DEAD)]
    jq.enqueue_many(Request("report", run_id=rid) for rid in dead)
    for p in range(parts):
        keys = jq.partition_keys("default", p)
        while True:
            claimed = CLAIM.parse(jq.scripts.run(
                CLAIM.call(keys, CLAIM_LIMIT, "bench", 600_000, DAY)))
            if not claimed.runs:
                break
            pipe = jq.scripts
            for r in claimed.runs:
                error = "TimeoutError: upstream" if int(r.run_id[1:]) % 4 == 0 else "KeyError"
                pipe.run(FAIL.call(keys, r.run_id, r.fence, error, None, DAY))
    for start in range(0, PENDING, BATCH):
        jq.enqueue_many(Request("report", run_id=f"p{i:06d}", delay=3600)
                        for i in range(start, min(start + BATCH, PENDING)))
    return started, jq.server_time_ms()


class Seen(NamedTuple):
    """What a page said (the page itself is dropped: a million runs kept alive would make the
    collector's work, and so the later pages, grow with the depth)."""

    rows: int
    total: int
    total_exact: bool
    scanned: int


def walk(jq: JobQueue, query: RunQuery, page: int) -> tuple[list[float], list[Seen]]:
    """Every page to the end: each page's seconds, and what each said."""
    times, pages = [], []
    cursor = None
    while True:
        t = time.perf_counter()
        got = runs_page(jq, query, cursor=cursor, limit=page)
        times.append(time.perf_counter() - t)
        pages.append(Seen(len(got), got.total, got.total_exact, got.scanned))
        if got.next_cursor is None:
            return times, pages
        cursor = got.next_cursor


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f}"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a Redis URL (default: a private server)")
    parser.add_argument("--flush", action="store_true", help="allow FLUSHALL of --url")
    parser.add_argument("--tcp", action="store_true", help="a private server on TCP loopback")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_N:,} runs")
    parser.add_argument("-n", type=int, help=f"runs (default {DEFAULT_N:,})")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--page", type=int, default=100, help="rows a page (100)")
    parser.add_argument("--bullmq", action="store_true",
                        help="also BullMQ's getJobs pages, on the same server")
    parser.add_argument("--bullmq-n", type=int, default=100_000,
                        help="runs for the comparison with BullMQ (100,000)")
    args = parser.parse_args(argv)
    n = args.n or (QUICK_N if args.quick else DEFAULT_N)
    try:
        with bench_server(args.url, allow_flush=args.flush, tcp=args.tcp) as server:
            say("jobqueue listing benchmark")
            for line in describe_environment(server).lines():
                say(f"  {line}")
            baselines = run_baselines(server, QUICK_BASELINE_REQUESTS)
            jq = JobQueue.from_url(server.url, partitions={"default": args.partitions})
            jq.declare_task("report", max_attempts=1)
            try:
                t = time.perf_counter()
                first_ms, last_ms = fill(jq, n)
                fill_s = time.perf_counter() - t
                memory = server.client.info("memory")["used_memory"]
                say(f"filled {n:,} finished runs, {DEAD:,} dead and {PENDING:,} pending in "
                    f"{fill_s:.0f} s ({args.partitions} partitions); used_memory "
                    f"{memory / 2**20:,.0f} MiB")
                done_t, done_pages = walk(jq, RunQuery(state="done"), args.page)
                cancelled_t, cancelled_pages = walk(jq, RunQuery(state="cancelled"), args.page)
                error_t, error_pages = walk(jq, RunQuery(state="dead", error="timeout"),
                                            args.page)
                span = last_ms - first_ms
                window = RunQuery(state="done", since_ms=first_ms + span * 45 // 100,
                                  until_ms=first_ms + span * 55 // 100)
                t = time.perf_counter()
                window_page = runs_page(jq, window, limit=args.page)
                window_s = time.perf_counter() - t
                t = time.perf_counter()
                everything = runs_page(jq, RunQuery(), limit=args.page)
                everything_s = time.perf_counter() - t
            finally:
                jq.close()
            compared: tuple[list[float], list[float]] | None = None
            if args.bullmq:
                ensure_bullmq()
                server.flush()
                ours_jq = JobQueue.from_url(server.url, partitions={"default": args.partitions})
                ours_jq.declare_task("report", max_attempts=1)
                try:
                    fill(ours_jq, args.bullmq_n)
                    ours_times, _ = walk(ours_jq, RunQuery(state="done"), args.page)
                finally:
                    ours_jq.close()
                server.flush()
                bull = node("list", server.url, str(args.bullmq_n), str(args.page))
                compared = (ours_times, [t / 1000 for t in bull["times"]])
    except (BenchError, OSError) as exc:
        return fail(str(exc))
    serial = baselines.write_serial
    rtt = 1 / serial.ops_per_s if serial is not None and serial.ops_per_s else None
    listed = sum(p.rows for p in done_pages)
    tenth = max(1, len(done_t) // 10)
    head, tail = statistics.mean(done_t[:tenth]), statistics.mean(done_t[-tenth:])
    rows = []
    for name, times, pages in (
        (f"walk state=done ({args.page} a page)", done_t, done_pages),
        ("walk state=cancelled", cancelled_t, cancelled_pages),
        ("walk state=dead error~timeout", error_t, error_pages),
    ):
        rows.append([
            name, f"{len(times):,}", f"{sum(p.rows for p in pages):,}", ms(pct(times, 0.5)),
            ms(pct(times, 0.99)), ms(max(times)), f"{sum(times):.1f}",
            f"{pct(times, 0.5) / rtt:,.0f}" if rtt else "-",
        ])
    for name, seconds, page in (
        ("first page, a tenth of the fill by time", window_s, window_page),
        ("first page, every state", everything_s, everything),
    ):
        rows.append([name, "1", f"{len(page):,}", ms(seconds), "-", "-", f"{seconds:.3f}",
                     f"{seconds / rtt:,.0f}" if rtt else "-"])
    say()
    say(format_table(["listing", "pages", "rows", "p50 ms", "p99 ms", "max ms", "total s",
                      "p50 / redis-benchmark RTT"], rows))
    say()
    say(f"done listing: {listed:,} rows over {len(done_t):,} pages; counted "
        f"{done_pages[0].total:,} on its first page (exact: {done_pages[0].total_exact})")
    say(f"cancelled: {sum(p.rows for p in cancelled_pages):,} found in "
        f"{sum(p.scanned for p in cancelled_pages):,} entries looked at")
    say(f"time range: counted {window_page.total:,} exactly ({window_page.total_exact}); "
        f"every state: counted {everything.total:,}")
    ratio = tail / head
    say(f"  last tenth of the pages / first tenth: {ms(tail)} ms / {ms(head)} ms = "
        f"{ratio:.2f}x (target <= {TARGET_DEPTH_RATIO}x) "
        f"{'PASS' if ratio <= TARGET_DEPTH_RATIO else 'MISS'}")
    if compared is not None:
        ours_t, bull_t = compared
        say()
        rows = []
        for name, times in (("jobqueue runs_page", ours_t), ("BullMQ getJobs(completed)", bull_t)):
            k = max(1, len(times) // 10)
            rows.append([name, f"{len(times):,}", ms(pct(times, 0.5)), ms(pct(times, 0.99)),
                         ms(statistics.mean(times[:k])), ms(statistics.mean(times[-k:])),
                         f"{statistics.mean(times[-k:]) / statistics.mean(times[:k]):.2f}x"])
        say(format_table([f"{args.bullmq_n:,} finished, {args.page} a page", "pages", "p50 ms",
                          "p99 ms", "first tenth ms", "last tenth ms", "last / first"], rows))
        say(f"  BullMQ's p50 page over ours: {pct(bull_t, 0.5) / pct(ours_t, 0.5):.2f}x "
            "(above 1.00x ours is faster)")
    cancelled = -(-n // BATCH)  # one a batch
    found = sum(p.rows for p in cancelled_pages)
    if listed != n - cancelled or found != cancelled:
        return fail(f"the walks listed {listed:,} done and {found:,} cancelled runs, not "
                    f"{n - cancelled:,} and {cancelled:,}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
