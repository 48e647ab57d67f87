"""Core throughput of jobqueue's Redis paths, next to redis-benchmark on the same server.

    .venv/bin/python bench/core.py [--url URL] [--n N] [--quick] [--repeat R] [--flush]

Phases, each on a freshly flushed server after a warm-up on the same path:

* enqueue one at a time: ``JobQueue.enqueue(task, i)`` N times, one create_run round trip each;
* bulk create: ``JobQueue.enqueue_many`` with batches of 1,000 Requests (building them included);
* batched claim+complete: drain N pending runs (created beforehand, untimed) with
  ``claim_call(limit=100)`` and then one batched ``complete_many_call`` per claimed
  batch: the Redis work of a no-op worker, without its thread pool.

With ``--events both`` (the default) each phase runs twice in the sitting, its queue's event
log on (the default: every transition writes an entry) and off (``set_queue_events(queue,
enabled=False)``), and the cost of the log is shown per run, with the memory 10,000 events
take in the server (MEMORY USAGE of a full log over its entries). ``--events on`` / ``off``
runs one side only.

Each figure is shown with the issue's target (PASS/MISS), where the time went (CPU of this
process and of the server, as a share of the wall time and in microseconds per run), and its
ratio to redis-benchmark's EVALSHA throughput measured in the same run: one-at-a-time against
``-c 1 -P 1``, the batched paths against ``-c 1 -P 16``. Without --url a private embedded
server is used; a --url server must be empty (it is FLUSHALLed) unless --flush is given.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from functools import partial
from typing import Any

import redis
from _common import (
    BASELINE_REQUESTS,
    QUICK_BASELINE_REQUESTS,
    Baselines,
    BenchError,
    BenchServer,
    Measurement,
    Sample,
    add_common_args,
    baseline_table,
    bench_server,
    describe_environment,
    fail,
    fastest,
    fmt_int,
    measurement_table,
    python_evalsha_rate,
    run_baselines,
    runs_from_args,
    sampled,
    say,
    warmup_size,
)

from jobqueue import JobQueue, Request, Task
from jobqueue.errors import JobQueueError
from jobqueue.payload import encode_result
from jobqueue.store.keys import PartitionKeys
from jobqueue.store.runs import CLAIM, COMPLETE

DEFAULT_N = 20_000
QUICK_N = 2_000
BULK_BATCH = 1_000
CLAIM_LIMIT = 100
TASK_NAME = "bench_noop"
OWNER = "bench-core"

TARGET_ENQUEUE = 10_000.0
TARGET_BULK = 50_000.0
TARGET_CLAIM_COMPLETE = 30_000.0

NoopTask = Task[Any, Any]


def noop(i: int) -> None:
    """The registered task; never executed here (no worker runs)."""


EVENTS = True  # whether the phases' queue writes its event log (main() sets it per pass)


def open_queue(server: BenchServer) -> tuple[JobQueue, NoopTask]:
    """A fresh client (own pool, nothing cached about queues) with the no-op task registered,
    its queue's event log on or off as EVENTS says."""
    jq = JobQueue.from_url(server.url)
    task = jq.task(name=TASK_NAME)(noop)
    if not EVENTS:
        jq.set_queue_events(task.options.queue, enabled=False)
    return jq, task


def only_partition(jq: JobQueue, task: NoopTask) -> PartitionKeys:
    (pk,) = jq.all_partition_keys(task.options.queue)
    return pk


# -- phases -----------------------------------------------------------------------------------


def bench_enqueue_one(server: BenchServer, n: int, warmup: int) -> Sample:
    """N ``enqueue`` calls, each its own round trip."""
    server.flush()
    jq, task = open_queue(server)
    try:
        for i in range(1, warmup + 1):
            jq.enqueue(task, -i)

        def work() -> int:
            created = 0
            for i in range(n):
                created += jq.enqueue(task, i).created
            return created

        created, sample = sampled(server, work)
        pending = server.client.zcard(only_partition(jq, task).due)
    finally:
        jq.close()
    if created != n or pending != n + warmup:
        raise BenchError(f"enqueue: created {created:,} of {n:,}; {pending:,} runs pending")
    return sample


