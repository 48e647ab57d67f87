"""Server CPU per run on Redis Clusters of 1, 2, 3 and 4 masters, what persistence adds to it,
and memory per run: the measured inputs of the capacity model (``jobqueue capacity``,
``jobqueue.policy.capacity``), printed next to the figures the model uses.

    .venv/bin/python bench/cluster.py [--n N] [--clients C] [--quick] [--masters 1,2,3,4]

Every topology is started here on loopback TCP (private temp dirs, killed at the end):
clusters of M masters without replicas (cluster mode, persistence off), then one plain
``redis-server`` with ``appendonly no``, ``appendfsync everysec`` and ``appendfsync always``.
On each, C client processes run, started together:

* bulk enqueue: each creates N/C runs with ``enqueue_many`` (batches of 1,000) in a queue of
  4 x M partitions (spread placement);
* claim+complete: each drains its share of the partitions (``claim_call`` limit 100, then one
  pipelined ``run_many`` of ``complete_call`` per batch: a no-op worker's Redis work);
* on the clusters, a herd of N recurring jobs over 4 x M scheduler partitions turned into runs
  by one scheduler tick (``sched_due``, ``sched_create``, ``advance``).

What is reported is the server CPU each run costs (INFO cpu summed over the masters, per run),
and how it spreads over the masters (the busiest master's share over a fair share). This
machine has 2 cores shared by every server and client process: M masters cannot run M times
as fast here, so wall-clock rates are shown for what they are (routing cost, not scaling) and
the capacity model scales the CPU figures instead: a master with a core of its own runs
1e6 / (server us per run) runs/s, and M masters M times that while the partitions spread
evenly.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import BenchError, fail, fmt_int, format_table, say

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "cluster"))
from cluster_launcher import Cluster, Node, free_ports

from jobqueue import JobQueue, Request
from jobqueue.ops import capacity as measuring
from jobqueue.payload import encode_result
from jobqueue.policy import capacity
from jobqueue.recurring.config import SchedulerConfig
from jobqueue.recurring.daemon import Scheduler
from jobqueue.recurring.declarations import make_definition
from jobqueue.recurring.definitions import SCHED_CONFIG_KEY, sched_keys, sched_partition_of
from jobqueue.recurring.fires import first_fire_after
from jobqueue.store.embedded import find_server_binary
from jobqueue.store.keys import placement_record
from jobqueue.store.runs import CLAIM, COMPLETE

BATCH = 1_000
CLAIM_LIMIT = 100
TASK = "bench_noop"
T0 = 1_800_000_000_000


# -- client processes ---------------------------------------------------------------------------


def _open(url: str, partitions: int) -> JobQueue:
    jq = JobQueue.from_url(url, partitions={"default": partitions})
    jq.declare_task(TASK)
    jq.register_queue("default")
    jq.scripts.load()
    return jq


def _enqueue_share(jq: JobQueue, proc: int, count: int) -> int:
    created = 0
    for start in range(0, count, BATCH):
        reqs = [Request(TASK, (i,), run_id=f"c{proc}-{i}")
                for i in range(start, min(start + BATCH, count))]
        created += sum(h.created for h in jq.enqueue_many(reqs))
    return created


def _drain_share(jq: JobQueue, proc: int, procs: int) -> int:
    parts = jq.all_partition_keys("default")
    mine = [pk for p, pk in enumerate(parts) if p % procs == proc]
    settings, runner, result = jq.settings, jq.scripts, encode_result(None)
    done = 0
    while mine:
        for pk in list(mine):
            call = CLAIM.call(pk, CLAIM_LIMIT, f"bench-{proc}", settings.default_lease_ms,
                              settings.dead_retention_ms)
            claimed = CLAIM.parse(runner.run(call)).runs
            if not claimed:
                mine.remove(pk)
                continue
            replies = runner.run_many([
                COMPLETE.call(pk, [(r.run_id, r.fence, result)], settings.done_retention_ms)
                for r in claimed])
            done += sum(COMPLETE.parse(reply)[0].accepted for reply in replies)
    return done


def _client(url: str, partitions: int, phase: str, proc: int, procs: int, count: int,
            ready: Any, go: Any, out: Any) -> None:
    try:
        jq = _open(url, partitions)
        ready.put(proc)
        go.wait()
        start = time.monotonic()  # CLOCK_MONOTONIC: comparable across processes
        n = _enqueue_share(jq, proc, count) if phase == "enqueue" else _drain_share(
            jq, proc, procs)
        out.put((proc, n, start, time.monotonic(), ""))
        jq.close()
    except Exception as exc:  # reported by the parent, which fails the benchmark
        out.put((proc, 0, 0.0, 0.0, f"{type(exc).__name__}: {exc}"))


@dataclass(frozen=True)
class Phase:
    runs: int
    seconds: float
    server_cpu: list[float]  # CPU seconds each server spent meanwhile (INFO cpu)

    @property
    def rate(self) -> float:
        return self.runs / self.seconds

    @property
    def us_per_run(self) -> float:
        return sum(self.server_cpu) / self.runs * 1e6

    @property
    def busiest_share(self) -> float:
        """The busiest server's CPU over an even share of the total (1.0: even)."""
        total = sum(self.server_cpu)
        return max(self.server_cpu) / (total / len(self.server_cpu)) if total else 1.0


