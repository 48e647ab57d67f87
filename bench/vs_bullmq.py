"""jobqueue next to BullMQ (Node) on the same server, in one sitting: enqueue, bulk create, and
the drain rate of a worker process whose task does real I/O.

    .venv/bin/python bench/vs_bullmq.py [--url URL | --tcp] [--n N] [--quick] [--repeat R]
                                        [--flush] [--concurrency C] [--latency-runs M]
                                        [--before DIR_OR_COMMIT]

The jobqueue measured is the one Python imports (printed with its commit): from another
checkout than the venv's, set ``PYTHONPATH=/path/to/checkout``; the workers inherit it. The
issue's figures are for ``--tcp`` (TCP loopback, as ``jobqueue worker`` is run from a shell)
and ``--repeat 3`` or more; ``--quick`` (N = 4,000, one round) is a smoke run of ~2 minutes.

Needs Node.js and npm: BullMQ is installed into bench/bullmq/node_modules on first use
(``npm install``; never into the package). Phases, each on a freshly flushed server, each
system measured the same way; with --repeat R, R rounds of every phase, BullMQ's
next to ours in each (figures: medians over the rounds; ratios of rates: the median of each
round's ratio):

* enqueue one at a time: N ``jq.enqueue(task, i)`` / ``await queue.add(name, {i})``;
* bulk: ``enqueue_many`` / ``addBulk``, 1,000 per call;
* drain: ONE worker process drains N runs (jobqueue: the worker is started and registered,
  then the runs are created due at an instant D a second or two ahead; BullMQ: they are
  created in a paused queue, which the worker resumes at D once it is ready). The rate is
  N / (last finish - D), the last finish read from Redis (the done
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

* idle-start latency: one idle, already started worker (``jobqueue worker``, the same
  command and engine as the drains; ``node bench.mjs worker``), M runs enqueued one at a time
  20 ms apart. "start": from just before the enqueue call to the task's first line (the
  ``stamp`` task returns its wall clock; the same host), what a caller waits for; "claim":
  jobqueue's started - due (the claim script's server ms, bench/worker.py's figure: it
  leaves out the hand-off from the claim to the task) and BullMQ's processedOn - timestamp.
  Pooled over the rounds;
* --before: an older jobqueue (a source directory or a git commit, ``git archive``d) whose
  worker drains the no-op runs and takes the latency runs too, next to ours in each round.

What each figure says. Runs/s and its ratio to BullMQ's: the rate a caller sees. Of ceiling:
the drain over the one-thread sync ceiling (above 1x: the worker overlaps the task's I/O
with its own round trips). Worker CPU per run: what a run costs the worker's cores;
context switches per run: thread hand-offs and waits (preempted: the scheduler took the
core, a loaded machine). Redis commands per run: every command the server ran during the
drain (INFO commandstats deltas, those inside scripts included, the bench's own polls not)
over N, and of them the script calls: the server work and, roughly, the round trips a run
costs; server CPU per run the same from INFO cpu. Cores busy: the machine's CPU time per
second of drain (near the core count: the drain was short of CPU, figures pessimistic).
The targets table checks the issue's figures: async and sync drains against BullMQ's at
c=50 (>= 1.5x, >= 1.0x), the sync worker's CPU per run against BullMQ's (<= 1.0x), the
idle-start "start" p99 (< 5 ms), and with --before the no-op drain (>= 0.95x: a few %
is noise here) and the p99 (at most 1 ms above); every one is printed with PASS or MISS.

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
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
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
from worker import (
    BENCH_DIR,
    LATENCY_GAP_S,
    LATENCY_RUNS,
    TARGET_P99_MS,
    Workers,
    percentile,
    server_ms,
    tree_cpu,
    tree_switches,
)

import jobqueue
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
# The targets (see the docstring): jobqueue / BullMQ (c=50) drain rates, the sync
# worker's CPU per run over BullMQ's, and against --before: the no-op drain's ratio and the
# idle-start p99's excess (this machine is noisy: a few % either way is no change).
TARGET_ASYNC, TARGET_SYNC, TARGET_CPU = 1.5, 1.0, 1.0
BEFORE_DRAIN, BEFORE_P99_MS = 0.95, 1.0
SCRIPT_COMMANDS = ("cmdstat_evalsha", "cmdstat_eval", "cmdstat_fcall", "cmdstat_evalsha_ro",
                   "cmdstat_eval_ro", "cmdstat_fcall_ro")


@dataclass(frozen=True)
class Drain:
    rate: float  # runs/s
    cpu_us: float  # worker CPU per run, microseconds
    switches: float  # the worker's context switches per run (thread hand-offs, I/O waits)
    server_us: float  # redis-server CPU per run, microseconds (INFO cpu)
    busy: float  # cores the whole machine kept busy meanwhile (/proc/stat: every process)
    preempted: float  # of the switches per run, the involuntary ones (preemptions)
    commands: float  # Redis commands per run (INFO commandstats: those inside scripts too)
    scripts: float  # of which script calls (EVALSHA, EVAL, FCALL) per run


class Meter:
    """CPU of the worker (its process tree), of the server and of the whole machine, from
    construction to ``drain``: where the cores went while a drain ran."""

    def __init__(self, client: Any, pid: int) -> None:
        self.client, self.pid = client, pid
        self.cpu, self.switches = tree_cpu(pid), tree_switches(pid)
        self.preempted = tree_switches(pid, "nonvoluntary_")
        self.server = server_cpu(client)
        self.commands = command_calls(client)
        self.machine = machine_busy()
        self.t0 = time.monotonic()

    def drain(self, n: int, seconds: float, polls: int) -> Drain:
        """``polls``: the commands the bench itself sent meanwhile (INFO is never counted)."""
        after = command_calls(self.client)
        commands, scripts = (b - a for a, b in zip(self.commands, after, strict=True))
        cpu, switches = tree_cpu(self.pid) - self.cpu, tree_switches(self.pid) - self.switches
        preempted = tree_switches(self.pid, "nonvoluntary_") - self.preempted
        server = server_cpu(self.client) - self.server
        busy = (machine_busy() - self.machine) / (time.monotonic() - self.t0)
        return Drain(
            n / seconds, cpu / n * 1e6, switches / n, server / n * 1e6, busy, preempted / n,
            (commands - polls) / n, scripts / n,
        )


def server_cpu(client: Any) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def command_calls(client: Any) -> tuple[int, int]:
    """Commands the server has run (INFO commandstats; a script's own commands count too,
    INFO never), and of them script calls."""
    stats = client.info("commandstats")
    calls = {name: int(v["calls"]) for name, v in stats.items() if name != "cmdstat_info"}
    return sum(calls.values()), sum(calls.get(name, 0) for name in SCRIPT_COMMANDS)


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


@contextmanager
def bull_worker(server: BenchServer, concurrency: int, task: str) -> Iterator[tuple[int, int]]:
    """``node bench.mjs worker``: its pid, and the instant (ms) it resumed the queue."""
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
        yield proc.pid, int(json.loads(line)["t0"])
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def bull_drain(server: BenchServer, n: int, task: str, concurrency: int) -> Drain:
    server.flush()
    node("fill", server.url, str(n), task)
    with bull_worker(server, concurrency, task) as (pid, t0):
        meter = Meter(server.client, pid)
        polls = wait_done(lambda: int(server.client.zcard(BULL_COMPLETED)), n, "BullMQ")
        ((_, last),) = server.client.zrange(BULL_COMPLETED, -1, -1, withscores=True)
        drain = meter.drain(n, (int(last) - t0) / 1000.0, polls + 1)
    check_counter(server, n, task)
    return drain


def bull_latency(server: BenchServer, m: int, concurrency: int) -> Latency:
    server.flush()
    with bull_worker(server, concurrency, "stamp"):
        time.sleep(0.5)  # let it settle into its idle wait
        got = node("latency", server.url, str(m), str(round(LATENCY_GAP_S * 1000)))
    return Latency(got["start"], got["claim"])


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
    server: BenchServer,
    n: int,
    task_name: str,
    concurrency: int,
    processes: int,
    env: dict[str, str] | None = None,
) -> Drain:
    """``env``: the worker's (with --before, a PYTHONPATH on the older source)."""
    server.flush()
    jq = JobQueue.from_url(server.url)
    task = jq.declare_task(task_name)
    client = server.client
    env = {"BENCH_TASK_URL": server.url, **(env or {})}
    workers = Workers(server.url, concurrency, processes, env=env)
    try:
        # Started first: on a loaded machine its start-up alone can outlast any fixed lead.
        workers.wait_registered(client)
        due = server_ms(client) + 1_500 + n // 5  # time to create the runs
        for first in range(0, n, BULK):
            batch = range(first, min(first + BULK, n))
            jq.enqueue_many([Request(task, (i,), at=due / 1000.0) for i in batch])
        if server_ms(client) >= due:
            raise BenchError("setup took longer than the lead time; try a smaller --n")
        while server_ms(client) < due:  # the meters count the drain only
            time.sleep(0.001)
        meter = Meter(client, workers.popen.pid)
        polls = wait_done(lambda: int(client.zcard(PK.done)), n, "jobqueue")
        ((_, last),) = client.zrange(PK.done, -1, -1, withscores=True)
        drain = meter.drain(n, (int(last) - due) / 1000.0, polls + 1)
        check_counter(server, n, task_name)
        return drain
    finally:
        workers.stop()
        jq.close()


