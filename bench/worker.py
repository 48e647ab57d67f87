"""Worker daemon throughput and idle start latency, with real ``jobqueue worker`` processes.

    .venv/bin/python bench/worker.py [--url URL] [--n N] [--quick] [--repeat R] [--flush]
                                     [--concurrency C] [--latency-runs M] [--queue-limit L]
                                     [--hooks-only] [--base-src DIR]

Phases, each on a freshly flushed server:

* drain, one process and then ``--processes 2``, each with the queue's event log on and
  off (``set_queue_events``), interleaved, the order flipped each round, best of
  max(R, 2) rounds: N no-op runs are created due at one instant
  D a few seconds ahead (server clock), the worker is started and idles until D, then drains
  them. The rate is N / (last finish - D), both read from Redis (the done index's scores are
  finish times): process start-up and enqueueing are outside the figure, and the clock is
  the server's, the one that decides.
* idle start latency: with one idle worker, M runs are enqueued one at a time, 20 ms apart;
  each run's latency is its ``started`` minus its ``due`` (server ms), i.e. from due time to
  the claim that started it. p50 / p99 / max are printed.

* hook chain overhead (jobqueue.hooks): the one-process drain again with the worker's app
  using no middleware, one empty Middleware (the chain's own cost) and the OpenTelemetry
  middleware (spans made on an SDK provider without exporter), each as a ratio to the drain
  without middleware measured in the same sitting. With ``--base-src DIR`` (a source tree of
  jobqueue from before the hooks, e.g. ``git archive <commit> | tar -x -C DIR``) the worker
  also drains once from that code: the cost of the hook support itself when no middleware is
  registered. The drains' CPU per run is too noisy on a shared machine to resolve a few
  percent, so the chain's own cost is also timed in-process: the worker's task call with no
  middleware and with one empty Middleware, against the same call without the chain's test
  (ns per run, and as a share of the drain's worker CPU per run). ``--hooks-only`` runs this
  phase alone.

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
        self,
        url: str,
        concurrency: int,
        processes: int,
        env: dict[str, str] | None = None,
        nice: int = 0,
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
            cmd, env=env, cwd=BENCH_DIR, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            preexec_fn=(lambda: os.nice(nice)) if nice else None,
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


def switches_of(pid: int, kind: str = "") -> int:
    """Context switches of a process's live threads, voluntary + involuntary (``kind``
    "voluntary_" or "nonvoluntary_": one of them): with cpu_of, what says how many thread
    hand-offs a run costs. Involuntary ones are the scheduler's preemptions (a loaded
    machine); voluntary ones are waits: thread hand-offs, I/O."""
    total = 0
    kinds = (kind,) if kind else ("voluntary_", "nonvoluntary_")
    wanted = tuple(f"{k}ctxt_switches:" for k in kinds)
    for status in Path(f"/proc/{pid}/task").glob("*/status"):
        try:
            text = status.read_text()
        except OSError:  # the thread ended meanwhile
            continue
        for line in text.splitlines():
            if line.startswith(wanted):
                total += int(line.split()[1])
    return total


def tree_switches(root: int, kind: str = "") -> int:
    """switches_of a process and its live children."""
    total = switches_of(root, kind)
    for child in Path(f"/proc/{root}/task/{root}/children").read_text().split():
        total += switches_of(int(child), kind)
    return total


def bench_drain(
    server: BenchServer,
    n: int,
    concurrency: int,
    processes: int,
    env: dict[str, str] | None = None,
    limit: int | None = None,
    events: bool = True,
) -> Sample:
    server.flush()
    jq = JobQueue.from_url(server.url)
    if limit is not None:
        jq.set_queue_concurrency("default", limit)
    if not events:
        jq.set_queue_events("default", enabled=False)
    task = jq.declare_task("noop")
    client = server.client
    workers = Workers(server.url, concurrency, processes, env)
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


HOOK_CASES = (("no middleware", "none"), ("one empty Middleware", "empty"),
              ("OpenTelemetry middleware", "otel"))


def bench_hooks(
    server: BenchServer, n: int, concurrency: int, repeat: int, base_src: str | None
) -> list[tuple[str, float, float]]:
    """Per middleware case, the one-process drain's runs/s and the worker's CPU us per run,
    each the best of ``repeat`` (the cases interleaved round by round so that the machine's
    drift hits them alike). CPU per run is the steadier figure on a shared machine: wall
    time also counts waits on a server and cores that other work slows."""
    cases = [(label, {"BENCH_HOOKS": kind}) for label, kind in HOOK_CASES]
    if base_src is not None:
        path = f"{BENCH_DIR}{os.pathsep}{base_src}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
        cases.append(("no middleware, code before hooks", {"PYTHONPATH": path}))
    rate: dict[str, float] = {}
    cpu: dict[str, float] = {}
    for _ in range(repeat):
        for label, env in cases:
            sample = bench_drain(server, n, concurrency, 1, env)
            rate[label] = max(rate.get(label, 0.0), n / sample.seconds)
            cpu[label] = min(cpu.get(label, float("inf")), sample.client_cpu / n * 1e6)
    return [(label, rate[label], cpu[label]) for label, _ in cases]


def chain_ns(calls: int = 300_000, rounds: int = 5) -> tuple[float, float]:
    """ns per run that the hook chain adds to the worker's task call (jobqueue.worker.
    executing._run_sync), without middleware and with one empty Middleware; the fastest of
    ``rounds``, against the same call without the chain."""
    import timeit

    from jobqueue.context import RunContext, bind, unbind
    from jobqueue.hooks import Hooks, Middleware
    from jobqueue.worker import executing

    jq = JobQueue()
    task = jq.task(lambda: None, name="noop")
    ctx = RunContext("r", 1, 1, 3, "noop", "default", "", None)
    run_sync = executing._run_sync
    chain = Hooks([Middleware()])

    def without_chain() -> Any:  # _run_sync as it was before the hooks
        token = bind(ctx)
        try:
            return task.call_with(ctx, [], {})
        finally:
            unbind(token)

    def best(fn: Any) -> float:
        return min(timeit.repeat(fn, number=calls, repeat=rounds)) / calls * 1e9

    plain = best(without_chain)
    none = best(lambda: run_sync(task, ctx, [], {}, None))
    empty = best(lambda: run_sync(task, ctx, [], {}, chain))
    return none - plain, empty - plain


def hooks_table(rows: list[tuple[str, float, float]]) -> list[str]:
    _, base_rate, base_cpu = rows[0]
    lines = [
        f"{'hook chain overhead (1 worker process)':<36} {'runs/s':>8} {'ratio':>6} "
        f"{'cpu us/run':>10} {'ratio':>6}"
    ]
    lines += [
        f"{label:<36} {fmt_int(rate):>8} {rate / base_rate:>6.3f} {cpu:>10.1f} "
        f"{cpu / base_cpu:>6.3f}"
        for label, rate, cpu in rows
    ]
    return lines


def say_chain(cpu_us_per_run: float) -> None:
    none, empty = chain_ns()
    share = 100 / (cpu_us_per_run * 1000)
    say(
        f"the chain's own cost per run, timed in-process: without middleware {none:+.0f} ns "
        f"({none * share:.2f}% of {cpu_us_per_run:.1f} us worker CPU per run), one empty "
        f"Middleware {empty:+.0f} ns ({empty * share:.2f}%)"
    )


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
    parser.add_argument("--hooks-only", action="store_true", help="the hook phase alone")
    parser.add_argument("--base-src", help="jobqueue source from before the hooks (see above)")
    parser.add_argument(
        "--queue-limit", type=int, default=None, help="a concurrency limit on the queue"
    )
    args = parser.parse_args(argv)
    n = runs_from_args(args)
    if args.hooks_only:
        try:
            with bench_server(args.url, allow_flush=args.flush) as server:
                rates = bench_hooks(server, n, args.concurrency, args.repeat, args.base_src)
        except (BenchError, JobQueueError, redis.exceptions.RedisError, OSError) as exc:
            return fail(str(exc))
        for line in hooks_table(rates):
            say(line)
        say(f"({fmt_int(n)} runs per drain, best of {args.repeat}, cases interleaved)")
        say_chain(rates[0][2])
        return 0
    requests = QUICK_BASELINE_REQUESTS if args.quick else BASELINE_REQUESTS
    try:
        with bench_server(args.url, allow_flush=args.flush, tcp=args.tcp) as server:
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
            best: dict[tuple[int, bool], Sample] = {}
            for round_ in range(max(args.repeat, 2)):
                # The log on and off interleaved, the order flipped each round, so that the
                # machine's drift (on a shared host, larger than the cost measured) hits
                # both alike; best of the rounds.
                order = (True, False) if round_ % 2 == 0 else (False, True)
                for processes in (1, 2):
                    for events in order:
                        sample = bench_drain(server, n, args.concurrency, processes, None,
                                             limit, events)
                        key = (processes, events)
                        if key not in best or sample.seconds < best[key].seconds:
                            best[key] = sample
            measurements = []
            for processes in (1, 2):
                for events in (True, False):
                    label = ("drain, 1 worker process" if processes == 1
                             else "drain, --processes 2") + (", events on" if events
                                                              else ", events off")
                    measurements.append(Measurement(label, n, best[(processes, events)],
                                                    TARGET_DRAIN, pipelined))
            latencies = bench_latency(server, args.latency_runs, args.concurrency, limit)
            rates = bench_hooks(server, n, args.concurrency, args.repeat, args.base_src)
    except (BenchError, JobQueueError, redis.exceptions.RedisError, OSError) as exc:
        return fail(str(exc))
    say()
    say(measurement_table(measurements))
    for on, off in zip(measurements[0::2], measurements[1::2], strict=True):
        cost = (on.seconds - off.seconds) / on.runs * 1e6
        say(f"  events cost: {on.seconds / off.seconds - 1:+.1%} ({cost:+.2f} us/run) in "
            f"{on.name.removesuffix(', events on')}")
    p50, p99 = percentile(latencies, 0.5), percentile(latencies, 0.99)
    verdict = "PASS" if p99 < TARGET_P99_MS else "MISS"
    say()
    say(
        f"idle start latency over {len(latencies)} runs: p50 {p50:.1f} ms, p99 {p99:.1f} ms, "
        f"max {max(latencies)} ms (target p99 < {TARGET_P99_MS:g} ms: {verdict})"
    )
    say()
    for line in hooks_table(rates):
        say(line)
    say_chain(rates[0][2])
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