def server_cpu(nodes: list[Node]) -> list[float]:
    out = []
    for node in nodes:
        with node.client() as c:
            info = c.info("cpu")
        out.append(float(info["used_cpu_user"]) + float(info["used_cpu_sys"]))
    return out


def _delta(after: list[float], before: list[float]) -> list[float]:
    return [a - b for a, b in zip(after, before, strict=True)]


def run_phase(url: str, partitions: int, phase: str, procs: int, n: int,
              nodes: list[Node]) -> Phase:  # fmt: skip
    ctx = mp.get_context("fork")
    ready, out, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    share = n // procs
    workers = [ctx.Process(target=_client,
                           args=(url, partitions, phase, i, procs, share, ready, go, out))
               for i in range(procs)]  # fmt: skip
    for w in workers:
        w.start()
    try:
        for _ in workers:
            ready.get(timeout=60)
        before = server_cpu(nodes)
        go.set()
        results = [out.get(timeout=600) for _ in workers]
        cpu = _delta(server_cpu(nodes), before)
    finally:
        for w in workers:
            w.join(timeout=30)
            if w.is_alive():
                w.kill()
    errors = [r[4] for r in results if r[4]]
    if errors:
        raise BenchError(f"{phase}: {errors[0]}")
    total = sum(r[1] for r in results)
    if total != share * procs:
        raise BenchError(f"{phase}: {total:,} runs of {share * procs:,}")
    seconds = max(r[3] for r in results) - min(r[2] for r in results)
    return Phase(total, seconds, cpu)


def herd_phase(url: str, partitions: int, n: int, nodes: list[Node]) -> Phase:
    """n hourly jobs over ``partitions`` spread scheduler partitions, turned into runs by one
    scheduler tick at their fire time (one process: the server side is what is measured)."""
    jq = _open(url, partitions)
    jq.redis.hset(SCHED_CONFIG_KEY, "partitions", placement_record(partitions, True))
    template = make_definition(jq, "job-0", TASK, cron="0 * * * *", jitter=60)
    fire = first_fire_after(template, T0)
    assert fire is not None
    keys = [sched_keys(k, partitions, True) for k in range(partitions)]
    for start in range(0, n, 5_000):
        by: dict[int, list[str]] = {}
        for i in range(start, min(n, start + 5_000)):
            by.setdefault(sched_partition_of(f"h-{i}", partitions), []).append(f"h-{i}")
        pipe = jq.redis.pipeline(transaction=False)
        for k, ids in by.items():
            pipe.hset(keys[k].defs, mapping=dict.fromkeys(ids, template.to_json()))
            pipe.zadd(keys[k].next, dict.fromkeys(ids, fire))
        pipe.execute()
    s = Scheduler(jq, SchedulerConfig(lookahead=0), install_signal_handlers=False)
    s.tick(now=fire - 10_000)  # owns every partition, scripts loaded
    before = server_cpu(nodes)
    start = time.monotonic()
    report = s.tick(now=fire)
    seconds = time.monotonic() - start
    cpu = _delta(server_cpu(nodes), before)
    s.close()
    jq.close()
    if report.runs_created != n:
        raise BenchError(f"herd: {report.runs_created:,} runs created of {n:,}")
    return Phase(n, seconds, cpu)


# -- servers ---------------------------------------------------------------------------------


