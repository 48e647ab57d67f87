"""What exact limits cost (``set_queue_concurrency(queue, N, exact=True)``: permits in the
limit's own slot, docs/concepts.md "Exact limits"), in one sitting on one server.

    .venv/bin/python bench/exact.py [--url URL | --unix] [--n N] [--quick] [--repeat R]
                                    [--flush] [--concurrency C] [--bound L]

Without --url the private server listens on TCP loopback (127.0.0.1, as ``jobqueue worker``
is run from a shell; ``--unix``: a unix socket instead). ``--quick`` (N = 1,000, one round,
no redis-benchmark yardstick) is a smoke run of well under a minute (a worker process takes
~3 s to start on a loaded 2-core machine, and each drain starts one); the figures in
docs/performance.md (What exact limits cost) are for the defaults (N = 10,000, 5 rounds: 8-9
minutes here). Every phase
runs once per round, the rounds one after the other, and every round is printed; the
figures are medians over the rounds, a ratio the median of each round's ratio.

* scripts: N pending runs in a queue of one partition are claimed B at a time (B = 1 and 16),
  by ``claim.lua`` alone (no limit), and by ``permit_take.lua`` + ``claim.lua`` +
  ``permit_settle.lua`` binding the permits to the runs claimed, as the worker does under an
  exact concurrency limit too high to bind (1,000,000); then those permits are given back B at
  a time (``permit_settle.lua``, as the committer does). Per claimed run: the server's script
  time (INFO commandstats: the usec of EVALSHA/EVAL/FCALL, a script's own commands included,
  counted once) and the script calls, i.e. client round trips. The runs are created and a
  warm-up claimed beforehand, untimed; nothing is completed.
* worker: ONE ``jobqueue worker --concurrency C`` process drains N runs of a queue of 4
  partitions, (a) without a limit, (b) under a per-partition concurrency limit of 1,000 (never
  binds), (c) under an exact limit of 1,000 (never binds), (d) under an exact limit of L
  (``--bound``, default 8 with C = 32: it binds). Tasks: ``noop`` and ``incr`` (one INCR on
  the task's own Redis connection; bench/worker_app.py). The worker is started and
  registered, then the runs are created due at an instant D; the rate is N / (last finish -
  D), finish times read from Redis; the worker's CPU (its process, /proc) and the server's
  (INFO cpu) and the script calls the server ran (INFO commandstats), per run, over the
  drain. The cases run in a rotated order each round. Case (d) drains N / 4 runs (at least
  200): a limit that binds drains short runs several times slower.

This machine may be shared and noisy: compare ratios within one sitting.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis
from _common import (
    BASELINE_REQUESTS,
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
from vs_bullmq import SCRIPT_COMMANDS, Drain, Meter, check_counter, wait_done
from worker import Workers, server_ms

from jobqueue import JobQueue, Request
from jobqueue.errors import JobQueueError
from jobqueue.store.exact import PERMIT_MARGIN_MS, PERMIT_SETTLE, PERMIT_TAKE, ExactKeys, run_permit
from jobqueue.store.keys import PartitionKeys
from jobqueue.store.runs import CLAIM

DEFAULT_N = 10_000
QUICK_N = 1_000
DEFAULT_ROUNDS, QUICK_ROUNDS = 5, 1
BATCHES = (1, 16)
QUEUE = "default"
PARTITIONS = 4
HIGH = 1_000  # a limit that never binds a worker of --concurrency C <= HIGH
EXACT_HIGH = 1_000_000  # the script phase's exact cap: never binds N claims
OWNER = "bench-exact"
LEASE_MS = 30_000
BULK = 1_000
DRAIN_TIMEOUT_S = 180.0

# The worker cases: (key, label, limit kind, limit). Key 'a' is what the others are
# divided by.
CASES = (
    ("a", "(a) no limit", None, 0),
    ("b", "(b) per-partition limit 1,000", "partition", HIGH),
    ("c", "(c) exact limit 1,000", "exact", HIGH),
    ("d", "(d) exact limit {bound} (binds)", "exact", -1),  # -1: --bound
)
TASKS = ("noop", "incr")


# -- the scripts --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScriptSample:
    """Per claimed run: the server's script time (us) and script calls (round trips)."""

    usec: float
    calls: float


def script_stats(client: Any) -> tuple[int, int]:
    """(usec, calls) of every script call the server ran (INFO commandstats)."""
    stats = client.info("commandstats")
    usec = calls = 0
    for name in SCRIPT_COMMANDS:
        if name in stats:
            usec += int(stats[name]["usec"])
            calls += int(stats[name]["calls"])
    return usec, calls


