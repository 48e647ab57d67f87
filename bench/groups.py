"""What fair shares between groups cost a claim and an enqueue, next to plain claims, in one
sitting on one server.

    .venv/bin/python bench/groups.py [--url URL | --tcp] [--n N] [--quick] [--repeat R]
                                     [--flush]

The claim, create_run and complete scripts are called directly through their contracts
(jobqueue.store.runs CLAIM, CREATE_RUN, COMPLETE), as bench/core.py does: no worker, no
enqueue planning in the timed loops. Cases, each with claim batches of 1 and of 16 runs:

* plain: runs without a limit_key, fair shares off (the yardstick of every ratio);
* limit_key, fair off: the runs spread round-robin over 10 limit keys, fair shares off;
* fair, 1 / 10 / 1,000 groups: ``jq.set_fair_shares(queue)``, the runs spread round-robin
  over that many limit keys (a run's group is its limit_key);
* fair, 10 groups, per-key cap 1: the same with ``set_queue_concurrency(q, 1, per_key=True)``
  (with batches of 16 a claim takes at most one run of each of the 10 groups: the cap binds,
  full groups leave the ring until a complete frees their slot).

Each (case, batch) pair, on a freshly flushed server with its own JobQueue: the settings, a
warm-up (W runs created and drained on the same path, untimed), then

* enqueue: N runs created with one create_run call per batch (the RunSpecs built beforehand,
  untimed): client runs/s, the server's EVALSHA microseconds per run (INFO commandstats) and
  the server's CPU per run (INFO cpu: user + system);
* drain: the N pending runs claimed ``batch`` at a time, each claim followed by one complete
  call for the runs it gave, as a no-op worker does. After every script call one ``INFO cpu
  commandstats`` is read, in a round trip of its own outside the timed ones, so each call's
  server CPU (user + system) and EVALSHA microseconds are its own: the claim's per claimed
  run are told apart from the complete's. The CPU between two reads also holds one INFO's
  own CPU, measured before the drain with 200 reads back to back and taken off each call's.
  The EVALSHA microseconds are wall-clock time inside the script (they grow when the server
  is preempted); the CPU figure does not. "claim runs/s" is N over the time spent in claim
  round trips only.

(The slowlog cannot split the calls: Redis 7 logs the commands a script runs too, and
logging them adds to the script's own duration.)

With --repeat R (default 5; 3 with --quick), R rounds of every pair, the pairs' order rotating
from round to round (and reversed every other round); every round's figures are printed.
Figures: the medians over the rounds (the lower middle one for an even count); ratios: the
median of each round's ratio to plain claims (or plain enqueue) of the same batch size, in
the same round. redis-benchmark's EVALSHA rates on the same server are printed for scale.
``--quick`` (N = 300, 3 rounds) is a smoke run of under a minute.

This machine may be shared and noisy: compare ratios within one sitting, and server CPU
per run rather than rates. Figures and both sittings of 2026-12-04: docs/concepts.md,
"What fair shares cost".
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import redis
from _common import (
    BASELINE_REQUESTS,
    QUICK_BASELINE_REQUESTS,
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
    server_cpu_seconds,
    warmup_size,
)

from jobqueue import JobQueue, Request
from jobqueue.errors import JobQueueError
from jobqueue.payload import encode_result
from jobqueue.store.keys import PartitionKeys
from jobqueue.store.runs import CLAIM, COMPLETE, CREATE_RUN, RunSpec

DEFAULT_N = 2_000
QUICK_N = 300
DEFAULT_ROUNDS = 5
QUICK_ROUNDS = 3
BATCHES = (1, 16)
TASK_NAME = "bench_groups_noop"
OWNER = "bench-groups"
CALIBRATION = 200  # back-to-back INFO reads that measure one INFO's own CPU
EMPTY_CLAIMS_MAX = 3  # consecutive empty claims with runs left: the drain is stuck


@dataclass(frozen=True)
class Case:
    name: str
    groups: int  # distinct limit keys the runs are spread over (0: no limit_key)
    fair: bool
    cap: int | None = None  # per-key concurrency cap


CASES = (
    Case("plain (no limit_key)", 0, False),
    Case("limit_key x10, fair off", 10, False),
    Case("fair, 1 group", 1, True),
    Case("fair, 10 groups", 10, True),
    Case("fair, 1,000 groups", 1_000, True),
    Case("fair, 10 groups, per-key cap 1", 10, True, cap=1),
)
PLAIN = CASES[0]


def noop(i: int) -> None:
    """The registered task; never executed here (no worker runs)."""


# -- metering ---------------------------------------------------------------------------------


def evalsha_usec(client: Any) -> int:
    """Microseconds the server has spent in EVALSHA calls (INFO commandstats)."""
    stats = client.info("commandstats").get("cmdstat_evalsha")
    return int(stats["usec"]) if stats else 0


class Snapshots:
    """The server's CPU seconds (INFO cpu: user + system) and EVALSHA microseconds (INFO
    commandstats), read in one INFO call after each script call. The CPU between two reads
    holds one INFO's own CPU (the tail of one and the head of the next), ``overhead``,
    measured with CALIBRATION reads back to back and taken off each call's figure."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.cpu, self.usec = self.read()
        first = self.cpu
        for _ in range(CALIBRATION):
            self.cpu, self.usec = self.read()
        self.overhead = (self.cpu - first) / CALIBRATION

    def read(self) -> tuple[float, int]:
        info = self.client.execute_command("INFO", "cpu", "commandstats")
        stats = info.get("cmdstat_evalsha")
        return (float(info["used_cpu_user"]) + float(info["used_cpu_sys"]),
                int(stats["usec"]) if stats else 0)

    def step(self) -> tuple[float, int]:
        """(CPU seconds, EVALSHA microseconds) since the last read: one script call's."""
        cpu, usec = self.read()
        got = (cpu - self.cpu - self.overhead, usec - self.usec)
        self.cpu, self.usec = cpu, usec
        return got


