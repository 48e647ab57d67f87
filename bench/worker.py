"""Worker daemon throughput and idle start latency, with real ``jobqueue worker`` processes.

    .venv/bin/python bench/worker.py [--url URL] [--n N] [--quick] [--repeat R] [--flush]
                                     [--concurrency C] [--latency-runs M] [--queue-limit L]

Phases, each on a freshly flushed server:

* drain, one process and then ``--processes 2``: N no-op runs are created due at one instant
  D a few seconds ahead (server clock), the worker is started and idles until D, then drains
  them. The rate is N / (last finish - D), both read from Redis (the done index's scores are
  finish times): process start-up and enqueueing are outside the figure, and the clock is
  the server's, the one that decides.
* idle start latency: with one idle worker, M runs are enqueued one at a time, 20 ms apart;
  each run's latency is its ``started`` minus its ``due`` (server ms), i.e. from due time to
  the claim that started it. p50 / p99 / max are printed.

``--queue-limit L`` sets a concurrency limit of L on the queue before each phase (``jobqueue
queue concurrency default L``): with L above ``--concurrency`` x processes it never binds, so
the figures show what checking a limit costs each claim; without it the queue has no limit.

The drain figures are shown with their ratio to redis-benchmark's pipelined EVALSHA of a
one-run write script (-c 1 -P 16) measured in the same run: the machine is shared and noisy,
so compare ratios within one run. Without --url a private embedded server is used.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import redis
from _common import (
    BASELINE_REQUESTS,
    QUICK_BASELINE_REQUESTS,
    BenchError,
    BenchServer,
    Measurement,
    Sample,
    add_common_args,
    baseline_table,
    bench_server,
    describe_environment,
    fail,
    fmt_int,
    measurement_table,
    run_baselines,
    runs_from_args,
    say,
    server_cpu_seconds,
)

from jobqueue import JobQueue, Request
from jobqueue.errors import JobQueueError
from jobqueue.store.keys import WORKERS_KEY, PartitionKeys

DEFAULT_N = 20_000
QUICK_N = 2_000
LATENCY_RUNS = 200
LATENCY_GAP_S = 0.02
LEAD_MS = 4_000  # how far ahead the drain's runs fall due: time for the workers to start
TARGET_DRAIN = 20_000.0
TARGET_P99_MS = 5.0
BENCH_DIR = Path(__file__).resolve().parent
PK = PartitionKeys("default", 0)


def jobqueue_command() -> list[str]:
    exe = Path(sys.executable).with_name("jobqueue")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "jobqueue.cli"]


class Workers:
    """``jobqueue worker`` as a child process (the supervisor, with --processes > 1)."""

    def __init__(
        self, url: str, concurrency: int, processes: int, env: dict[str, str] | None = None
    ) -> None:
        env = {
            **os.environ,
            "PYTHONPATH": f"{BENCH_DIR}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
            **(env or {}),
        }
        cmd = [*jobqueue_command(), "--redis-url", url, "--log-level", "warning", "worker"]
        cmd += ["--app", "worker_app:jq", "--concurrency", str(concurrency)]
        cmd += ["--processes", str(processes)]
        self.processes = processes
        self.popen = subprocess.Popen(
            cmd, env=env, cwd=BENCH_DIR, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )

    def wait_registered(self, client: Any, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while client.hlen(WORKERS_KEY) < self.processes:
            if self.popen.poll() is not None:
                err = self.popen.stderr.read().decode(errors="replace") if self.popen.stderr else ""
                raise BenchError(f"the worker exited with {self.popen.returncode}: {err[-800:]}")
            if time.monotonic() > deadline:
                raise BenchError("the worker did not register within 30 s")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(20)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)


def server_ms(client: Any) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def cpu_of(pid: int) -> float:
    """User + system CPU seconds of a process and its reaped children (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = sum(int(v) for v in fields[11:15])
    return ticks / os.sysconf("SC_CLK_TCK")


def tree_cpu(root: int) -> float:
    """CPU of a process and its live children (the supervisor's worker processes)."""
    total = cpu_of(root)
    for child in Path(f"/proc/{root}/task/{root}/children").read_text().split():
        total += cpu_of(int(child))
    return total


def bench_drain(
    server: BenchServer, n: int, concurrency: int, processes: int, limit: int | None = None
) -> Sample:
    server.flush()
    jq = JobQueue.from_url(server.url)
    if limit is not None:
        jq.set_queue_concurrency("default", limit)
    task = jq.declare_task("noop")
    client = server.client
    workers = Workers(server.url, concurrency, processes)
    try:
        due = server_ms(client) + LEAD_MS
        at = due / 1000.0
        for start in range(0, n, 1_000):
            jq.enqueue_many([Request(task, at=at) for _ in range(start, min(start + 1_000, n))])
        workers.wait_registered(client)
        if server_ms(client) >= due:
            raise BenchError("setup took longer than the lead time; try a smaller --n")
        srv_before, cli_before = server_cpu_seconds(client), tree_cpu(workers.popen.pid)
        deadline = time.monotonic() + 120
        while client.zcard(PK.done) < n:
            if time.monotonic() > deadline:
                raise BenchError(f"drain: only {client.zcard(PK.done):,} of {n:,} done in 120 s")
            time.sleep(0.05)
        worker_cpu = tree_cpu(workers.popen.pid) - cli_before
        srv_cpu = server_cpu_seconds(client) - srv_before
        ((_, last),) = client.zrange(PK.done, -1, -1, withscores=True)
        first_started = min(
            int(s) for s in client.hmget(PK.run(client.zrange(PK.done, 0, 0)[0]), "started") if s
        )
        if first_started < due:
            raise BenchError("a run started before it was due")
        return Sample((int(last) - due) / 1000.0, worker_cpu, srv_cpu)
    finally:
        workers.stop()
        jq.close()


def bench_latency(
    server: BenchServer, m: int, concurrency: int, limit: int | None = None
) -> list[int]:
    server.flush()
    jq = JobQueue.from_url(server.url)
    if limit is not None:
        jq.set_queue_concurrency("default", limit)
    task = jq.declare_task("noop")
    client = server.client
    workers = Workers(server.url, concurrency, 1)
    try:
        workers.wait_registered(client)
        time.sleep(0.5)  # let it settle into its idle wait
        ids = []
        for _ in range(m):
            ids.append(jq.enqueue(task).run_id)
            time.sleep(LATENCY_GAP_S)
        deadline = time.monotonic() + 30
        while client.zcard(PK.done) < m:
            if time.monotonic() > deadline:
                raise BenchError("latency: runs were not all done within 30 s")
            time.sleep(0.05)
        pipe = client.pipeline(transaction=False)
        for run_id in ids:
            pipe.hmget(PK.run(run_id), "due", "started")
        return sorted(int(s) - int(d) for d, s in pipe.execute())
    finally:
        workers.stop()
        jq.close()


def percentile(sorted_values: Sequence[int], p: float) -> float:
    if not sorted_values:
        return float("nan")
    k = (len(sorted_values) - 1) * p
    lo, hi = int(k), min(int(k) + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


FOOTNOTE = """\
cpu cli/srv: CPU of the worker processes / of the server as a share of the drain's wall time;
us/run: the same CPU per run. ratio: runs/s over redis-benchmark's pipelined EVALSHA/s of a
one-run write script (-c 1 -P 16). Latency: started - due of runs enqueued one at a time
while the worker idles (server clock, ms resolution)."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Worker drain rate and idle start latency.")
    add_common_args(parser, default_n=DEFAULT_N, quick_n=QUICK_N)
    parser.add_argument("--concurrency", type=int, default=64, help="worker slots (default 64)")
    parser.add_argument("--latency-runs", type=int, default=LATENCY_RUNS)
    parser.add_argument(
        "--queue-limit", type=int, default=None, help="a concurrency limit on the queue"
    )
    args = parser.parse_args(argv)
    n = runs_from_args(args)
    requests = QUICK_BASELINE_REQUESTS if args.quick else BASELINE_REQUESTS
    try:
        with bench_server(args.url, allow_flush=args.flush) as server:
            baselines = run_baselines(server, requests)
            env = describe_environment(server)
            say("jobqueue worker benchmark")
            for line in env.lines():
                say(f"  {line}")
            say(f"  N = {n:,} no-op runs per drain, worker --concurrency {args.concurrency}")
            limit = args.queue_limit
            say(f"  queue concurrency limit: {'none' if limit is None else limit}")
            say()
            say(baseline_table(baselines))
            pipelined = baselines.write_pipelined
            measurements = []
            for processes in (1, 2):
                sample = min(
                    (
                        bench_drain(server, n, args.concurrency, processes, limit)
                        for _ in range(args.repeat)
                    ),
                    key=lambda s: s.seconds,
                )
                label = "drain, 1 worker process" if processes == 1 else "drain, --processes 2"
                measurements.append(Measurement(label, n, sample, TARGET_DRAIN, pipelined))
            latencies = bench_latency(server, args.latency_runs, args.concurrency, limit)
    except (BenchError, JobQueueError, redis.exceptions.RedisError, OSError) as exc:
        return fail(str(exc))
    say()
    say(measurement_table(measurements))
    p50, p99 = percentile(latencies, 0.5), percentile(latencies, 0.99)
    verdict = "PASS" if p99 < TARGET_P99_MS else "MISS"
    say()
    say(
        f"idle start latency over {len(latencies)} runs: p50 {p50:.1f} ms, p99 {p99:.1f} ms, "
        f"max {max(latencies)} ms (target p99 < {TARGET_P99_MS:g} ms: {verdict})"
    )
    say()
    say(FOOTNOTE)
    missed = [m.name for m in measurements if m.verdict == "MISS"]
    if verdict == "MISS":
        missed.append("idle start latency p99")
    say("all targets met" if not missed else "targets missed: " + "; ".join(missed))
    say(f"({fmt_int(n)} runs per drain)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