def measured_scripts(client: Any, runs: int, fn: Callable[[], None]) -> ScriptSample:
    usec0, calls0 = script_stats(client)
    fn()
    usec1, calls1 = script_stats(client)
    return ScriptSample((usec1 - usec0) / runs, (calls1 - calls0) / runs)


class Claims:
    """Claims of one partition, B at a time, with or without the exact limit's permits."""

    def __init__(self, jq: JobQueue, pk: PartitionKeys, batch: int, exact: bool) -> None:
        self.jq, self.pk, self.batch, self.exact = jq, pk, batch, exact
        self.keys = ExactKeys(pk.queue)
        self.live_ms = LEASE_MS + PERMIT_MARGIN_MS
        self.bound: list[str] = []  # run permits, to give back

    def claim(self, n: int) -> None:
        run = self.jq.scripts.run
        dead = self.jq.settings.dead_retention_ms
        done = 0
        while done < n:
            want = min(self.batch, n - done)
            token = ""
            if self.exact:
                token = uuid.uuid4().hex
                taken = PERMIT_TAKE.parse(run(PERMIT_TAKE.call(
                    self.keys, want, self.live_ms, token)))
                if taken.granted != want or not taken.limited:
                    raise BenchError(f"permit_take granted {taken.granted} of {want}")
            claimed = CLAIM.parse(run(CLAIM.call(self.pk, want, OWNER, LEASE_MS, dead))).runs
            if len(claimed) != want:
                raise BenchError(f"claim: {len(claimed)} of {want} runs after {done:,}")
            if self.exact:
                binds = [
                    (f"{token}:{i + 1}", run_permit(self.pk.prefix, r.run_id, r.fence))
                    for i, r in enumerate(claimed)
                ]
                settled = PERMIT_SETTLE.parse(run(PERMIT_SETTLE.call(
                    self.keys, self.live_ms, binds)))
                if settled.bound != want or settled.refused:
                    raise BenchError(f"permit_settle bound {settled.bound} of {want}")
                self.bound += [member for _, member in binds]
            done += want

    def give_back(self) -> None:
        run = self.jq.scripts.run
        for i in range(0, len(self.bound), self.batch):
            members = self.bound[i : i + self.batch]
            settled = PERMIT_SETTLE.parse(run(PERMIT_SETTLE.call(
                self.keys, self.live_ms, returns=members)))
            if settled.returned != len(members):
                raise BenchError(f"permit_settle returned {settled.returned} of {len(members)}")
        self.bound = []