class SingleNode:
    """One plain redis-server on a free loopback TCP port, with the persistence asked for."""

    def __init__(self, binary: str, fsync: str | None) -> None:
        port = free_ports(1)[0]
        self.directory = Path(tempfile.mkdtemp(prefix="jqb-"))
        aof = ["--appendonly", "no"] if fsync is None else [
            "--appendonly", "yes", "--appendfsync", fsync]
        self.node = Node(port, self.directory, [
            binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
            *aof, "--dir", str(self.directory)])

    def start(self) -> SingleNode:
        self.node.start()
        self.node.wait_ready(time.monotonic() + 15)
        return self

    @property
    def url(self) -> str:
        return f"redis://{self.node.address}"

    def flush(self) -> None:
        with self.node.client() as c:
            c.flushall()

    def stop(self) -> None:
        self.node.kill()
        shutil.rmtree(self.directory, ignore_errors=True)


@dataclass(frozen=True)
class Topology:
    label: str
    enqueue: Phase
    drain: Phase
    herd: Phase | None = None


def measure(label: str, url: str, flush: Any, nodes: list[Node], partitions: int, procs: int,
            n: int, herd: int) -> Topology:  # fmt: skip
    flush()
    run_phase(url, partitions, "enqueue", procs, min(n, 2_000), nodes)  # warm-up
    run_phase(url, partitions, "drain", procs, min(n, 2_000), nodes)
    flush()
    enqueue = run_phase(url, partitions, "enqueue", procs, n, nodes)
    drain = run_phase(url, partitions, "drain", procs, n, nodes)
    flush()
    sched = herd_phase(url, partitions, herd, nodes) if herd else None
    flush()
    return Topology(label, enqueue, drain, sched)


@dataclass(frozen=True)
class Memory:
    pending_run: float
    done_run: float
    recurring_job: float


def measure_memory(single: SingleNode, runs: int, jobs: int) -> Memory:
    """A scheduled run's memory pending and finished (``measuring.measure_run_bytes``, what
    ``jobqueue capacity --measure`` measures), and a recurring job's: its definition and next
    fire (``jq.schedule``), plus its counters once it has fired."""
    single.flush()
    jq = _open(single.url, 1)
    pending, done = measuring.measure_run_bytes(jq, runs)
    single.flush()
    client = jq.redis
    before = int(client.info("memory")["used_memory"])
    for i in range(jobs):
        jq.schedule(f"hourly-{i}", TASK, cron="0 * * * *", jitter=60, now=T0)
    per_job = (int(client.info("memory")["used_memory"]) - before) / jobs
    s = Scheduler(jq, SchedulerConfig(lookahead=0), install_signal_handlers=False)
    s.tick(now=T0 + 3_600_000)  # every job fires once: its counters are written
    s.close()
    (sk,) = jq.recurring.all_keys()
    counters = int(client.memory_usage(sk.state, samples=0) or 0) / jobs
    jq.close()
    single.flush()
    return Memory(pending, done, per_job + counters)