def enqueue_in_batches(jq: JobQueue, task: NoopTask, first: int, count: int) -> int:
    """Create runs with arguments first .. first+count-1, BULK_BATCH per enqueue_many."""
    created = 0
    for start in range(first, first + count, BULK_BATCH):
        stop = min(start + BULK_BATCH, first + count)
        handles = jq.enqueue_many([Request(task, (i,)) for i in range(start, stop)])
        created += sum(h.created for h in handles)
    return created


def bench_bulk(server: BenchServer, n: int, warmup: int) -> Sample:
    """N runs created with enqueue_many, building the Requests included."""
    server.flush()
    jq, task = open_queue(server)
    try:
        enqueue_in_batches(jq, task, -BULK_BATCH, BULK_BATCH)  # one full batch, whatever N
        created, sample = sampled(server, lambda: enqueue_in_batches(jq, task, 0, n))
    finally:
        jq.close()
    if created != n:
        raise BenchError(f"bulk create: created {created:,} of {n:,}")
    return sample


def drain(jq: JobQueue, pk: PartitionKeys, n: int) -> int:
    """Claim (up to CLAIM_LIMIT at a time) and complete until N runs are done: one claim round
    trip, then one pipelined round trip of completes per batch, as a no-op worker does."""
    settings, runner = jq.settings, jq.scripts
    result = encode_result(None)
    done = 0
    while done < n:
        call = CLAIM.call(
            pk, CLAIM_LIMIT, OWNER, settings.default_lease_ms, settings.dead_retention_ms
        )
        claimed = CLAIM.parse(runner.run(call)).runs
        if not claimed:
            raise BenchError(f"claim+complete: nothing left to claim after {done:,} of {n:,}")
        complete = COMPLETE.call(
            pk, [(r.run_id, r.fence, result) for r in claimed], settings.done_retention_ms
        )
        for run, outcome in zip(claimed, COMPLETE.parse(runner.run(complete)), strict=True):
            if not outcome.accepted:
                raise BenchError(f"complete of {run.run_id} refused: {outcome.status}")
        done += len(claimed)
    return done


def bench_claim_complete(server: BenchServer, n: int, warmup: int) -> Sample:
    """Drain N pending runs; they are created (and a warm-up drained) beforehand, untimed."""
    server.flush()
    jq, task = open_queue(server)
    client = server.client
    try:
        pk = only_partition(jq, task)
        enqueue_in_batches(jq, task, -warmup, warmup)
        drain(jq, pk, warmup)
        if enqueue_in_batches(jq, task, 0, n) != n:
            raise BenchError("claim+complete: could not create the pending runs")
        drained, sample = sampled(server, lambda: drain(jq, pk, n))
        completed = int(client.hget(pk.stats, "completed") or 0)
        left = client.zcard(pk.due) + client.zcard(pk.leases)
    finally:
        jq.close()
    if drained != n or completed != n + warmup or left:
        raise BenchError(
            f"claim+complete: drained {drained:,} of {n:,}, {completed:,} completed in all, "
            f"{left:,} still pending or leased"
        )
    return sample


# -- report -----------------------------------------------------------------------------------


def report_header(
    server: BenchServer, n: int, warmup: int, repeat: int, baselines: Baselines
) -> None:
    say("jobqueue core benchmark")
    for line in describe_environment(server).lines():
        say(f"  {line}")
    best = f", fastest of {repeat}" if repeat > 1 else ""
    say(f"  N = {fmt_int(n)} runs per phase{best}, each after a warm-up of {fmt_int(warmup)}")
    if baselines.tool is None:
        say("  no redis-benchmark or valkey-benchmark on PATH: no baseline, no ratios")
    else:
        say(f"  baseline: {baselines.tool}, {fmt_int(baselines.requests)} requests per figure")