def bench_scripts(
    server: BenchServer, n: int, batch: int, exact: bool
) -> tuple[ScriptSample, ScriptSample | None]:
    """The claims' figures, and with ``exact`` those of giving the permits back."""
    server.flush()
    warmup = max(100, min(1_000, n // 10))
    jq = JobQueue.from_url(server.url)
    try:
        task = jq.declare_task("noop")
        if exact:
            jq.set_queue_concurrency(QUEUE, EXACT_HIGH, exact=True)
        (pk,) = jq.all_partition_keys(QUEUE)
        for first in range(0, n + warmup, BULK):
            jq.enqueue_many([Request(task, (i,)) for i in range(first, min(first + BULK,
                                                                              n + warmup))])
        claims = Claims(jq, pk, batch, exact)
        claims.claim(warmup)
        if exact:
            claims.give_back()
        got = measured_scripts(server.client, n, lambda: claims.claim(n))
        back = measured_scripts(server.client, n, claims.give_back) if exact else None
        if server.client.zcard(pk.due):
            raise BenchError("runs were left unclaimed")
        return got, back
    finally:
        jq.close()


# -- the worker ---------------------------------------------------------------------------------


def set_case(jq: JobQueue, kind: str | None, limit: int) -> None:
    """Set the case's limit; with none, the queue is recorded all the same (with its 4
    partitions: else the worker, started next, would record it with its default of 1)."""
    if kind is None:
        jq.set_queue_concurrency(QUEUE, None)
    elif kind == "partition":
        jq.set_queue_concurrency(QUEUE, limit)
    elif kind == "exact":
        jq.set_queue_concurrency(QUEUE, limit, exact=True)


def bench_drain(
    server: BenchServer, n: int, task_name: str, concurrency: int, kind: str | None, limit: int
) -> Drain:
    server.flush()
    jq = JobQueue.from_url(server.url, partitions={QUEUE: PARTITIONS})
    client = server.client
    workers: Workers | None = None
    try:
        task = jq.declare_task(task_name)
        set_case(jq, kind, limit)
        pks = jq.all_partition_keys(QUEUE)
        if len(pks) != PARTITIONS:
            raise BenchError(f"the queue has {len(pks)} partitions, not {PARTITIONS}")
        workers = Workers(server.url, concurrency, 1, env={"BENCH_TASK_URL": server.url})
        workers.wait_registered(client)
        due = server_ms(client) + 300 + n // 5  # time to create the runs
        for first in range(0, n, BULK):
            batch = range(first, min(first + BULK, n))
            jq.enqueue_many([Request(task, (i,), at=due / 1000.0) for i in batch])
        if server_ms(client) >= due:
            raise BenchError("setup took longer than the lead time; try a smaller --n")
        while server_ms(client) < due:  # the meters count the drain only
            time.sleep(0.001)
        meter = Meter(client, workers.popen.pid)

        def done() -> int:
            pipe = client.pipeline(transaction=False)
            for pk in pks:
                pipe.zcard(pk.done)
            return sum(int(c) for c in pipe.execute())

        polls = wait_done(done, n, f"{task_name} drain")
        pipe = client.pipeline(transaction=False)
        for pk in pks:
            pipe.zrange(pk.done, -1, -1, withscores=True)
        last = max(int(score) for reply in pipe.execute() for _, score in reply)
        drain = meter.drain(n, (last - due) / 1000.0, (polls + 1) * PARTITIONS)
        check_counter(server, n, task_name)
        return drain
    finally:
        if workers is not None:
            # Measured and checked: no graceful stop to wait for (its data is flushed next).
            workers.popen.kill()
            workers.popen.wait(20)
        jq.close()


# -- rounds and the report ----------------------------------------------------------------------


class Rounds:
    """Samples per phase, one per round; medians over the rounds."""

    def __init__(self) -> None:
        self.samples: dict[str, list[Any]] = {}

    def add(self, name: str, sample: Any) -> None:
        self.samples.setdefault(name, []).append(sample)

    def median(self, name: str, of: Callable[[Any], float]) -> float:
        return statistics.median(of(s) for s in self.samples[name])

    def ratio(self, name: str, base: str, of: Callable[[Any], float]) -> float:
        """The median of each round's ratio."""
        pairs = zip(self.samples[name], self.samples[base], strict=True)
        return statistics.median(of(a) / of(b) for a, b in pairs if of(b) > 0)


def one_round(
    rounds: Rounds, server: BenchServer, k: int, n: int, n_bound: int, c: int, bound: int
) -> list[str]:
    """Every phase once; the lines that print this round's figures."""
    lines = []
    for batch in BATCHES:
        plain, _ = bench_scripts(server, n, batch, False)
        exact, back = bench_scripts(server, n, batch, True)
        assert back is not None
        rounds.add(f"claim {batch}", plain)
        rounds.add(f"exact {batch}", exact)
        rounds.add(f"back {batch}", back)
        lines.append(
            f"    scripts B={batch}: claim {plain.usec:.1f} us ({plain.calls:.2f} calls), "
            f"take+claim+bind {exact.usec:.1f} us ({exact.calls:.2f}), give back "
            f"{back.usec:.1f} us ({back.calls:.2f}) per run"
        )
    cases = CASES[k % len(CASES):] + CASES[: k % len(CASES)]  # rotated each round
    for task in TASKS:
        for key, label, kind, limit in cases:
            limit = bound if limit < 0 else limit
            runs = n_bound if key == "d" else n
            d = bench_drain(server, runs, task, c, kind, limit)
            rounds.add(f"{task} {key}", d)
            lines.append(
                f"    {task:<4} {label.format(bound=bound):<32} {fmt_int(d.rate):>7} runs/s, "
                f"worker {d.cpu_us:5.1f} us, server {d.server_us:5.1f} us, "
                f"{d.scripts:.2f} script calls per run ({fmt_int(runs)} runs)"
            )
    return lines


def script_rows(rounds: Rounds) -> list[list[str]]:
    rows = []

    def usec(s: ScriptSample) -> float:
        return s.usec

    def calls(s: ScriptSample) -> float:
        return s.calls

    for batch in BATCHES:
        plain, exact, back = f"claim {batch}", f"exact {batch}", f"back {batch}"
        rows.append([
            f"B = {batch}",
            f"{rounds.median(plain, usec):.1f} us",
            f"{rounds.median(exact, usec):.1f} us",
            f"{rounds.median(exact, usec) - rounds.median(plain, usec):+.1f} us",
            f"{rounds.ratio(exact, plain, usec):.2f}x",
            f"{rounds.median(back, usec):.1f} us",
            f"{rounds.median(plain, calls):.3f} / {rounds.median(exact, calls):.3f} / "
            f"{rounds.median(back, calls):.3f}",
        ])
    return rows


SCRIPT_HEADERS = ["claims of B runs", "claim alone", "take+claim+bind", "extra", "ratio",
                  "give back", "round trips per run (claim / exact / give back)"]


def drain_rows(rounds: Rounds, bound: int) -> list[list[str]]:
    rows = []

    def rate(d: Drain) -> float:
        return d.rate

    def cpu(d: Drain) -> float:
        return d.cpu_us

    def srv(d: Drain) -> float:
        return d.server_us

    def scripts(d: Drain) -> float:
        return d.scripts

    for task in TASKS:
        base = f"{task} a"
        for key, label, _, _ in CASES:
            name = f"{task} {key}"
            first = key == "a"
            rows.append([
                f"{task}, {label.format(bound=bound)}",
                fmt_int(rounds.median(name, rate)),
                "-" if first else f"{rounds.ratio(name, base, rate):.2f}x",
                f"{rounds.median(name, cpu):.1f} us",
                "-" if first else f"{rounds.ratio(name, base, cpu):.2f}x",
                f"{rounds.median(name, srv):.1f} us",
                "-" if first else f"{rounds.ratio(name, base, srv):.2f}x",
                f"{rounds.median(name, scripts):.2f}",
            ])
    return rows


DRAIN_HEADERS = ["1 worker, 4 partitions", "runs/s", "of (a)", "worker CPU/run", "of (a)",
                 "server CPU/run", "of (a)", "script calls/run"]

FOOTNOTE = """\
scripts: per claimed run, the server's script time (INFO commandstats usec of EVALSHA and
EVAL, their own commands included) and script calls (each a client round trip); extra and
ratio: take+claim+bind over claim alone. give back: permit_settle returning the permits B at
a time (the committer's call, one per batch of commits). worker: N / (last finish - the
instant the runs became claimable); per run, the worker process's CPU (/proc), the server's
CPU (INFO cpu) and the script calls it ran; of (a): the median of each round's ratio to the
drain without a limit. Figures: medians over the rounds. /proc counts CPU in ticks of 10 ms:
10 us per run at N = 1,000, 1 us at 10,000."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="What exact limits cost, scripts and worker.")
    add_common_args(parser, default_n=DEFAULT_N, quick_n=QUICK_N)
    parser.set_defaults(repeat=None)
    parser.add_argument("--unix", action="store_true",
                        help="the private server listens on a unix socket, not TCP loopback")
    parser.add_argument("--concurrency", type=int, default=32,
                        help="the worker's slots (default 32)")
    parser.add_argument("--bound", type=int, default=8,
                        help="case (d)'s exact limit, below --concurrency (default 8)")
    args = parser.parse_args(argv)
    rounds_wanted = args.repeat or (QUICK_ROUNDS if args.quick else DEFAULT_ROUNDS)
    args.repeat = rounds_wanted
    n = runs_from_args(args)
    n_bound = max(200, n // 4)
    c, bound = args.concurrency, args.bound
    if not 1 <= bound < c <= HIGH:
        raise SystemExit("--bound must be below --concurrency, and that at most 1,000")
    tcp = not args.unix and not args.url
    started = time.monotonic()
    try:
        with bench_server(args.url, allow_flush=args.flush, tcp=tcp) as server:
            baselines = None if args.quick else run_baselines(server, BASELINE_REQUESTS)
            say("exact limits: what they cost, one sitting, same server")
            for line in describe_environment(server).lines():
                say(f"  {line}")
            say(f"  scripts: N = {n:,} claimed runs per phase, B = "
                f"{' and '.join(str(b) for b in BATCHES)}; worker: --concurrency {c}, "
                f"{PARTITIONS} partitions, N = {n:,} runs per drain ({n_bound:,} in (d), "
                f"exact limit {bound}); {rounds_wanted} round(s)")
            say()
            if baselines is None:
                say("(--quick: no redis-benchmark yardstick)")
            else:
                say(baseline_table(baselines))
            say()
            rounds = Rounds()
            for k in range(rounds_wanted):
                t0 = time.monotonic()
                lines = one_round(rounds, server, k, n, n_bound, c, bound)
                say(f"  round {k + 1} of {rounds_wanted}: {time.monotonic() - t0:.0f} s")
                for line in lines:
                    say(line)
    except (BenchError, JobQueueError, redis.exceptions.RedisError, OSError) as exc:
        return fail(str(exc))
    say()
    say(format_table(SCRIPT_HEADERS, script_rows(rounds), "lrrrrrr"))
    say()
    say(format_table(DRAIN_HEADERS, drain_rows(rounds, bound), "lrrrrrrr"))
    say()
    say(FOOTNOTE)
    say(f"({time.monotonic() - started:.0f} s in all)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