@dataclass(frozen=True)
class Latency:
    """Idle-start latencies (ms) of runs enqueued one at a time into an idle worker. start:
    from just before the enqueue call (the producer's clock) to the task's first line (the
    worker's clock; the same host). claim: jobqueue's started - due (the claim script's
    server clock, ms: bench/worker.py's figure), BullMQ's processedOn - timestamp."""

    start: list[float]
    claim: list[float]


def jq_latency(
    server: BenchServer, m: int, concurrency: int, env: dict[str, str] | None = None
) -> Latency:
    server.flush()
    jq = JobQueue.from_url(server.url)
    task = jq.declare_task("stamp")
    workers = Workers(server.url, concurrency, 1, env=env)
    try:
        workers.wait_registered(server.client)
        time.sleep(0.5)  # let it settle into its idle wait
        sent = []
        for _ in range(m):
            t = time.time()
            sent.append((t, jq.enqueue(task)))
            time.sleep(LATENCY_GAP_S)
        start = [(float(h.result(timeout=30)) - t) * 1000 for t, h in sent]
        pipe = server.client.pipeline(transaction=False)
        for _, h in sent:
            pipe.hmget(PK.run(h.run_id), "due", "started")
        return Latency(start, [float(int(s) - int(d)) for d, s in pipe.execute()])
    finally:
        workers.stop()
        jq.close()


