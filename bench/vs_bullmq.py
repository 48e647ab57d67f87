"""jobqueue next to BullMQ (Node) on the same server, in one sitting: enqueue, bulk create, and
the drain rate of a worker process whose task does real I/O.

    .venv/bin/python bench/vs_bullmq.py [--url URL | --tcp] [--n N] [--quick] [--repeat R]
                                        [--flush]

Needs Node.js and npm: BullMQ is installed into bench/bullmq/node_modules on first use
(``npm install``; never into the package). Phases, each on a freshly flushed server, each
system measured the same way; with --repeat R, R rounds of every phase, BullMQ's
next to ours in each (figures: medians over the rounds; ratios of rates: the median of each
round's ratio):

* enqueue one at a time: N ``jq.enqueue(task, i)`` / ``await queue.add(name, {i})``;
* bulk: ``enqueue_many`` / ``addBulk``, 1,000 per call;
* drain: N runs are created first (jobqueue: due at an instant D a few seconds ahead; BullMQ:
  into a paused queue, resumed at D by the worker once it is ready), then ONE worker process
  drains them. The rate is N / (last finish - D), the last finish read from Redis (the done
  index / the completed set, whose scores are finish times). Tasks: ``incr`` does one INCR on
  the task's own Redis connection (sync, and ``aincr`` as ``async def`` for jobqueue), the
  I/O a real task does; ``noop`` does nothing; ``cpu`` (jobqueue only) burns about 1 ms.
  The worker's CPU per run (user + system, from /proc) says what a run costs the worker, and
  its context switches per run (its threads', from /proc) how many thread hand-offs and
  waits it takes;
* ceilings, in this process, no worker: the task's own INCR alone (redis-py sync, and
  redis.asyncio with --concurrency calls in flight), and the best a sync Python task can
  drain at: one thread that claims --concurrency runs, runs each INCR in turn, and commits
  them with the next claim in one round trip (no hand-offs, no heartbeats, no hooks).

This machine may be shared and noisy: compare the ratios within one run, not figures across
runs. redis-benchmark's EVALSHA rates on the same server are printed as the yardstick.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from _common import (
    BenchError,
    BenchServer,
    add_common_args,
    baseline_table,
    bench_server,
    describe_environment,
    fail,
    fmt_int,
    format_table,
    run_baselines,
    runs_from_args,
    say,
)
from worker import LEAD_MS, Workers, server_ms, tree_cpu, tree_switches

from jobqueue import JobQueue, Request
from jobqueue.errors import JobQueueError
from jobqueue.payload import decode_payload
from jobqueue.store.keys import PartitionKeys
from jobqueue.store.runs import CLAIM, COMPLETE

DEFAULT_N = 20_000
QUICK_N = 4_000
BULK = 1_000
NODE_DIR = Path(__file__).resolve().parent / "bullmq"
BULL_COMPLETED = "bull:bench:completed"
COUNTER = "bench:count"
DRAIN_TIMEOUT_S = 180.0
PK = PartitionKeys("default", 0)


@dataclass(frozen=True)
class Drain:
    rate: float  # runs/s
    cpu_us: float  # worker CPU per run, microseconds
    switches: float  # the worker's context switches per run (thread hand-offs, I/O waits)
    server_us: float  # redis-server CPU per run, microseconds (INFO cpu)
    busy: float  # cores the whole machine kept busy meanwhile (/proc/stat: every process)
    preempted: float  # of the switches per run, the involuntary ones (preemptions)


class Meter:
    """CPU of the worker (its process tree), of the server and of the whole machine, from
    construction to ``drain``: where the cores went while a drain ran."""

    def __init__(self, client: Any, pid: int) -> None:
        self.client, self.pid = client, pid
        self.cpu, self.switches = tree_cpu(pid), tree_switches(pid)
        self.preempted = tree_switches(pid, "nonvoluntary_")
        self.server = server_cpu(client)
        self.machine = machine_busy()
        self.t0 = time.monotonic()

    def drain(self, n: int, seconds: float) -> Drain:
        cpu, switches = tree_cpu(self.pid) - self.cpu, tree_switches(self.pid) - self.switches
        preempted = tree_switches(self.pid, "nonvoluntary_") - self.preempted
        server = server_cpu(self.client) - self.server
        busy = (machine_busy() - self.machine) / (time.monotonic() - self.t0)
        return Drain(
            n / seconds, cpu / n * 1e6, switches / n, server / n * 1e6, busy, preempted / n
        )


def server_cpu(client: Any) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def machine_busy() -> float:
    """CPU seconds every process of the machine has used (/proc/stat: all but idle, iowait)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