FOOTNOTE = """\
cpu cli/srv: CPU time of this process / of the server as a share of the wall time; us/run:
the same CPU time per run in microseconds. ratio: our runs/s over redis-benchmark's EVALSHA/s
of the HSET+ZADD script (one run's worth of writes). Batched ratios compare runs with script
calls: one create_run call writes up to 500 runs; claim+complete makes one claim call and
one complete call per 100 runs."""


def event_bytes(server: BenchServer, n: int) -> float | None:
    """Bytes 10,000 events take: a log filled with N runs' created events (events on, the
    default 10,000 kept), MEMORY USAGE over its entries."""
    server.flush()
    jq, task = open_queue(server)
    try:
        enqueue_in_batches(jq, task, 0, max(n, 10_000))
        key = only_partition(jq, task).events
        used = server.client.memory_usage(key, samples=0)
        entries = server.client.xlen(key)
    finally:
        jq.close()
    return None if not used or not entries else used / entries * 10_000


def main(argv: Sequence[str] | None = None) -> int:
    global EVENTS
    parser = argparse.ArgumentParser(
        description="Throughput of enqueue, bulk create and batched claim+complete, "
        "with redis-benchmark EVALSHA on the same server as the yardstick."
    )
    add_common_args(parser, default_n=DEFAULT_N, quick_n=QUICK_N)
    parser.add_argument("--events", choices=("both", "on", "off"), default="both",
                        help="the queue's event log on, off, or each phase both ways")
    args = parser.parse_args(argv)
    n = runs_from_args(args)
    warmup, repeat = warmup_size(n), args.repeat
    requests = QUICK_BASELINE_REQUESTS if args.quick else BASELINE_REQUESTS
    try:
        with bench_server(args.url, allow_flush=args.flush, tcp=args.tcp) as server:
            baselines = run_baselines(server, requests)
            report_header(server, n, warmup, repeat, baselines)
            python_rate = python_evalsha_rate(server, n, warmup)
            say()
            say(baseline_table(baselines, [("same script via redis-py", "-c 1 -P 1", python_rate)]))
            serial, pipelined = baselines.write_serial, baselines.write_pipelined
            sides = {"both": (True, False), "on": (True,), "off": (False,)}[args.events]
            measurements = []
            for name, target, baseline, phase in (
                ("enqueue one at a time", TARGET_ENQUEUE, serial, bench_enqueue_one),
                (f"bulk create (batches of {fmt_int(BULK_BATCH)})", TARGET_BULK, pipelined,
                 bench_bulk),
                (f"claim({CLAIM_LIMIT}) + batched complete", TARGET_CLAIM_COMPLETE, pipelined,
                 bench_claim_complete),
            ):
                for events in sides:
                    EVENTS = events
                    label = name + ("" if len(sides) == 1 else (", events on" if events
                                                                  else ", events off"))
                    measurements.append(Measurement(
                        label, n, fastest(repeat, partial(phase, server, n, warmup)),
                        target, baseline,
                    ))
            EVENTS = True
            memory = event_bytes(server, n) if True in sides else None
    except (BenchError, JobQueueError, redis.exceptions.RedisError) as exc:
        return fail(str(exc))
    say()
    say(measurement_table(measurements))
    if args.events == "both":
        say()
        for on, off in zip(measurements[0::2], measurements[1::2], strict=True):
            extra = on.seconds / off.seconds - 1
            cost = (on.seconds - off.seconds) / on.runs * 1e6
            say(f"  events cost: {extra:+.1%} ({cost:+.2f} us/run) in "
                f"{on.name.removesuffix(', events on')}")
    if memory is not None:
        say(f"  memory: 10,000 events take {memory / 1024:,.0f} KiB in the server "
            f"({memory / 10_000:.0f} bytes each)")
    say()
    say(FOOTNOTE)
    missed = [m.name for m in measurements if m.verdict == "MISS"]
    say("all targets met" if not missed else "targets missed: " + "; ".join(missed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