def source_tree(before: str, keep: list[tempfile.TemporaryDirectory[str]]) -> str:
    """--before: a directory holding jobqueue/ (and lua/), or a git commit of this repository,
    extracted (``git archive``) into a temporary directory kept alive in ``keep``."""
    if Path(before, "jobqueue").is_dir():
        return str(Path(before).resolve())
    tmp = tempfile.TemporaryDirectory(prefix="jq-before-")
    keep.append(tmp)
    archive = subprocess.run(
        ["git", "-C", str(BENCH_DIR.parent), "archive", before, "jobqueue", "lua"],
        capture_output=True,
    )
    if archive.returncode != 0:
        raise BenchError(f"--before {before}: {archive.stderr.decode(errors='replace')[-300:]}")
    subprocess.run(["tar", "-x", "-C", tmp.name], input=archive.stdout, check=True)
    return tmp.name


def source_of(path: str) -> str:
    """Where a jobqueue source tree is, with its git commit (and '+dirty' if it differs)."""
    git = ["git", "-C", path]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0 or not (Path(path) / ".git").exists():
        return path
    dirty = subprocess.run([*git, "status", "--porcelain", "--", "jobqueue", "lua"],
                           capture_output=True, text=True).stdout.strip()
    return f"{path} (commit {head.stdout.strip()}{'+dirty' if dirty else ''})"


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


def wait_done(count: Callable[[], int], n: int, who: str) -> int:
    """Poll ``count`` until it reaches n; how many times it was called."""
    deadline, polls = time.monotonic() + DRAIN_TIMEOUT_S, 1
    while (done := count()) < n:
        if time.monotonic() > deadline:
            raise BenchError(f"{who} drain: only {done:,} of {n:,} done in {DRAIN_TIMEOUT_S:g} s")
        time.sleep(0.02)
        polls += 1
    return polls


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
        self.latencies: dict[str, Latency] = {}  # pooled over the rounds

    def add_latency(self, name: str, got: Latency) -> None:
        had = self.latencies.get(name, Latency([], []))
        self.latencies[name] = Latency(had.start + got.start, had.claim + got.claim)

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


