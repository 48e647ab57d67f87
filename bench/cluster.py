"""Throughput on one Redis node vs a 3-master Redis Cluster on this machine, side by side, and
the scaling model that answers the sizing question of docs/design.md: how many masters do
5,000,000 hourly jobs need, with and without jitter?

    .venv/bin/python bench/cluster.py [--n N] [--clients C] [--quick] [--master-gb GB]

Both topologies are started here on loopback TCP (private temp dirs, killed at the end): one
plain ``redis-server`` (``redis://``), and three cluster-enabled masters without replicas
(``redis+cluster://``; replicas would only add replication traffic on the same 2 cores). Each
phase runs C client processes at once on a 16-partition queue, started together:

* bulk enqueue: each process creates N/C runs with ``enqueue_many`` (batches of 1,000);
* claim+complete: each process drains its share of the partitions (``claim_call`` limit 100,
  then one pipelined ``run_many`` of ``complete_call`` per batch: a no-op worker's Redis work).

Then, on the single node: memory per pending run, per finished run (kept for the done
retention) and per recurring-job definition (INFO used_memory deltas, MEMORY USAGE samples).

Honesty about this machine: it has 2 cores for the servers AND the client processes. Three
masters cannot run three times as fast here; the cluster figure shows the client-side cost of
cluster routing and that the load spreads, not the scaling a machine per master gives. The
model therefore takes "runs/s per master" from the server CPU one run costs on the cluster's
masters (INFO cpu; Redis runs commands on one thread, so a master with a core of its own does
1 / that per second) and scales it linearly by masters, which holds while the partitions (16
per queue, more for more masters) spread the load evenly.
"""

from __future__ import annotations

import argparse
import math
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
from jobqueue.payload import encode_result
from jobqueue.store.embedded import find_server_binary
from jobqueue.store.keys import PartitionKeys
from jobqueue.store.runs import CLAIM, COMPLETE

PARTITIONS = 16
BATCH = 1_000
CLAIM_LIMIT = 100
TASK = "bench_noop"
JOBS = 5_000_000
PERIOD_S = 3_600
JITTER_WINDOW_S = 60
HEADROOM = 0.5  # plan masters at half their measured rate: spikes, replication, persistence


# -- client processes ---------------------------------------------------------------------------


def _open(url: str) -> JobQueue:
    jq = JobQueue.from_url(url, partitions={"default": PARTITIONS})
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
    mine = [PartitionKeys("default", p) for p in range(PARTITIONS) if p % procs == proc]
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


def _client(url: str, phase: str, proc: int, procs: int, count: int,
            ready: Any, go: Any, out: Any) -> None:
    try:
        jq = _open(url)
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
    server_cpu: float = 0.0  # CPU seconds all servers spent meanwhile (INFO cpu)

    @property
    def rate(self) -> float:
        return self.runs / self.seconds

    @property
    def server_us_per_run(self) -> float:
        return self.server_cpu / self.runs * 1e6


def run_phase(url: str, phase: str, procs: int, n: int) -> Phase:
    ctx = mp.get_context("fork")
    ready, out, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    share = n // procs
    workers = [ctx.Process(target=_client, args=(url, phase, i, procs, share, ready, go, out))
               for i in range(procs)]
    for w in workers:
        w.start()
    try:
        for _ in workers:
            ready.get(timeout=60)
        go.set()
        results = [out.get(timeout=600) for _ in workers]
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
    return Phase(total, seconds)


# -- servers ---------------------------------------------------------------------------------


