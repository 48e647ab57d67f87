"""Fair shares between groups with real worker processes on a real Redis server (one private
server per test): docs/guarantees.md, "Fair shares between groups". Workers run
``python -m jobqueue.cli --redis-url URL worker --app fair_app:jq`` (tests/apps/fair_app.py),
whose task appends "<group> <run id> <fence> <attempt>" to a list as it starts. Real server
only; every process started here is killed at teardown, pass or fail.

What is checked is the order of the claims, never how long anything took. The guarantee
counts claims, and the claims' order is known exactly: every claim issues its run a fence
above every fence issued before in the partition, one run at a time in the order the ring
picks them (claim.lua), also within a claim of several runs. The task records its run's
fence, and once the workers are stopped (gracefully: a worker claims only for free slots, so
every run it claimed has started and recorded itself) the records are every claim, which the
test checks against the groups' served counts. A run's enqueue is placed in that order by
reading the partition's fence counter in the same MULTI as the script call that creates it.

The order the runs *started* in is not what is asserted: a run claimed after another may
start before it (another worker process, another thread), by an amount no construction
bounds (a worker descheduled between its claim and its run's start while the other goes on
claiming). It is printed, as measured.
"""

from __future__ import annotations

import math
import signal
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from test_worker_processes import (  # the worker-process harness, shared
    Proc,
    Procs,
    procs_factory,
    registered_pids,
    server,
    wait_for,
)

from jobqueue.client.base import Request
from jobqueue.client.sync import JobQueue
from jobqueue.store.embedded import EmbeddedServer
from jobqueue.store.keys import PartitionKeys
from jobqueue.store.scripts import Call, ScriptRunner

pytestmark = pytest.mark.slow

__all__ = ["procs_factory", "server"]  # fixtures, used by name

QUEUE = "default"
PK = PartitionKeys(QUEUE, 0)  # one partition: every run of these tests lives here
STARTS, STARTED = "fair:starts", "fair:started"  # as tests/apps/fair_app.py writes them
WORKERS, CONCURRENCY = 2, 8
# A lease far longer than any run: no claim here takes back an expired lease (those go
# before the ring's and are not counted by the bound).
WORKER_ARGS = ("--concurrency", str(CONCURRENCY), "--lease", "60", "--grace", "20")


# -- helpers ---------------------------------------------------------------------------------


def client_for(url: str) -> JobQueue:
    # A reply may take seconds on a loaded machine (a 5,000-run enqueue is 10 script calls
    # in one round trip): more than redis-py's 5 s default for a Unix socket.
    jq = JobQueue(redis.Redis.from_url(url, decode_responses=True, socket_timeout=60))
    jq.declare_task("fair_start")  # its code is only in the worker processes
    return jq


class FenceNotingRunner(ScriptRunner):
    """Sends each single script call (an enqueue of runs of one partition) in a MULTI after
    reads of the partition's fence counter and of the list of starts: the claims with a
    fence above the noted one came after the enqueue, those at or below it before, whatever
    the workers did meanwhile."""

    def __init__(self, client: Any) -> None:
        super().__init__(client)
        self.noted: list[tuple[int, int]] = []  # (fence counter, starts recorded)

    def _evalsha(self, call: Call) -> Any:
        pipe = self.client.pipeline(transaction=True)
        pipe.get(PK.fences)
        pipe.llen(STARTS)
        pipe.execute_command("EVALSHA", *self._sources.evalsha_args(call))
        fence, starts, reply = pipe.execute()
        self.noted.append((int(fence or 0), int(starts)))
        return reply


def noting_client(url: str) -> tuple[JobQueue, FenceNotingRunner]:
    jq = client_for(url)
    runner = FenceNotingRunner(jq.redis)
    jq._scripts = runner
    return jq, runner


@dataclass(frozen=True)
class Start:
    seq: int  # its place in the order of starts
    group: str
    run_id: str
    fence: int  # its claim's: the order of claims
    attempt: int


def read_starts(r: redis.Redis) -> list[Start]:
    out = []
    for seq, entry in enumerate(r.lrange(STARTS, 0, -1)):
        group, run_id, fence, attempt = entry.split(" ")
        out.append(Start(seq, group, run_id, int(fence), int(attempt)))
    return out


def served(r: redis.Redis) -> dict[str, int]:
    """Runs claimed from each group (claim.lua counts them in its partition's gserved)."""
    return {g: int(n) for g, n in r.hgetall(PK.gserved).items()}


def bound(weights: dict[str, int], g: str) -> int:
    """docs/guarantees.md: the most claims of other groups before one of g's while g has a
    due run, taking every other group as having due runs (the most the sum can be)."""
    return sum(math.ceil(w / weights[g]) + 1 for j, w in weights.items() if j != g)