def one_round(
    rounds: Rounds, server: BenchServer, n: int, c: int, m: int, before: dict[str, str] | None
) -> None:
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
    if before is not None:
        rounds.add("before noop 1", jq_drain(server, n, "noop", c, 1, before))
    rounds.add("jq cpu 1", jq_drain(server, n, "cpu", c, 1))
    rounds.add_latency("jq", jq_latency(server, m, c))
    rounds.add_latency("bull", bull_latency(server, m, c))
    if before is not None:
        rounds.add_latency("before", jq_latency(server, m, c, before))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="jobqueue vs BullMQ on the same server.")
    add_common_args(parser, default_n=DEFAULT_N, quick_n=QUICK_N)
    parser.add_argument(
        "--concurrency", type=int, default=50, help="worker slots for both (default 50)"
    )
    parser.add_argument(
        "--latency-runs", type=int, default=LATENCY_RUNS,
        help=f"runs per idle-start latency phase (default {LATENCY_RUNS})",
    )
    parser.add_argument(
        "--before",
        help="older jobqueue to compare the no-op drain and idle-start latency with: a "
        "source directory (holding jobqueue/ and lua/) or a git commit of this repository",
    )
    args = parser.parse_args(argv)
    n = runs_from_args(args)
    c, r, m = args.concurrency, args.repeat, args.latency_runs
    keep: list[tempfile.TemporaryDirectory[str]] = []
    try:
        ensure_bullmq()
        before_env = None
        if args.before:
            tree = source_tree(args.before, keep)
            path = os.pathsep.join([str(BENCH_DIR), tree, os.environ.get("PYTHONPATH", "")])
            before_env = {"PYTHONPATH": path}
        with bench_server(args.url, allow_flush=args.flush, tcp=args.tcp) as server:
            baselines = run_baselines(server, 20_000 if args.quick else 100_000)
            say("jobqueue vs BullMQ, one sitting, same server")
            for line in describe_environment(server).lines():
                say(f"  {line}")
            bull_version = json.loads((NODE_DIR / "node_modules/bullmq/package.json").read_text())
            node_version = subprocess.run(["node", "--version"], capture_output=True, text=True)
            say(f"  BullMQ {bull_version['version']} on Node {node_version.stdout.strip()}")
            say(f"  jobqueue measured: {source_of(str(Path(jobqueue.__file__).parents[1]))}")
            if args.before:
                say(f"  --before: {args.before} ({tree})")
            say(f"  N = {n:,} per phase, {r} round(s), worker concurrency {c} (BullMQ also 10); "
                f"idle-start latency: {m} runs a round, {LATENCY_GAP_S * 1000:g} ms apart")
            say()
            say(baseline_table(baselines))
            say()
            rounds = Rounds()
            for k in range(r):
                started = time.monotonic()
                one_round(rounds, server, n, c, m, before_env)
                say(f"  round {k + 1} of {r}: {time.monotonic() - started:.0f} s")
    except (BenchError, JobQueueError, redis.exceptions.RedisError, OSError) as exc:
        return fail(str(exc))
    finally:
        for tmp in keep:
            tmp.cleanup()
    say()
    say(format_table(["workload", "jobqueue", f"BullMQ (c={c})", "ratio"],
                     table_rows(rounds, c), "lrrr"))
    say()
    say(format_table(DRAIN_HEADERS, drain_rows(rounds, c), "lrrrrrrr"))
    say()
    say(format_table(LATENCY_HEADERS, latency_rows(rounds), "lrrrrrr"))
    say()
    verdicts = target_rows(rounds, c)
    say(format_table(["target", "measured", "wanted", ""], verdicts, "lrll"))
    missed = [row[0] for row in verdicts if row[3] == "MISS"]
    say("all targets met" if not missed else f"targets missed: {len(missed)} of {len(verdicts)}")
    say()
    say(FOOTNOTE.format(cores=os.cpu_count()))
    return 0


FOOTNOTE = """\
figures: medians over the rounds; ratio: jobqueue / BullMQ, for rates the median of the
ratios within each round (lower is better for CPU). Drain: N / (last finish - the instant
the runs became claimable), finish times from Redis. Of ceiling: the drain's rate over the
one-thread sync ceiling's, the median of the rounds' ratios. Per run, over the drain: the
worker's CPU (its process tree, /proc), its context switches (all its threads; preempted:
the involuntary ones), the commands the server ran (INFO commandstats, those run inside
scripts included, the bench's own polls not; scripts: of them the EVALSHA/EVAL/FCALL calls)
and the server's CPU (INFO cpu). Cores busy: CPU time of every process on the machine
({cores} cores) during the drain, per second: a drain near that figure is short of CPU.
Idle-start latencies: pooled over the rounds."""

DRAIN_HEADERS = ["drain (1 process unless said)", "runs/s", "of ceiling", "worker CPU/run",
                 "switches/run (preempted)", "Redis cmds/run (scripts)", "server CPU/run",
                 "cores busy"]