# -- BullMQ -----------------------------------------------------------------------------------


def ensure_bullmq() -> None:
    if shutil.which("node") is None or shutil.which("npm") is None:
        raise BenchError(
            "Node.js and npm are needed for the BullMQ side (apt-get install nodejs npm)"
        )
    if not (NODE_DIR / "node_modules" / "bullmq").is_dir():
        say("installing BullMQ into bench/bullmq/node_modules (npm install) ...")
        proc = subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", "--silent"],
            cwd=NODE_DIR,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if proc.returncode != 0:
            raise BenchError(f"npm install failed: {(proc.stderr or proc.stdout).strip()[-500:]}")


def node(*args: str) -> dict[str, Any]:
    proc = subprocess.run(
        ["node", "bench.mjs", *args], cwd=NODE_DIR, capture_output=True, text=True, timeout=600
    )
    if proc.returncode != 0:
        raise BenchError(f"node bench.mjs {args[0]} failed: {proc.stderr.strip()[-500:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def bull_enqueue(server: BenchServer, n: int, bulk: bool) -> float:
    server.flush()
    return float(node("bulk" if bulk else "enqueue", server.url, str(n))["rate"])


def bull_drain(server: BenchServer, n: int, task: str, concurrency: int) -> Drain:
    server.flush()
    node("fill", server.url, str(n), task)
    proc = subprocess.Popen(
        ["node", "bench.mjs", "worker", server.url, str(concurrency), task],
        cwd=NODE_DIR,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            err = proc.stderr.read() if proc.stderr else ""
            raise BenchError(f"the BullMQ worker exited: {err.strip()[-500:]}")
        t0 = int(json.loads(line)["t0"])
        meter = Meter(server.client, proc.pid)
        wait_done(lambda: int(server.client.zcard(BULL_COMPLETED)), n, "BullMQ")
        ((_, last),) = server.client.zrange(BULL_COMPLETED, -1, -1, withscores=True)
        drain = meter.drain(n, (int(last) - t0) / 1000.0)
        check_counter(server, n, task)
        return drain
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


# -- jobqueue ---------------------------------------------------------------------------------


def jq_enqueue(server: BenchServer, n: int, bulk: bool) -> float:
    server.flush()
    jq = JobQueue.from_url(server.url)
    task = jq.declare_task("noop")
    try:
        start = time.perf_counter()
        if bulk:
            for first in range(0, n, BULK):
                jq.enqueue_many([Request(task, (i,)) for i in range(first, min(first + BULK, n))])
        else:
            for i in range(n):
                jq.enqueue(task, i)
        return n / (time.perf_counter() - start)
    finally:
        jq.close()


def jq_drain(
    server: BenchServer, n: int, task_name: str, concurrency: int, processes: int
) -> Drain:
    server.flush()
    jq = JobQueue.from_url(server.url)
    task = jq.declare_task(task_name)
    client = server.client
    workers = Workers(server.url, concurrency, processes, env={"BENCH_TASK_URL": server.url})
    try:
        due = server_ms(client) + LEAD_MS
        for first in range(0, n, BULK):
            batch = range(first, min(first + BULK, n))
            jq.enqueue_many([Request(task, (i,), at=due / 1000.0) for i in batch])
        workers.wait_registered(client)
        if server_ms(client) >= due:
            raise BenchError("setup took longer than the lead time; try a smaller --n")
        while server_ms(client) < due:  # the meters count the drain only
            time.sleep(0.001)
        meter = Meter(client, workers.popen.pid)
        wait_done(lambda: int(client.zcard(PK.done)), n, "jobqueue")
        ((_, last),) = client.zrange(PK.done, -1, -1, withscores=True)
        drain = meter.drain(n, (int(last) - due) / 1000.0)
        check_counter(server, n, task_name)
        return drain
    finally:
        workers.stop()
        jq.close()


# -- ceilings ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ceiling:
    rate: float  # per second
    cpu_us: float  # this process's CPU per operation, microseconds


def measured(n: int, fn: Callable[[], None]) -> Ceiling:
    cpu0, t0 = time.process_time(), time.perf_counter()
    fn()
    return Ceiling(n / (time.perf_counter() - t0), (time.process_time() - cpu0) / n * 1e6)


def incr_alone(server: BenchServer, n: int) -> Ceiling:
    """The sync task's own I/O: one INCR after the other on one redis-py connection."""
    server.flush()
    client = redis.Redis.from_url(server.url)
    client.ping()


    def loop() -> None:
        for _ in range(n):
            client.incr(COUNTER)

    try:
        return measured(n, loop)
    finally:
        client.close()


def aincr_alone(server: BenchServer, n: int, concurrency: int) -> Ceiling:
    """The async task's own I/O: INCRs on redis.asyncio, ``concurrency`` in flight."""
    import asyncio

    import redis.asyncio as aioredis

    server.flush()

    async def go() -> Ceiling:
        client: Any = aioredis.Redis.from_url(server.url)
        await asyncio.gather(*(client.ping() for _ in range(concurrency)))  # the connections

        async def one(k: int) -> None:
            for _ in range(k):
                await client.incr(COUNTER)

        share = [n // concurrency + (i < n % concurrency) for i in range(concurrency)]
        cpu0, t0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(one(k) for k in share))
        result = Ceiling(n / (time.perf_counter() - t0), (time.process_time() - cpu0) / n * 1e6)
        await client.aclose()
        return result

    return asyncio.run(go())


def sync_ceiling(server: BenchServer, n: int, concurrency: int) -> Ceiling:
    """One thread: claim ``concurrency`` runs, do each run's INCR in turn, then commit them and
    claim the next ones in one round trip. No hand-offs, heartbeats, hooks or metrics: what a
    sync Python task can drain at with these scripts."""
    server.flush()
    jq = JobQueue.from_url(server.url)
    task = jq.declare_task("incr")
    client = redis.Redis.from_url(server.url)
    try:
        for first in range(0, n, BULK):
            jq.enqueue_many([Request(task, (i,)) for i in range(first, min(first + BULK, n))])
        retention = jq.settings.done_retention_ms
        dead = jq.settings.dead_retention_ms

        def drain() -> None:
            finished: list[tuple[str, int, str]] = []
            left = n
            while left > 0:
                calls = [COMPLETE.call(PK, finished, retention)] if finished else []
                calls.append(CLAIM.call(PK, concurrency, "ceiling", 30_000, dead))
                replies = jq.scripts.run_each(calls)
                for reply in replies:
                    if isinstance(reply, Exception):
                        raise reply
                left -= len(finished)
                finished = []
                for run in CLAIM.parse(replies[-1]).runs:
                    decode_payload(run.payload)
                    client.incr(COUNTER)
                    finished.append((run.run_id, run.fence, "null"))
                if not finished and left > 0:
                    raise BenchError("the ceiling loop found nothing to claim")

        result = measured(n, drain)
        check_counter(server, n, "incr")
        return result
    finally:
        client.close()
        jq.close()


# -- shared -----------------------------------------------------------------------------------


def wait_done(count: Callable[[], int], n: int, who: str) -> None:
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    while (done := count()) < n:
        if time.monotonic() > deadline:
            raise BenchError(f"{who} drain: only {done:,} of {n:,} done in {DRAIN_TIMEOUT_S:g} s")
        time.sleep(0.02)


def check_counter(server: BenchServer, n: int, task: str) -> None:
    """The I/O tasks must each have done their INCR: the figure is for work really done."""
    if task in ("incr", "aincr"):
        got = int(server.client.get(COUNTER) or 0)
        if got != n:
            raise BenchError(f"{task}: the counter is {got:,}, not {n:,}")


def ratio(ours: float, theirs: float) -> str:
    return times(ours / theirs if theirs > 0 else None)


Sample = Drain | Ceiling | float


class Rounds:
    """Every phase measured once per round, the rounds one after the other: a figure is the
    median over the rounds (the lower middle one for an even count), and a rate's ratio the
    median of the ratios within each round. On a host whose speed drifts (a shared machine),
    the two sides of a ratio are then measured within the same round, a minute or two apart,
    not one side's repeats first and the other's several minutes later."""

    def __init__(self) -> None:
        self.samples: dict[str, list[Sample]] = {}

    def add(self, name: str, sample: Sample) -> None:
        self.samples.setdefault(name, []).append(sample)

    def median(self, name: str) -> Any:
        """The sample of median rate (a Drain or Ceiling keeps its CPU figures with it)."""
        samples = sorted(self.samples[name], key=rate_of)
        return samples[(len(samples) - 1) // 2]

    def ratio(self, ours: str, theirs: str) -> float | None:
        """None when no round has a rate to divide by."""
        pairs = zip(self.samples[ours], self.samples[theirs], strict=True)
        ratios = [rate_of(a) / rate_of(b) for a, b in pairs if rate_of(b) > 0]
        return statistics.median_low(ratios) if ratios else None


def times(value: float | None, suffix: str = "") -> str:
    return "-" if value is None else f"{value:.2f}x{suffix}"


def rate_of(sample: Sample) -> float:
    return sample if isinstance(sample, float) else sample.rate


def one_round(rounds: Rounds, server: BenchServer, n: int, c: int) -> None:
    """Each phase once, each next to the phases it is compared with."""
    rounds.add("jq enqueue", jq_enqueue(server, n, False))
    rounds.add("bull enqueue", bull_enqueue(server, n, False))
    rounds.add("jq bulk", jq_enqueue(server, n, True))
    rounds.add("bull bulk", bull_enqueue(server, n, True))
    rounds.add("jq incr 1", jq_drain(server, n, "incr", c, 1))
    rounds.add("bull incr", bull_drain(server, n, "incr", c))
    rounds.add("jq aincr 1", jq_drain(server, n, "aincr", c, 1))
    rounds.add("bull incr at 10", bull_drain(server, n, "incr", 10))
    rounds.add("jq incr 2", jq_drain(server, n, "incr", c, 2))
    rounds.add("ceiling", sync_ceiling(server, n, c))
    rounds.add("incr alone", incr_alone(server, n))
    rounds.add("aincr alone", aincr_alone(server, n, c))
    rounds.add("bull noop", bull_drain(server, n, "noop", c))
    rounds.add("jq noop 1", jq_drain(server, n, "noop", c, 1))
    rounds.add("jq cpu 1", jq_drain(server, n, "cpu", c, 1))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="jobqueue vs BullMQ on the same server.")
    add_common_args(parser, default_n=DEFAULT_N, quick_n=QUICK_N)
    parser.add_argument(
        "--concurrency", type=int, default=50, help="worker slots for both (default 50)"
    )
    args = parser.parse_args(argv)
    n = runs_from_args(args)
    c, r = args.concurrency, args.repeat
    try:
        ensure_bullmq()
        with bench_server(args.url, allow_flush=args.flush, tcp=args.tcp) as server:
            baselines = run_baselines(server, 20_000 if args.quick else 100_000)
            say("jobqueue vs BullMQ, one sitting, same server")
            for line in describe_environment(server).lines():
                say(f"  {line}")
            bull_version = json.loads((NODE_DIR / "node_modules/bullmq/package.json").read_text())
            node_version = subprocess.run(["node", "--version"], capture_output=True, text=True)
            say(f"  BullMQ {bull_version['version']} on Node {node_version.stdout.strip()}")
            say(f"  N = {n:,} per phase, {r} round(s), worker concurrency {c} (BullMQ also 10)")
            say()
            say(baseline_table(baselines))
            say()
            rounds = Rounds()
            for k in range(r):
                started = time.monotonic()
                one_round(rounds, server, n, c)
                say(f"  round {k + 1} of {r}: {time.monotonic() - started:.0f} s")
            rows = table_rows(rounds, c)
    except (BenchError, JobQueueError, redis.exceptions.RedisError, OSError) as exc:
        return fail(str(exc))
    say()
    say(format_table(["workload", "jobqueue", f"BullMQ (c={c})", "ratio"], rows, "lrrr"))
    say()
    say(
        "figures: medians over the rounds; ratio: jobqueue / BullMQ, for rates the median of "
        "the ratios within each round, for CPU and switches per run the ratio of the figures "
        "shown (lower is better). Drain: N / (last finish - "
        "the instant the runs became claimable), finish times from Redis. Cores busy: CPU "
        f"time of every process on the machine ({os.cpu_count()} cores) during the drain, "
        "per second: a drain near that figure is short of CPU."
    )
    return 0


def table_rows(rounds: Rounds, c: int) -> list[list[str]]:
    rows: list[list[str]] = []
    med = rounds.median

    def row(what: str, ours: str, theirs: str | None, unit: str = "/s") -> None:
        mine = rate_of(med(ours))
        rows.append(
            [
                what,
                fmt_int(mine) + unit,
                "-" if theirs is None else fmt_int(rate_of(med(theirs))) + unit,
                "-" if theirs is None else times(rounds.ratio(ours, theirs)),
            ]
        )

    def cpu_row(what: str, mine: float, theirs: float) -> None:
        rows.append([what, f"{fmt_int(mine)} us", f"{fmt_int(theirs)} us", ratio(mine, theirs)])

    row("enqueue one at a time", "jq enqueue", "bull enqueue")
    row("bulk create, 1,000 per call", "jq bulk", "bull bulk")
    for task, label in (("incr", "sync"), ("aincr", "async")):
        row(f"drain, 1 INCR per task ({label}), 1 process", f"jq {task} 1", "bull incr")
        row("  (BullMQ at concurrency 10)", f"jq {task} 1", "bull incr at 10")
    row("drain, no-op task, 1 process", "jq noop 1", "bull noop")
    row("drain, ~1 ms CPU task, 1 process", "jq cpu 1", None)
    two: Drain = med("jq incr 2")
    rows.append(
        [
            "drain, 1 INCR per task (sync), 2 processes",
            fmt_int(two.rate) + "/s",
            "-",
            times(rounds.ratio("jq incr 2", "jq incr 1"), " of 1 process"),
        ]
    )
    bull_incr: Drain = med("bull incr")
    for task, label in (("incr", "1 INCR sync"), ("aincr", "1 INCR async"), ("noop", "no-op")):
        theirs = bull_incr if task != "noop" else med("bull noop")
        cpu_row(f"worker CPU per run, {label}", med(f"jq {task} 1").cpu_us, theirs.cpu_us)
    for task, label in (("incr", "1 INCR sync"), ("aincr", "1 INCR async")):
        ours: Drain = med(f"jq {task} 1")
        cpu_row(f"redis-server CPU per run, {label}", ours.server_us, bull_incr.server_us)
        rows.append(
            [f"cores busy, whole machine, {label}", f"{ours.busy:.2f}", f"{bull_incr.busy:.2f}",
             "-"]
        )
    rows.append(
        [
            "cores busy, whole machine, sync, 2 processes",
            f"{two.busy:.2f}",
            "-",
            f"worker CPU {two.cpu_us:,.0f} us/run",
        ]
    )
    for task, label in (("incr", "1 INCR sync"), ("aincr", "1 INCR async")):
        ours = med(f"jq {task} 1")
        rows.append(
            [
                f"worker context switches per run, {label}",
                f"{ours.switches:.2f}",
                f"{bull_incr.switches:.2f}",
                ratio(ours.switches, bull_incr.switches),
            ]
        )
        rows.append(
            [
                "  of which preemptions (involuntary)",
                f"{ours.preempted:.2f}",
                f"{bull_incr.preempted:.2f}",
                "-",
            ]
        )
    ceiling: Ceiling = med("ceiling")
    alone: Ceiling = med("incr alone")
    aalone: Ceiling = med("aincr alone")
    rows.append(
        [
            "ceiling, sync task, one thread, no worker",
            fmt_int(ceiling.rate) + "/s",
            fmt_int(bull_incr.rate) + "/s",
            f"{times(rounds.ratio('ceiling', 'bull incr'))} (worker: "
            f"{times(rounds.ratio('jq incr 1', 'ceiling'))} of it)",
        ]
    )
    rows.append(["  its CPU per run", f"{ceiling.cpu_us:,.0f} us", "-", "-"])
    rows.append(
        [
            "the task's INCR alone, sync: CPU per call",
            f"{alone.cpu_us:,.0f} us",
            "-",
            f"{fmt_int(alone.rate)}/s",
        ]
    )
    rows.append(
        [
            f"the task's INCR alone, async ({c} in flight): CPU per call",
            f"{aalone.cpu_us:,.0f} us",
            "-",
            f"{fmt_int(aalone.rate)}/s",
        ]
    )
    return rows


if __name__ == "__main__":
    sys.exit(main())