def enqueue_chunks(jq: JobQueue, group: str, n: int, chunk: int = 5_000) -> None:
    for lo in range(0, n, chunk):
        jq.enqueue_many(
            Request("fair_start", (group,), limit_key=group) for _ in range(min(chunk, n - lo))
        )


def flood(url: str, group: str, n: int, threads: int = 4) -> None:
    """``n`` runs of ``group`` from ``threads`` clients at once: while one prepares its next
    chunk the server creates another's (one client alone took 30 to 50 s for 100,000 runs
    with two CPU hogs on two busy cores, 4 took 17 s)."""
    assert n % threads == 0

    def part(k: int) -> None:
        jq = client_for(url)
        enqueue_chunks(jq, group, k)
        jq.redis.close()

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(part, [n // threads] * threads))  # (raises what a thread raised)


def stop_workers(workers: list[Proc], r: redis.Redis) -> None:
    """SIGTERM to every worker once it runs (registered), then wait for each to exit 0: a
    stopping worker claims no more and lets its runs finish."""
    for proc in workers:
        wait_for(lambda p=proc: p.pid in registered_pids(r) or not p.alive(), 30, "registration")
    for proc in workers:
        proc.popen.send_signal(signal.SIGTERM)
    for proc in workers:
        assert proc.popen.wait(40) == 0, proc.text()[-2000:]


def check_complete(r: redis.Redis, starts: list[Start]) -> None:
    """Every claim started and recorded itself, once: the records are the claims."""
    assert Counter(s.group for s in starts) == Counter(served(r)), (len(starts), served(r))
    assert {s.attempt for s in starts} == {1}  # no lease taken back
    assert len({s.fence for s in starts}) == len(starts)


# -- the tests -------------------------------------------------------------------------------

FLOOD = 100_000
TENANTS = ("B", "C", "D", "E")
PER_TENANT = 10


def test_a_tenant_flooding_100000_runs_holds_no_other_tenants_run_past_the_bound(
    server: EmbeddedServer, procs_factory: Callable[[str], Procs]
) -> None:
    """Tenant A enqueues 100,000 runs (the queue paused meanwhile: the 2 workers,
    concurrency 8, start then), then the workers run them; once they are at it (200 of A's
    claimed: 99,800 waiting), tenants B, C, D and E enqueue 10 runs each, one after the other
    with 20 claims between. All weights 1: while a tenant g has a run waiting, at most the sum
    over the 4 other groups of (1 + 1) = 8 runs of other groups are claimed before one of g's.

    Checked exactly, in claim order (fences), so with no slack: a run claimed but not started
    when g enqueued (up to concurrency x workers = 16 of them) has a fence at or below the one
    noted in the enqueue's MULTI and is not counted, and the runs one claim takes (several at
    once) have their fences in the order the ring picked them. So for each tenant: from its
    enqueue to its first claim, and between two of its claims, at most 8 claims of other
    groups. The test stops once the 40 runs are claimed (A's other 99,000-odd runs left
    waiting), at most 60 s, or as soon as A got more than 320 claims after the last enqueue
    with a tenant's run still waiting (the bound allows 80 there: 8 before each of the 10
    runs of the tenant served last)."""
    jq = client_for(server.url)
    r = jq.redis
    jq.set_fair_shares(QUEUE)
    procs = procs_factory(server.url)
    started = time.monotonic()
    # The workers start while A floods, the queue paused: they would only slow the flood.
    jq.pause_queue(QUEUE)
    workers = [procs.worker(*WORKER_ARGS, app="fair_app:jq") for _ in range(WORKERS)]
    flood(server.url, "A", FLOOD)
    flood_s = time.monotonic() - started
    jq.resume_queue(QUEUE)
    wait_for(lambda: served(r).get("A", 0) >= 200, 60, "the workers to claim A's runs")

    tenants, runner = noting_client(server.url)
    noted: dict[str, tuple[int, int]] = {}
    for g in TENANTS:
        tenants.enqueue_many(Request("fair_start", (g,), limit_key=g) for _ in range(PER_TENANT))
        noted[g] = runner.noted[-1]
        before = sum(served(r).values())
        wait_for(lambda b=before: sum(served(r).values()) >= b + 20, 30, "20 more claims")
    assert len(runner.noted) == len(TENANTS)  # one call each: its runs enqueued at once
    a_after = served(r)["A"]

    def settled() -> str | None:
        now = served(r)
        if all(now.get(g, 0) >= PER_TENANT for g in TENANTS):
            return "served"
        if now.get("A", 0) > a_after + 4 * PER_TENANT * 8:
            return "overrun"
        return None

    outcome = wait_for(settled, 60, "the tenants' runs to be claimed")
    stop_workers(workers, r)
    elapsed = time.monotonic() - started
    tenants_served = {g: served(r).get(g, 0) for g in TENANTS}
    assert outcome == "served", f"A got {served(r)['A'] - a_after} claims; {tenants_served}"

    starts = read_starts(r)
    check_complete(r, starts)
    assert int(r.zcard(PK.gq("A"))) > FLOOD // 2  # A's backlog was there throughout
    weights = dict.fromkeys(("A", *TENANTS), 1)
    by_fence = sorted(starts, key=lambda s: s.fence)
    worst_gap, worst_started_before = 0, 0
    for g in TENANTS:
        fence0, starts0 = noted[g]
        gap, gaps = 0, []
        for s in by_fence:
            if s.fence <= fence0:
                continue
            if s.group != g:
                gap += 1
                continue
            gaps.append(gap)
            gap = 0
            if len(gaps) == PER_TENANT:
                break
        assert len(gaps) == PER_TENANT, (g, gaps)
        assert max(gaps) <= bound(weights, g), (g, gaps)
        worst_gap = max(worst_gap, *gaps)
        # As measured, not asserted (see the module's docstring): the other groups' runs
        # started between the enqueue and the start of the tenant's last run, per run of it.
        mine = [s for s in starts if s.group == g]
        others = sum(1 for s in starts[starts0 : mine[-1].seq] if s.group != g)
        worst_started_before = max(worst_started_before, math.ceil(others / PER_TENANT))
    print(
        f"\nflood: {FLOOD} runs enqueued in {flood_s:.1f}s; {len(starts)} claims; most claims "
        f"of others before a tenant's: {worst_gap} (bound 8); most starts of others per "
        f"tenant run: {worst_started_before}; {elapsed:.1f}s in all"
    )


# The first claims looked at. The shares' error under the bound is a constant (a few
# claims), so its share of the window shrinks as the window grows: over 4,000 claims it is
# a tenth of a percent, against 5 % allowed, while a fault that drops the weights (1:1) is 33 %
# off. 4,000 runs also take only a few seconds on two busy cores.
WINDOW = 4_000


def test_weights_3_to_1_share_the_claims_3_to_1(
    server: EmbeddedServer, procs_factory: Callable[[str], Procs]
) -> None:
    """Group a (weight 3) and group b (weight 1) each get a backlog (4,500 and 1,500 runs,
    more than their shares of the window) while the queue is paused and 2 workers
    (concurrency 8) start; once resumed, the first 4,000 claims, in claim order (fences), are
    a's and b's within 5 % of 3:1, neither group having run out within them. By the bound,
    also at most 4 of a's between two of b's and 2 of b's between two of a's."""
    jq = client_for(server.url)
    r = jq.redis
    jq.set_fair_shares(QUEUE)
    weights = {"a": 3, "b": 1}
    backlog = {"a": 4_500, "b": 1_500}
    for g, w in weights.items():
        jq.set_group(QUEUE, g, weight=w)
    procs = procs_factory(server.url)
    started = time.monotonic()
    # Paused while the backlogs go in (and the workers start): the first claim sees both.
    jq.pause_queue(QUEUE)
    workers = [procs.worker(*WORKER_ARGS, app="fair_app:jq") for _ in range(WORKERS)]
    for g, n in backlog.items():
        enqueue_chunks(jq, g, n)
    jq.resume_queue(QUEUE)
    wait_for(lambda: sum(served(r).values()) >= WINDOW, 60, f"{WINDOW} claims")
    stop_workers(workers, r)
    elapsed = time.monotonic() - started

    starts = read_starts(r)
    check_complete(r, starts)
    groups = {info.name: info for info in jq.groups(QUEUE)}
    assert Counter({g: groups[g].served for g in weights}) == Counter(s.group for s in starts)
    window = sorted(starts, key=lambda s: s.fence)[:WINDOW]
    counts = Counter(s.group for s in window)
    ratio = counts["a"] / max(counts["b"], 1)
    assert abs(ratio - 3) <= 3 * 0.05, counts
    assert all(counts[g] < n for g, n in backlog.items()), counts  # both busy throughout
    for g in weights:
        gap, worst = 0, 0
        for s in window:
            if s.group == g:
                worst, gap = max(worst, gap), 0
            else:
                gap += 1
        assert worst <= bound(weights, g), (g, worst)
    print(
        f"\nweights 3:1: first {WINDOW} claims a={counts['a']} b={counts['b']} "
        f"(ratio {ratio:.3f}); {len(starts)} claims in {elapsed:.1f}s"
    )