# -- one (case, batch) ------------------------------------------------------------------------


@dataclass
class Figures:
    """One (case, batch) in one round."""

    # enqueue
    enq_rate: float = 0.0  # runs/s, client-observed
    enq_us: float = 0.0  # server EVALSHA us per run
    enq_cpu_us: float = 0.0  # server CPU us per run
    # drain
    claim_rate: float = 0.0  # runs/s over the time spent in claim round trips
    drain_rate: float = 0.0  # runs/s over the claim and complete round trips
    claim_cpu_us: float = 0.0  # server CPU us per claimed run, claim calls only
    claim_us: float = 0.0  # server EVALSHA us per claimed run, claim calls only
    complete_cpu_us: float = 0.0  # server CPU us per run, complete calls only
    complete_us: float = 0.0  # server EVALSHA us per run, complete calls only
    per_claim: float = 0.0  # runs a claim call gave, on average
    empty: int = 0  # claim calls that gave nothing (runs left: held back by the cap)
    info_cpu_us: float = 0.0  # one INFO's own server CPU (taken off every call's)


def limit_key(case: Case, i: int) -> str | None:
    return None if case.groups == 0 else f"tenant-{i % case.groups}"


def build_specs(jq: JobQueue, task: Any, case: Case, first: int, count: int) -> list[RunSpec]:
    return [
        jq.prepare(Request(task, (i,), limit_key=limit_key(case, i)))[1]
        for i in range(first, first + count)
    ]


def create(jq: JobQueue, pk: PartitionKeys, specs: Sequence[RunSpec], batch: int) -> int:
    runner, created = jq.scripts, 0
    for start in range(0, len(specs), batch):
        reply = runner.run(CREATE_RUN.call(pk, specs[start : start + batch]))
        created += sum(CREATE_RUN.parse(reply))
    return created


@dataclass
class Drained:
    runs: int = 0
    claims: int = 0
    empty: int = 0
    claim_s: float = 0.0  # in claim round trips
    loop_s: float = 0.0  # in claim and complete round trips
    claim_cpu: float = 0.0  # the server's CPU seconds in claim calls
    claim_us: int = 0  # the server's EVALSHA microseconds in claim calls
    complete_cpu: float = 0.0  # the same in complete calls
    complete_us: int = 0