class SingleNode:
    """One plain redis-server on a free loopback TCP port (persistence off, like the cluster)."""

    def __init__(self, binary: str) -> None:
        port = free_ports(1)[0]
        self.directory = Path(tempfile.mkdtemp(prefix="jqb-"))
        self.node = Node(port, self.directory, [
            binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--dir", str(self.directory)])

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


def server_cpu(nodes: list[Node]) -> float:
    total = 0.0
    for node in nodes:
        with node.client() as c:
            info = c.info("cpu")
        total += float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
    return total


def measure(url: str, flush: Any, nodes: list[Node], procs: int, n: int) -> tuple[Phase, Phase]:
    flush()
    run_phase(url, "enqueue", procs, min(n, 2_000))  # warm-up: connections, scripts, code
    run_phase(url, "drain", procs, min(n, 2_000))
    flush()
    out = []
    for phase in ("enqueue", "drain"):
        before = server_cpu(nodes)
        measured = run_phase(url, phase, procs, n)
        out.append(Phase(measured.runs, measured.seconds, server_cpu(nodes) - before))
    return out[0], out[1]


# -- memory -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Memory:
    pending_run: float
    done_run: float
    recurring_job: float
    run_hash_sample: int


def measure_memory(single: SingleNode, runs: int, jobs: int) -> Memory:
    single.flush()
    jq = _open(single.url)
    client = jq.redis

    def used() -> int:
        return int(client.info("memory")["used_memory"])

    base = used()
    _enqueue_share(jq, 0, runs)
    pending = (used() - base) / runs
    _drain_share(jq, 0, 1)
    done = (used() - base) / runs
    sample = int(client.memory_usage(jq.keys_for("default", "c0-7").run("c0-7")) or 0)
    before = used()
    for i in range(jobs):
        jq.schedule(f"hourly-{i}", TASK, cron="0 * * * *", jitter=JITTER_WINDOW_S)
    per_job = (used() - before) / jobs
    jq.close()
    single.flush()
    return Memory(pending, done, per_job, sample)


# -- the model --------------------------------------------------------------------------------


def lifecycle_rate(enqueue: Phase, drain: Phase) -> float:
    """Runs/s (wall clock) when the same servers both create and claim+complete every run."""
    return 1 / (1 / enqueue.rate + 1 / drain.rate)


def master_capacity(enqueue: Phase, drain: Phase) -> float:
    """Runs/s one master sustains on a core of its own: the inverse of the server CPU one
    run's create + claim + complete costs (Redis executes commands on one thread)."""
    return 1e6 / (enqueue.server_us_per_run + drain.server_us_per_run)


def model_lines(per_master: float, memory: Memory, master_gb: float) -> list[str]:
    usable = master_gb * 1e9
    herd = JOBS  # no jitter: every job fires in the same second
    spread = JOBS / JITTER_WINDOW_S
    steady = JOBS / PERIOD_S
    retained_runs = JOBS * 24  # one run per job per hour, kept for the 24 h done retention
    mem_defs = JOBS * memory.recurring_job
    mem_runs = retained_runs * memory.done_run
    mem_runs_1h = JOBS * memory.done_run  # done retention lowered to 1 h
    plan = per_master * HEADROOM

    def masters(rate: float) -> int:
        return max(1, math.ceil(rate / plan))

    by_memory = max(1, math.ceil((mem_defs + mem_runs) / usable))
    by_memory_1h = max(1, math.ceil((mem_defs + mem_runs_1h) / usable))
    no_jitter = max(masters(herd), by_memory)
    with_jitter = max(masters(spread), by_memory)
    return [
        f"runs/s per master (create + claim + complete): {fmt_int(per_master)}; "
        f"planned at {HEADROOM:.0%}: {fmt_int(plan)}",
        f"memory: {fmt_int(memory.pending_run)} B per pending run, "
        f"{fmt_int(memory.done_run)} B per finished run (kept {24} h), "
        f"{fmt_int(memory.recurring_job)} B per recurring job "
        f"(MEMORY USAGE of one run hash: {memory.run_hash_sample} B)",
        "",
        f"5,000,000 hourly jobs: {fmt_int(steady)} runs/s on average "
        f"-> {masters(steady)} master(s) by throughput",
        f"  memory: {mem_defs / 1e9:.1f} GB of definitions + {mem_runs / 1e9:.1f} GB of finished "
        f"runs over 24 h = {(mem_defs + mem_runs) / 1e9:.1f} GB -> {by_memory} master(s) of "
        f"{master_gb:g} GB usable ({by_memory_1h} with a 1 h done retention)",
        f"  without jitter: all {fmt_int(herd)} due in one second -> {fmt_int(herd)} runs/s "
        f"-> {masters(herd)} masters to keep up in that second "
        f"(so {no_jitter} in all); or accept a backlog: "
        f"{fmt_int(herd / (plan * with_jitter))} s to drain on {with_jitter}",
        f"  with a {JITTER_WINDOW_S} s jitter window: {fmt_int(spread)} runs/s "
        f"-> {masters(spread)} master(s) by throughput, so {with_jitter} in all "
        f"({'memory' if by_memory >= masters(spread) else 'throughput'} decides)",
        "  (the scheduler creates runs a lookahead ahead of their fire time, so creation is "
        "spread before the herd; the figures above count it at the herd's rate: pessimistic)",
    ]


# -- main --------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=None, help="runs per phase (default 40,000)")
    parser.add_argument("--quick", action="store_true", help="smoke run: N = 4,000")
    parser.add_argument("--clients", type=int, default=4, help="client processes (default 4)")
    parser.add_argument("--master-gb", type=float, default=16.0,
                        help="usable memory per master for the model (default 16)")
    args = parser.parse_args(argv)
    n = args.n or (4_000 if args.quick else 40_000)
    procs = max(1, args.clients)
    n -= n % procs
    binary = find_server_binary()
    say("jobqueue cluster benchmark: 1 node vs 3 masters, same machine")
    say(f"  server {binary}; {mp.cpu_count()} cores shared by servers and {procs} client "
        f"processes; N = {fmt_int(n)} runs per phase; queue with {PARTITIONS} partitions")
    single = SingleNode(binary).start()
    # The production default node timeout: a short one (as in the failover test) makes the
    # cluster bus ping more often, which would be charged to every run here.
    cluster = Cluster(binary, masters=3, replicas=0, appendonly=False, node_timeout_ms=15_000)
    try:
        cluster.start(timeout=60)
        one = measure(single.url, single.flush, [single.node], procs, n)
        three = measure(cluster.url, cluster.flush, cluster.master_nodes(), procs, n)
        memory = measure_memory(single, runs=min(n, 20_000), jobs=2_000 if args.quick else 10_000)
    except BenchError as exc:
        return fail(str(exc))
    finally:
        single.stop()
        cluster.stop()
    rows = []
    for label, (a, b) in (("bulk enqueue", (one[0], three[0])),
                          ("claim+complete", (one[1], three[1]))):
        rows.append([label, fmt_int(a.rate), fmt_int(b.rate), f"{b.rate / a.rate:.2f}x"])
    rows.append(["create+claim+complete", fmt_int(lifecycle_rate(*one)),
                 fmt_int(lifecycle_rate(*three)),
                 f"{lifecycle_rate(*three) / lifecycle_rate(*one):.2f}x"])
    for label, a, b in (("server us/run: enqueue", one[0], three[0]),
                        ("server us/run: claim+complete", one[1], three[1])):
        rows.append([label, f"{a.server_us_per_run:.1f}", f"{b.server_us_per_run:.1f}",
                     f"{b.server_us_per_run / a.server_us_per_run:.2f}x"])
    say()
    say(format_table(["wall-clock runs/s", "1 node", "3 masters", "ratio"], rows))
    say()
    per_master = master_capacity(*three)
    say("scaling model: per master = 1 / (server CPU per run on the cluster's masters), i.e.")
    say("what one master does on a core of its own; N masters = N times that while the")
    say("partitions spread evenly (the wall-clock figures above are capped by 2 shared cores):")
    for line in model_lines(per_master, memory, args.master_gb):
        say(f"  {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