# -- main --------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=None, help="runs per phase (default 40,000)")
    parser.add_argument("--quick", action="store_true", help="smoke run: N = 4,000")
    parser.add_argument("--clients", type=int, default=4, help="client processes (default 4)")
    parser.add_argument("--masters", default="1,2,3,4", help="cluster sizes (default 1,2,3,4)")
    parser.add_argument("--aof-rounds", type=int, default=3,
                        help="rounds of the persistence comparison (default 3; the machine "
                        "is noisy: each round compares with its own AOF-off figure)")
    args = parser.parse_args(argv)
    n = args.n or (4_000 if args.quick else 40_000)
    procs = max(1, args.clients)
    n -= n % procs
    herd = n
    binary = find_server_binary()
    say("jobqueue cluster benchmark: server CPU per run on 1-4 masters, persistence, memory")
    say(f"  server {binary}; {mp.cpu_count()} cores shared by every server and {procs} client "
        f"processes; N = {fmt_int(n)} runs per phase, a herd of {fmt_int(herd)} jobs")
    results: list[Topology] = []
    persistence: dict[str, list[Topology]] = {}
    try:
        for m in (int(x) for x in args.masters.split(",") if x):
            # The production default node timeout: a short one makes the cluster bus ping
            # more often, which would be charged to every run here.
            cluster = Cluster(binary, masters=m, replicas=0, appendonly=False,
                              node_timeout_ms=15_000)  # fmt: skip
            try:
                cluster.start(timeout=60)
                results.append(measure(f"{m} master(s)", cluster.url, cluster.flush,
                                       cluster.master_nodes(), 4 * m, procs, n, herd))
                say(f"  measured {m} master(s)")
            finally:
                cluster.stop()
        for round_ in range(max(1, args.aof_rounds)):
            for fsync in (None, "everysec", "always"):
                single = SingleNode(binary, fsync).start()
                try:
                    label = "aof off" if fsync is None else f"aof {fsync}"
                    persistence.setdefault(label, []).append(measure(
                        label, single.url, single.flush, [single.node], 4, procs, n, 0))
                    if fsync is None and round_ == 0:
                        memory = measure_memory(single, runs=min(n, 20_000),
                                                jobs=2_000 if args.quick else 10_000)
                    say(f"  measured one server, {label} (round {round_ + 1})")
                finally:
                    single.stop()
    except BenchError as exc:
        return fail(str(exc))
    say()
    rows = []
    for t in results:
        rows.append([
            t.label,
            fmt_int(t.enqueue.rate), fmt_int(t.drain.rate),
            f"{t.enqueue.us_per_run:.1f}", f"{t.drain.us_per_run:.1f}",
            f"{t.herd.us_per_run:.1f}" if t.herd else "-",
            f"{max(t.enqueue.busiest_share, t.drain.busiest_share):.2f}",
        ])  # fmt: skip
    say("server CPU per run, summed over the masters (us); busiest master's CPU / even share:")
    say(format_table(["cluster", "enqueue/s", "claim+complete/s", "us create",
                      "us claim+complete", "us scheduled", "busiest"], rows))  # fmt: skip
    say()
    rows = []
    for label, rounds in persistence.items():
        life = [t.enqueue.us_per_run + t.drain.us_per_run for t in rounds]
        cpu = _factors(persistence, label, _lifecycle_us)
        wall = _factors(persistence, label, _lifecycle_s)
        rows.append([label, f"{min(life):.1f}-{max(life):.1f}",
                     f"{min(cpu):.2f}-{max(cpu):.2f}x", f"{min(wall):.2f}-{max(wall):.2f}x"])
    say(f"one plain server, persistence ({len(persistence['aof off'])} rounds; each round "
        "compared with its own AOF-off figure):")
    say(format_table(["persistence", "server us/run (create + claim + complete)",
                      "CPU vs off", "time vs off"], rows))  # fmt: skip
    say("(CPU is what a master spends per run; with appendfsync always each event-loop turn")
    say("also waits for its fsync, which no CPU figure shows: the wall-clock column does, on")
    say("this machine's disk, with the clients sharing the 2 cores)")
    say()
    say(f"memory: {memory.pending_run:.0f} B per pending run, {memory.done_run:.0f} B per "
        f"finished run (scheduled runs, small payload and result), {memory.recurring_job:.0f} "
        "B per recurring job with its counters")
    say()
    cluster3 = next((t for t in results if t.label.startswith("3 ")), results[-1])
    used = capacity.MEASURED
    say("the capacity model's inputs (jobqueue/policy/capacity.py) against this run:")
    for name, recorded, now in (
        ("claim+complete, us/run on a cluster master", used.claim_complete_us,
         cluster3.drain.us_per_run),
        ("scheduled run (sched scripts), us/run", used.sched_us,
         cluster3.herd.us_per_run if cluster3.herd else 0.0),
        ("aof everysec factor (highest round)", used.aof_everysec,
         max(_factors(persistence, "aof everysec", _lifecycle_us))),
        ("aof always factor (highest round)", used.aof_always,
         max(_factors(persistence, "aof always", _lifecycle_us))),
        ("bytes per finished run", used.bytes_finished, memory.done_run),
        ("bytes per pending run", used.bytes_pending, memory.pending_run),
        ("bytes per recurring job", used.bytes_job, memory.recurring_job),
    ):
        say(f"  {name}: model {recorded:,.2f}, measured now {now:,.2f}")
    return 0


def _lifecycle_us(t: Topology) -> float:
    return t.enqueue.us_per_run + t.drain.us_per_run


def _lifecycle_s(t: Topology) -> float:
    return 1 / t.enqueue.rate + 1 / t.drain.rate


def _factors(persistence: dict[str, list[Topology]], label: str, cost: Any) -> list[float]:
    """Per round: ``label``'s cost over the AOF-off cost of the same round."""
    return [cost(t) / cost(off)
            for t, off in zip(persistence[label], persistence["aof off"], strict=True)]


if __name__ == "__main__":
    sys.exit(main())