def drain(
    jq: JobQueue, pk: PartitionKeys, n: int, batch: int, snaps: Snapshots | None
) -> Drained:
    """Claim ``batch`` at a time and complete each claim's runs in one call, until N are done.
    With ``snaps``, INFO is read after every script call (in a round trip of its own, outside
    the timed ones), so claims and completes are told apart."""
    settings, runner = jq.settings, jq.scripts
    result = encode_result(None)
    lease, dead, done_ms = (settings.default_lease_ms, settings.dead_retention_ms,
                            settings.done_retention_ms)
    d = Drained()
    empty_in_a_row = 0
    clock = time.perf_counter
    while d.runs < n:
        t0 = clock()
        claimed = CLAIM.parse(runner.run(CLAIM.call(pk, batch, OWNER, lease, dead))).runs
        t1 = clock()
        d.claims += 1
        d.claim_s += t1 - t0
        d.loop_s += t1 - t0
        if snaps is not None:
            cpu, usec = snaps.step()
            d.claim_cpu += cpu
            d.claim_us += usec
        if not claimed:
            d.empty += 1
            empty_in_a_row += 1
            if empty_in_a_row >= EMPTY_CLAIMS_MAX:
                raise BenchError(f"drain: {empty_in_a_row} empty claims in a row with "
                                 f"{n - d.runs:,} of {n:,} runs left")
            continue
        empty_in_a_row = 0
        call = COMPLETE.call(pk, [(r.run_id, r.fence, result) for r in claimed], done_ms)
        t2 = clock()
        outcomes = COMPLETE.parse(runner.run(call))
        d.loop_s += clock() - t2
        if snaps is not None:
            cpu, usec = snaps.step()
            d.complete_cpu += cpu
            d.complete_us += usec
        for run, outcome in zip(claimed, outcomes, strict=True):
            if not outcome.accepted:
                raise BenchError(f"complete of {run.run_id} refused: {outcome.status}")
        d.runs += len(claimed)
    return d


def measure(server: BenchServer, case: Case, batch: int, n: int, warmup: int) -> Figures:
    server.flush()
    client = server.client
    jq = JobQueue.from_url(server.url)
    task = jq.task(name=TASK_NAME)(noop)
    queue = task.options.queue
    try:
        if case.fair:
            jq.set_fair_shares(queue)
        if case.cap is not None:
            jq.set_queue_concurrency(queue, case.cap, per_key=True)
        (pk,) = jq.all_partition_keys(queue)
        # warm-up on the same paths, untimed
        create(jq, pk, build_specs(jq, task, case, -warmup, warmup), batch)
        drain(jq, pk, warmup, batch, None)
        specs = build_specs(jq, task, case, 0, n)

        usec, cpu = evalsha_usec(client), server_cpu_seconds(client)
        start = time.perf_counter()
        created = create(jq, pk, specs, batch)
        enq_s = time.perf_counter() - start
        enq_cpu, enq_usec = server_cpu_seconds(client) - cpu, evalsha_usec(client) - usec
        if created != n:
            raise BenchError(f"{case.name}: created {created:,} of {n:,}")

        snaps = Snapshots(client)
        d = drain(jq, pk, n, batch, snaps)
        completed = int(client.hget(pk.stats, "completed") or 0)
        left = client.zcard(pk.due) + client.zcard(pk.leases)
    finally:
        jq.close()
    if d.runs != n or completed != n + warmup or left:
        raise BenchError(
            f"{case.name}, batch {batch}: drained {d.runs:,} of {n:,}, {completed:,} completed "
            f"in all, {left:,} still pending or leased"
        )
    return Figures(
        enq_rate=n / enq_s,
        enq_us=enq_usec / n,
        enq_cpu_us=enq_cpu / n * 1e6,
        claim_rate=n / d.claim_s,
        drain_rate=n / d.loop_s,
        claim_cpu_us=d.claim_cpu / n * 1e6,
        claim_us=d.claim_us / n,
        complete_cpu_us=d.complete_cpu / n * 1e6,
        complete_us=d.complete_us / n,
        per_claim=n / (d.claims - d.empty) if d.claims > d.empty else 0.0,
        empty=d.empty,
        info_cpu_us=snaps.overhead * 1e6,
    )