LATENCY_HEADERS = ["idle-start latency, ms", "start p50", "p99", "max", "claim p50", "p99",
                   "max"]


def drain_rows(rounds: Rounds, c: int) -> list[list[str]]:
    names = [
        ("jq incr 1", f"jobqueue c={c}, sync INCR"),
        ("jq aincr 1", f"jobqueue c={c}, async INCR"),
        ("jq incr 2", f"jobqueue c={c}, sync INCR, 2 processes"),
        ("jq noop 1", f"jobqueue c={c}, no-op"),
        ("before noop 1", f"--before c={c}, no-op"),
        ("jq cpu 1", f"jobqueue c={c}, ~1 ms CPU"),
        ("bull incr", f"BullMQ c={c}, INCR"),
        ("bull incr at 10", "BullMQ c=10, INCR"),
        ("bull noop", f"BullMQ c={c}, no-op"),
    ]
    rows = []
    for name, label in names:
        if name not in rounds.samples:
            continue
        d: Drain = rounds.median(name)
        rows.append([
            label,
            fmt_int(d.rate),
            times(rounds.ratio(name, "ceiling")),
            f"{d.cpu_us:,.0f} us",
            f"{d.switches:.2f} ({d.preempted:.2f})",
            f"{d.commands:.2f} ({d.scripts:.2f})",
            f"{d.server_us:,.0f} us",
            f"{d.busy:.2f}",
        ])
    return rows


def latency_rows(rounds: Rounds) -> list[list[str]]:
    rows = []
    for name, label in (("jq", "jobqueue"), ("before", "--before"), ("bull", "BullMQ")):
        got = rounds.latencies.get(name)
        if got is None:
            continue
        cells = [label]
        for values in (sorted(got.start), sorted(got.claim)):
            cells += [f"{percentile(values, p):.2f}" for p in (0.5, 0.99)]  # type: ignore[arg-type]
            cells.append(f"{values[-1]:.2f}")
        rows.append(cells)
    return rows


def p99(rounds: Rounds, name: str) -> float:
    return percentile(sorted(rounds.latencies[name].start), 0.99)  # type: ignore[arg-type]


def target_rows(rounds: Rounds, c: int) -> list[list[str]]:
    """The issue's targets: what was measured, what is wanted, PASS or MISS."""
    rows: list[list[str]] = []

    def check(what: str, shown: str, wanted: str, ok: bool | None) -> None:
        rows.append([what, shown, wanted, "n/a" if ok is None else "PASS" if ok else "MISS"])

    for task, label, target in (("aincr", "async", TARGET_ASYNC), ("incr", "sync", TARGET_SYNC)):
        got = rounds.ratio(f"jq {task} 1", "bull incr")
        check(f"drain, 1 INCR ({label}), 1 process / BullMQ c={c}", times(got),
              f">= {target:.2f}x", None if got is None else got >= target)
    ours, theirs = rounds.median("jq incr 1").cpu_us, rounds.median("bull incr").cpu_us
    check("worker CPU per run, sync INCR / BullMQ's", ratio(ours, theirs),
          f"<= {TARGET_CPU:.2f}x", ours <= theirs * TARGET_CPU)
    now = p99(rounds, "jq")
    check("idle-start p99, enqueue -> task start", f"{now:.2f} ms",
          f"< {TARGET_P99_MS:g} ms", now < TARGET_P99_MS)
    if "before noop 1" in rounds.samples:
        got = rounds.ratio("jq noop 1", "before noop 1")
        check("drain, no-op, 1 process / --before", times(got), f">= {BEFORE_DRAIN:.2f}x",
              None if got is None else got >= BEFORE_DRAIN)
        was = p99(rounds, "before")
        check("idle-start p99 - --before's", f"{now - was:+.2f} ms",
              f"<= +{BEFORE_P99_MS:g} ms", now - was <= BEFORE_P99_MS)
    else:
        check("drain, no-op, 1 process / --before", "-", "give --before", None)
        check("idle-start p99 - --before's", "-", "give --before", None)
    return rows


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
    ceiling: Ceiling = med("ceiling")
    alone: Ceiling = med("incr alone")
    aalone: Ceiling = med("aincr alone")
    rows.append(
        [
            "ceiling, sync task, one thread, no worker",
            fmt_int(ceiling.rate) + "/s",
            fmt_int(bull_incr.rate) + "/s",
            times(rounds.ratio("ceiling", "bull incr")),
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
