"""What a workflow costs: a child of a group and of a chord against a plain run, and a chain
step's added latency, in one sitting on one server, with redis-benchmark's EVALSHA rate as
the yardstick.

Each phase enqueues its runs and drains them with an in-process burst worker
(``jobqueue.testing.run_due``: the worker's own claim, commit and relay code, concurrency 8),
timed from the first enqueue to the last commit:

* plain: N runs of a no-op task, ``enqueue_many`` in batches of 500;
* group: the same N as ``jq.group`` (created by flow_create; no run waits on another);
* chord: N children and one callback receiving their N results (each child's commit goes to
  its outbox and is relayed to the callback);
* chain: M steps, each receiving the previous result; its per-step time minus a plain run's
  is what a step adds (the relay after each commit, the release, the next claim).

With ``--bullmq`` the same server then runs BullMQ's side (bench/bullmq/bench.mjs, Node.js,
installed there on first use): N no-op jobs added in bulk and drained by one Worker of the
same concurrency, and a FlowProducer flow of a parent gathering N children with
getChildrenValues(), each timed from the first add to the last completion in one process, as
ours are. The ratios compare each side's child to its own plain job, and our chord child to
BullMQ's flow child.

Targets (issue 30): a chord child costs at most 1.5x a plain run; a chain step adds at most
2 ms. Run ``python bench/workflows.py`` (``--quick`` for a smoke run, ``--tcp`` for loopback,
``--repeat R`` for the best of R).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence

from _common import (
    BASELINE_REQUESTS,
    QUICK_BASELINE_REQUESTS,
    BenchError,
    add_common_args,
    bench_server,
    describe_environment,
    fail,
    format_table,
    run_baselines,
    runs_from_args,
    say,
)
from vs_bullmq import ensure_bullmq, node

from jobqueue import JobQueue
from jobqueue.client.base import Request
from jobqueue.testing import run_due

DEFAULT_N, QUICK_N = 10_000, 1_000
CHAIN_STEPS, QUICK_CHAIN_STEPS = 1_000, 200
BATCH = 500
CONCURRENCY = 8
TARGET_CHILD_RATIO = 1.5
TARGET_STEP_MS = 2.0


def app(url: str) -> JobQueue:
    jq = JobQueue.from_url(url)

    @jq.task
    def noop(i: int = 0) -> int:
        return i

    @jq.task
    def gather(results: list[int]) -> int:
        return len(results)

    @jq.task
    def step(previous: int) -> int:
        return previous + 1

    return jq


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def plain(jq: JobQueue, n: int) -> None:
    noop = jq.resolve_task("noop")
    for start in range(0, n, BATCH):
        jq.enqueue_many(Request(noop, (i,)) for i in range(start, min(start + BATCH, n)))
    run_due(jq, concurrency=CONCURRENCY)


def group(jq: JobQueue, n: int) -> None:
    noop = jq.resolve_task("noop")
    flow = jq.group([noop.s(i) for i in range(n)])
    run_due(jq, concurrency=CONCURRENCY)
    if flow.runs[-1].state != "done":
        raise BenchError("group: not every child ran")


def chord(jq: JobQueue, n: int) -> None:
    noop, gather = jq.resolve_task("noop"), jq.resolve_task("gather")
    flow = jq.chord([noop.s(i) for i in range(n)], gather.receiving())
    run_due(jq, concurrency=CONCURRENCY)
    if flow.result(timeout=30) != n:
        raise BenchError("chord: the callback did not get every result")


def chain(jq: JobQueue, m: int) -> None:
    noop, step = jq.resolve_task("noop"), jq.resolve_task("step")
    flow = jq.chain(noop.s(0), *(step.receiving() for _ in range(m - 1)))
    run_due(jq, concurrency=1)
    if flow.result(timeout=30) != m - 1:
        raise BenchError("chain: the last step's result is wrong")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(parser, default_n=DEFAULT_N, quick_n=QUICK_N)
    parser.add_argument("--bullmq", action="store_true",
                        help="also BullMQ's plain drain and flow, on the same server")
    args = parser.parse_args(argv)
    n = runs_from_args(args)
    m = QUICK_CHAIN_STEPS if args.quick else CHAIN_STEPS
    requests = QUICK_BASELINE_REQUESTS if args.quick else BASELINE_REQUESTS
    try:
        with bench_server(args.url, allow_flush=args.flush, tcp=args.tcp) as server:
            say("jobqueue workflow benchmark")
            for line in describe_environment(server).lines():
                say(f"  {line}")
            baselines = run_baselines(server, requests)
            serial = baselines.write_serial
            jq = app(server.url)
            try:
                def phase(fn: Callable[[JobQueue, int], None], count: int) -> float:
                    server.flush()
                    fn(jq, min(count, 200))  # warm-up: scripts loaded, queue registered
                    server.flush()
                    return min(timed(lambda: fn(jq, count)) for _ in range(args.repeat))

                t_plain = phase(plain, n)
                t_group = phase(group, n)
                t_chord = phase(chord, n)
                t_plain_m = phase(plain, m)
                t_chain = phase(chain, m)
            finally:
                jq.close()
            bull: dict[str, float] = {}
            if args.bullmq:
                ensure_bullmq()
                for what in ("drain", "flow"):
                    times = []
                    for _ in range(args.repeat):
                        server.flush()
                        times.append(node(what, server.url, str(n), str(CONCURRENCY))["seconds"])
                    bull[what] = min(times)
    except (BenchError, OSError) as exc:
        return fail(str(exc))
    per = {name: t / n * 1e6 for name, t in
           (("plain", t_plain), ("group", t_group), ("chord", t_chord))}
    step_ms = t_chain / m * 1e3
    plain_run_ms = t_plain_m / m * 1e3
    added_ms = step_ms - plain_run_ms
    ref = serial.ops_per_s if serial is not None and serial.ops_per_s else None
    rows = []
    for name in ("plain", "group", "chord"):
        rate = n / {"plain": t_plain, "group": t_group, "chord": t_chord}[name]
        rows.append([
            f"{name} ({n:,} runs)", f"{rate:,.0f}", f"{per[name]:,.0f}",
            f"{per[name] / per['plain']:.2f}x",
            f"{rate / ref:.2f}" if ref else "-",
        ])
    say()
    say(format_table(["phase", "runs/s", "us/run", "vs plain", "vs redis-benchmark -c1 -P1"],
                     rows))
    say()
    child_ratio = per["chord"] / per["plain"]
    say(f"chain of {m:,} steps: {step_ms:.2f} ms per step; a plain run drained alone "
        f"{plain_run_ms:.2f} ms; a step adds {added_ms:.2f} ms")
    verdicts = [
        ("chord child / plain run", f"{child_ratio:.2f}x", child_ratio <= TARGET_CHILD_RATIO,
         f"<= {TARGET_CHILD_RATIO}x"),
        ("chain step added latency", f"{added_ms:.2f} ms", added_ms <= TARGET_STEP_MS,
         f"<= {TARGET_STEP_MS} ms"),
    ]
    for name, value, ok, target in verdicts:
        say(f"  {name}: {value} (target {target}) {'PASS' if ok else 'MISS'}")
    if bull:
        b_plain, b_child = bull["drain"] / n * 1e6, bull["flow"] / n * 1e6
        say()
        say(format_table(
            ["BullMQ (same server, concurrency 8)", "jobs/s", "us/job", "vs its plain",
             "ours vs it"],
            [[f"plain drain ({n:,} jobs)", f"{n / bull['drain']:,.0f}", f"{b_plain:,.0f}",
              "1.00x", f"{b_plain / per['plain']:.2f}x"],
             [f"flow child ({n:,} children)", f"{n / bull['flow']:,.0f}", f"{b_child:,.0f}",
              f"{b_child / b_plain:.2f}x", f"{b_child / per['chord']:.2f}x"]],
        ))
        say("  (ours vs it: BullMQ's time per job over ours; above 1.00x we are faster)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