# -- rounds and report ------------------------------------------------------------------------

Pair = tuple[Case, int]
PAIRS: list[Pair] = [(case, batch) for batch in BATCHES for case in CASES]

# Every round's figures, one line per (case, batch) as it is measured: (header, width).
ROUND_COLUMNS = (("round", 5), ("case", 30), ("batch", 5), ("enq runs/s", 10),
                 ("enq cpu", 7), ("enq us", 6), ("claim runs/s", 12), ("drain runs/s", 12),
                 ("claim cpu", 9), ("claim us", 8), ("compl cpu", 9), ("compl us", 8),
                 ("runs/claim", 10), ("empty", 5), ("INFO cpu", 8))


def round_line(cells: Sequence[str]) -> str:
    return "  ".join(
        c.ljust(w) if i == 1 else c.rjust(w)
        for i, (c, (_, w)) in enumerate(zip(cells, ROUND_COLUMNS, strict=True))
    ).rstrip()


def round_row(k: int, case: Case, batch: int, f: Figures) -> list[str]:
    return [str(k), case.name, str(batch), fmt_int(f.enq_rate), f"{f.enq_cpu_us:.1f}",
            f"{f.enq_us:.1f}", fmt_int(f.claim_rate), fmt_int(f.drain_rate),
            f"{f.claim_cpu_us:.1f}", f"{f.claim_us:.1f}", f"{f.complete_cpu_us:.1f}",
            f"{f.complete_us:.1f}", f"{f.per_claim:.1f}", fmt_int(f.empty),
            f"{f.info_cpu_us:.1f}"]


class Rounds:
    def __init__(self) -> None:
        self.figures: dict[Pair, list[Figures]] = {}

    def add(self, pair: Pair, figures: Figures) -> None:
        self.figures.setdefault(pair, []).append(figures)

    def median(self, pair: Pair, get: Callable[[Figures], float]) -> float:
        return float(statistics.median_low([get(f) for f in self.figures[pair]]))

    def ratio(self, pair: Pair, get: Callable[[Figures], float]) -> float | None:
        """The median over the rounds of this pair's figure over plain's of the same batch
        in the same round."""
        plain = self.figures[(PLAIN, pair[1])]
        ratios = [get(f) / get(p) for f, p in zip(self.figures[pair], plain, strict=True)
                  if get(p)]
        return float(statistics.median_low(ratios)) if ratios else None


