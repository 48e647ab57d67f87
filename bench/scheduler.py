"""Recurring jobs at scale: Redis memory per job, and one herd turned into runs by 1, 2 and 4
scheduler processes sharing the scheduler partitions.

    .venv/bin/python bench/scheduler.py [--url URL] [--n N] [--quick] [--flush]
                                        [--schedulers 1,2,4] [--partitions 8]

1. Register N hourly jobs (``0 * * * *``, UTC, jitter 60 s, fire-once) in pipelined batches of
   10,000 (the exact definition JSON and next-fire entry ``Recurring.schedule`` writes, over
   K scheduler partitions with the spread placement). Redis ``used_memory`` before and after
   gives bytes per recurring job.
2. For each count of scheduler processes (1, 2, 4): register the herd again (the server
   flushed), start the processes (``Scheduler``, explicit clock), let them settle who owns
   which partition (each should own K / processes), then make them all tick once at the herd's
   fire time, together. Reported per round: the jobs read (``sched_due``) and the runs sent to
   ``sched_create`` summed over the processes, as multiples of the herd (both must stay ~1x
   whatever the count: no scheduler repeats another's work), the largest share one process
   did (~1/N), the scheduler processes' CPU per run and the server's CPU per run.

This machine has 2 cores shared by the server and every scheduler process: several processes
cannot make the wall clock faster here (the server's one thread is the limit), so what the
rounds show is the work each does and the CPU each side spends per run, not wall-clock scaling.
A scheduler with a core of its own and one server (or master) per share of the partitions is
what the CPU figures extrapolate to (``jobqueue capacity`` does that arithmetic).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis
from _common import (
    BenchError,
    add_common_args,
    bench_server,
    describe_environment,
    fail,
    fmt_int,
    format_table,
    runs_from_args,
    say,
    server_cpu_seconds,
)

from jobqueue import JobQueue
from jobqueue.errors import JobQueueError
from jobqueue.recurring.config import SchedulerConfig
from jobqueue.recurring.daemon import Scheduler
from jobqueue.recurring.declarations import make_definition
from jobqueue.recurring.definitions import SCHED_CONFIG_KEY, sched_keys, sched_partition_of
from jobqueue.recurring.fires import first_fire_after
from jobqueue.store.keys import placement_record

DEFAULT_N = 1_000_000
QUICK_N = 50_000
PIPELINE_BATCH = 10_000
T0 = 1_800_000_000_000  # 2027-01-15T08:00:00Z
SETTLE_ROUNDS = 12
LEASE_S = 120.0  # long: a slow round on a shared machine never loses a partition


def used_memory(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def register(jq: JobQueue, n: int, partitions: int) -> int:
    """n hourly jobs over ``partitions`` spread scheduler partitions; their first fire."""
    jq.redis.hset(SCHED_CONFIG_KEY, "partitions", placement_record(partitions, True))
    jq.recurring.forget()
    template = make_definition(jq, "job-0", "report", cron="0 * * * *", jitter=60)
    first = first_fire_after(template, T0)
    assert first is not None
    text = template.to_json()
    keys = [sched_keys(k, partitions, True) for k in range(partitions)]
    for start in range(0, n, PIPELINE_BATCH):
        by: dict[int, list[str]] = {}
        for i in range(start, min(n, start + PIPELINE_BATCH)):
            job = f"job-{i}"
            by.setdefault(sched_partition_of(job, partitions), []).append(job)
        pipe = jq.redis.pipeline(transaction=False)
        for k, ids in by.items():
            pipe.hset(keys[k].defs, mapping=dict.fromkeys(ids, text))
            pipe.zadd(keys[k].next, dict.fromkeys(ids, first))
        pipe.execute()
    return first


# -- one scheduler process ------------------------------------------------------------------


@dataclass(frozen=True)
class Share:
    name: str
    partitions: int
    jobs_read: int
    runs_sent: int
    runs_created: int
    advanced: int
    seconds: float
    cpu: float
    error: str = ""


def _scheduler(url: str, name: str, fire: int, barrier: Any, go: Any, out: Any) -> None:
    try:
        jq = JobQueue.from_url(url)
        jq.declare_task("report")
        s = Scheduler(jq, SchedulerConfig(lookahead=0, partition_lease=LEASE_S),
                      install_signal_handlers=False, scheduler_id=name)  # fmt: skip
        for i in range(SETTLE_ROUNDS):  # nothing due yet: only who owns what settles
            barrier.wait(timeout=120)
            s.tick(now=fire - 10_000 + i)
        out.put(("owned", name, len(s.ownership.owned())))
        go.wait(timeout=120)
        cpu, start = time.process_time(), time.monotonic()
        r = s.tick(now=fire)
        seconds, cpu = time.monotonic() - start, time.process_time() - cpu
        out.put(("done", Share(name, r.partitions, r.due_jobs, r.runs_requested,
                               r.runs_created, r.advanced, seconds, cpu)))  # fmt: skip
        s.close()
        jq.close()
    except Exception as exc:  # reported by the parent, which fails the benchmark
        out.put(("done", Share(name, 0, 0, 0, 0, 0, 0.0, 0.0, f"{type(exc).__name__}: {exc}")))


@dataclass(frozen=True)
class Round:
    processes: int
    herd: int
    shares: list[Share]
    seconds: float
    server_cpu: float

    @property
    def jobs_read(self) -> int:
        return sum(s.jobs_read for s in self.shares)

    @property
    def runs_sent(self) -> int:
        return sum(s.runs_sent for s in self.shares)

    @property
    def largest_share(self) -> float:
        return max(s.jobs_read for s in self.shares) / self.herd


def herd_round(url: str, client: Any, n: int, partitions: int, processes: int) -> Round:
    jq = JobQueue.from_url(url)
    fire = register(jq, n, partitions)
    jq.close()
    ctx = mp.get_context("fork")
    barrier, go, out = ctx.Barrier(processes), ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(target=_scheduler, args=(url, f"bench-{i}", fire, barrier, go, out))
        for i in range(processes)
    ]
    for p in procs:
        p.start()
    try:
        owned = [out.get(timeout=600) for _ in procs]
        if any(kind != "owned" for kind, *_ in owned):
            raise BenchError(f"a scheduler failed while settling: {owned}")
        counts = sorted(count for _, _, count in owned)
        if sum(counts) != partitions or counts[-1] - counts[0] > 1:
            raise BenchError(f"ownership did not settle: {counts} of {partitions} partitions")
        cpu = server_cpu_seconds(client)
        start = time.monotonic()
        go.set()
        shares = [out.get(timeout=1800)[1] for _ in procs]
        seconds = time.monotonic() - start
        server_cpu = server_cpu_seconds(client) - cpu
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    errors = [s.error for s in shares if s.error]
    if errors:
        raise BenchError(errors[0])
    created = sum(s.runs_created for s in shares)
    if created != n or sum(s.advanced for s in shares) != n:
        raise BenchError(f"{created:,} runs created of {n:,}")
    return Round(processes, n, shares, seconds, server_cpu)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(parser, default_n=DEFAULT_N, quick_n=QUICK_N)
    parser.add_argument("--schedulers", default="1,2,4",
                        help="scheduler process counts to measure (default 1,2,4)")
    parser.add_argument("--partitions", type=int, default=8,
                        help="scheduler partitions K (default 8)")
    args = parser.parse_args(argv)
    n = runs_from_args(args)
    counts = [int(c) for c in args.schedulers.split(",") if c]
    rounds: list[Round] = []
    try:
        with bench_server(args.url, allow_flush=args.flush, tcp=args.tcp) as server:
            for line in describe_environment(server).lines():
                say(line)
            client = server.client
            jq = JobQueue.from_url(server.url)
            before = used_memory(client)
            start = time.monotonic()
            register(jq, n, args.partitions)
            reg_s = time.monotonic() - start
            per_job = (used_memory(client) - before) / n
            jq.close()
            say(f"\nregistered {fmt_int(n)} hourly jobs over {args.partitions} scheduler "
                f"partitions in {reg_s:.1f} s; redis memory {per_job:.0f} bytes per recurring "
                "job")  # fmt: skip
            for processes in counts:
                server.flush()
                rounds.append(herd_round(server.url, client, n, args.partitions, processes))
                r = rounds[-1]
                say(f"  {processes} scheduler(s): {fmt_int(n)} runs in {r.seconds:.1f} s")
    except (BenchError, JobQueueError, redis.exceptions.RedisError) as exc:
        return fail(str(exc))
    rows = []
    for r in rounds:
        client_cpu = sum(s.cpu for s in r.shares)
        rows.append([
            str(r.processes),
            f"{r.seconds:.1f}",
            fmt_int(r.herd / r.seconds),
            f"{r.jobs_read / r.herd:.2f}x",
            f"{r.runs_sent / r.herd:.2f}x",
            f"{r.largest_share:.2f}",
            ", ".join(str(s.partitions) for s in r.shares),
            f"{client_cpu / r.herd * 1e6:.1f}",
            f"{r.server_cpu / r.herd * 1e6:.1f}",
        ])  # fmt: skip
    say()
    say(f"one herd of {fmt_int(n)} jobs due at once, K = {args.partitions}:")
    say(format_table(
        ["procs", "wall s", "runs/s", "jobs read", "runs sent", "largest share",
         "partitions", "sched CPU us/run", "server CPU us/run"],
        rows,
    ))  # fmt: skip
    say()
    say("jobs read and runs sent are summed over the processes, as multiples of the herd:")
    say("1.00x is every job read and every run sent once. The largest share is the most one")
    say("process did (1/N when shared evenly). Wall-clock figures are capped by 2 shared cores;")
    say("the CPU columns are what each side spends per run: a process plans 1e6 / (sched CPU)")
    say("runs/s on a core of its own, a server or master runs 1e6 / (server CPU) of them.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