def times(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def cell(rounds: Rounds, pair: Pair, get: Callable[[Figures], float], spec: str) -> str:
    value = format(rounds.median(pair, get), spec)
    return value if pair[0] is PLAIN else f"{value} ({times(rounds.ratio(pair, get))})"


def claim_rows(rounds: Rounds) -> list[list[str]]:
    rows = []
    for case, batch in PAIRS:
        pair = (case, batch)
        rows.append([
            case.name, str(batch),
            cell(rounds, pair, lambda f: f.claim_cpu_us, ".1f"),
            cell(rounds, pair, lambda f: f.claim_us, ".1f"),
            cell(rounds, pair, lambda f: f.claim_cpu_us + f.complete_cpu_us, ".1f"),
            cell(rounds, pair, lambda f: f.claim_rate, ",.0f"),
            f"{rounds.median(pair, lambda f: f.per_claim):.1f}",
        ])
    return rows


CLAIM_HEADERS = ["case", "batch", "claim CPU us/run", "claim script us/run",
                 "claim+complete CPU us/run", "claim runs/s", "runs/claim"]


def enqueue_rows(rounds: Rounds) -> list[list[str]]:
    rows = []
    for case, batch in PAIRS:
        pair = (case, batch)
        rows.append([
            case.name, str(batch),
            cell(rounds, pair, lambda f: f.enq_cpu_us, ".1f"),
            cell(rounds, pair, lambda f: f.enq_us, ".1f"),
            cell(rounds, pair, lambda f: f.enq_rate, ",.0f"),
        ])
    return rows


ENQUEUE_HEADERS = ["case", "batch", "enqueue CPU us/run", "enqueue script us/run",
                   "enqueue runs/s"]


FOOTNOTE = """\
Medians over the rounds; in brackets the median of each round's ratio to plain (no
limit_key, fair shares off) at the same batch size: above 1x costs more, and for runs/s
above 1x is faster. CPU us/run: the server's CPU (INFO cpu, user + system) per run, claim
calls only (INFO read after every call, one INFO's own CPU taken off); claim+complete: per
drained run, both calls. script us/run: the script's own time (INFO commandstats EVALSHA
usec), a wall-clock figure that grows when the server is preempted on a loaded machine.
claim runs/s: runs over the time spent in claim round trips only, as this process saw
them. Enqueue: create_run's server CPU per run over the whole enqueue stretch (no INFO in
it), its EVALSHA time per run, and runs/s. Round lines: the same figures per round, "compl"
the complete calls', "empty" claims that gave no run while runs were left (held back by the
cap), "INFO cpu" one INFO's own CPU, taken off each call's."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="The cost of fair shares between groups to claims and enqueues, next to "
        "plain claims, with redis-benchmark EVALSHA on the same server for scale."
    )
    add_common_args(parser, default_n=DEFAULT_N, quick_n=QUICK_N)
    for action in parser._actions:
        if action.dest == "repeat":
            action.default = None
            action.help = (f"rounds of every (case, batch) pair, figures the medians "
                           f"(default {DEFAULT_ROUNDS}; {QUICK_ROUNDS} with --quick)")
    args = parser.parse_args(argv)
    if args.repeat is None:
        args.repeat = QUICK_ROUNDS if args.quick else DEFAULT_ROUNDS
    n = runs_from_args(args)
    rounds_wanted = args.repeat
    warmup = min(warmup_size(n), max(20, n // 5))
    requests = QUICK_BASELINE_REQUESTS if args.quick else BASELINE_REQUESTS
    started = time.monotonic()
    rounds = Rounds()
    try:
        with bench_server(args.url, allow_flush=args.flush, tcp=args.tcp) as server:
            baselines = run_baselines(server, requests)
            say("jobqueue fair shares between groups: claim and enqueue cost, one sitting")
            say(f"  sitting: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC")
            for line in describe_environment(server).lines():
                say(f"  {line}")
            say(f"  N = {fmt_int(n)} runs per (case, batch), after a warm-up of "
                f"{fmt_int(warmup)}; {rounds_wanted} round(s); claim batches {BATCHES}")
            if baselines.tool is None:
                say("  no redis-benchmark or valkey-benchmark on PATH: no baseline")
            else:
                say(f"  baseline: {baselines.tool}, {fmt_int(baselines.requests)} requests "
                    "per figure")
            say()
            say(baseline_table(baselines))
            say()
            say(round_line([h for h, _ in ROUND_COLUMNS]))
            for k in range(rounds_wanted):
                order = PAIRS[k % len(PAIRS):] + PAIRS[: k % len(PAIRS)]
                if k % 2:
                    order = order[::-1]
                t0 = time.monotonic()
                for case, batch in order:
                    figures = measure(server, case, batch, n, warmup)
                    rounds.add((case, batch), figures)
                    say(round_line(round_row(k + 1, case, batch, figures)))
                say(f"  round {k + 1} of {rounds_wanted}: {time.monotonic() - t0:.0f} s, "
                    f"load average {' '.join(f'{x:.2f}' for x in load())}")
    except (BenchError, JobQueueError, redis.exceptions.RedisError) as exc:
        return fail(str(exc))
    say()
    say("claims (the claim script through its contract, each claim followed by one complete)")
    say(format_table(CLAIM_HEADERS, claim_rows(rounds), "lrrrrrr"))
    say()
    say("enqueue (create_run through its contract, one call per batch)")
    say(format_table(ENQUEUE_HEADERS, enqueue_rows(rounds), "lrrrr"))
    say()
    say(FOOTNOTE)
    say(f"wall time {time.monotonic() - started:.0f} s")
    return 0


def load() -> tuple[float, ...]:
    return os.getloadavg() if hasattr(os, "getloadavg") else ()


if __name__ == "__main__":
    sys.exit(main())
