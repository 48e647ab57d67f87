"""The chaos soak (bounded: about 30 s here, 90 s at most): real worker and scheduler
processes on a real Redis server with AOF on and ``appendfsync always``, while a seeded
random schedule of faults SIGKILLs and SIGSTOPs workers and schedulers and restarts the
server twice (once gracefully, once with SIGKILL). The load: 1,500 enqueued runs spread over
the first ~10 s, plus 20 recurring jobs firing every second for 10 s (200 fire times). At the
end ``checker`` proves every run done exactly once (one accepted commit, the fenced side
effect applied once) and every fire time run exactly once, and prints the counts.

One fault is forced rather than drawn, the one whose effect the soak asserts: a worker
SIGSTOPped while it holds runs and continued only once another worker claimed one of them
again, so that its commit of that run is stale for certain (the random pauses catch a worker
holding runs only by chance, and none committed late on a busy machine).

Workers and schedulers are ``python -m jobqueue.cli ... --app chaos_app:jq``; the process
helpers come from tests/test_worker_processes.py.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis
from checker import Report, check, fire_ids
from helpers import poll
from test_worker_processes import (
    APPS,
    PK,
    ROOT,
    Proc,
    Procs,
    client_for,
    held_by,
    restart,
    stop_gracefully,
    stop_holding,
    wait_for,
)

from jobqueue.client.base import Request
from jobqueue.policy.cron import format_fire_instant
from jobqueue.store.embedded import EmbeddedServer, find_server_binary

pytestmark = pytest.mark.slow

SEED = 20601
N_RUNS = 1500
SPREAD_S = 10.0  # enqueued runs fall due evenly over this window
N_JOBS, N_FIRES = 20, 10  # recurring jobs, every second, for N_FIRES seconds
WORKER_ARGS = ("--concurrency", "4", "--lease", "1", "--grace", "1")
N_WORKERS, N_SCHEDULERS = 3, 2
CHAOS_S = 14.0  # faults are injected for this long
# ... and on, up to CHAOS_MAX_S, until this many kills and pauses each have happened: a loaded
# machine runs fewer rounds of the loop in CHAOS_S.
MIN_FAULTS = 3
CHAOS_MAX_S = 60.0
FORCED_AT_S = 1.0  # the forced stale commit, from this far into the chaos (runs flowing)
FINISH_S = 45.0  # then everything must be done within this


@dataclass
class Chaos:
    """The fault injector's state: live processes, paused ones and what was done."""

    procs: Procs
    rng: random.Random
    workers: list[Proc] = field(default_factory=list)
    schedulers: list[Proc] = field(default_factory=list)
    paused: dict[int, tuple[Proc, float]] = field(default_factory=dict)  # pid -> resume at
    kills: int = 0
    pauses: int = 0

    def scheduler(self) -> Proc:
        """A scheduler process, started and cleaned up like the workers (same Procs)."""
        log = self.procs.logs / f"scheduler-{len(self.procs.started)}.log"
        env = {**os.environ, "PYTHONPATH": f"{APPS}:{ROOT}", "PYTHONUNBUFFERED": "1"}
        env.pop("JOBQUEUE_REDIS_URL", None)
        cmd = [sys.executable, "-m", "jobqueue.cli", "--redis-url", self.procs.url]
        cmd += ["--log-level", "WARNING", "scheduler", "--app", "chaos_app:jq"]
        cmd += ["--lookahead", "1", "--interval", "0.1"]
        with log.open("wb") as err:
            popen = subprocess.Popen(
                cmd, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=err,
            )  # fmt: skip
        proc = Proc(popen, log)
        self.procs.started.append(proc)
        return proc

    def strike(self) -> None:
        """One random fault: kill or pause a worker or a scheduler (never a paused one)."""
        pool_name = self.rng.choice(["worker", "worker", "scheduler"])
        pool = self.workers if pool_name == "worker" else self.schedulers
        candidates = [p for p in pool if p.pid not in self.paused]
        if len(candidates) < 1 or (pool_name == "scheduler" and len(candidates) < 2):
            return  # keep one scheduler running: the other kind of fault covers the gap
        victim = self.rng.choice(candidates)
        if self.rng.random() < 0.5:
            victim.popen.send_signal(signal.SIGKILL)
            victim.popen.wait(5)
            pool.remove(victim)
            pool.append(
                self.procs.worker(*WORKER_ARGS) if pool is self.workers else self.scheduler()
            )
            self.kills += 1
        else:
            # Past the 1 s lease: a paused worker's runs are reclaimed, its commits refused.
            victim.popen.send_signal(signal.SIGSTOP)
            self.paused[victim.pid] = (victim, time.monotonic() + self.rng.uniform(1.2, 2.5))
            self.pauses += 1

    def pause_until_reclaimed(self, r: redis.Redis) -> None:
        """The forced fault: a worker SIGSTOPped while it holds runs (the leases zset and the
        records' owners say so once it is stopped: stop_holding), continued once another
        worker claimed one of them again (its fence moved on); then its commit of that run is
        refused, which its log says."""
        caught = wait_for(lambda: self._stop_until_reclaimed(r), 60,
                          "a worker caught holding a run")
        victim, run_id, fence = caught
        self.pauses += 1
        line = f"fenced out: commit of run_id={run_id} fence={fence} "
        wait_for(lambda: line in victim.text(), 15, "the stale commit to be refused")

    def _stop_until_reclaimed(self, r: redis.Redis) -> tuple[Proc, str, int] | None:
        """One try: None when no worker held a run once stopped, or none of its runs was
        claimed again within 10 s."""
        self.resume_due()
        free = [w for w in self.workers if w.pid not in self.paused and w.alive()]
        victim = next((w for w in free if held_by(r, w.pid)), None)
        if victim is None:
            return None
        try:
            held = stop_holding(r, victim)

            def reclaimed() -> tuple[Proc, str, int] | None:
                self.resume_due()
                fences = current_fences(r, list(held))
                return next(((victim, k, f) for k, f in held.items() if fences[k] > f), None)

            # 1 s leases: another worker reclaims within ~2 s
            found: tuple[Proc, str, int] | None = poll(reclaimed, 10, 0.02) if held else None
            return found
        finally:
            victim.popen.send_signal(signal.SIGCONT)

    def resume_due(self, everyone: bool = False) -> None:
        now = time.monotonic()
        for pid, (proc, at) in list(self.paused.items()):
            if everyone or now >= at:
                proc.popen.send_signal(signal.SIGCONT)
                del self.paused[pid]


@pytest.fixture
def aof_always(tmp_path: Path) -> Iterator[EmbeddedServer]:
    srv = EmbeddedServer(
        find_server_binary(), extra_args=("--appendonly", "yes", "--appendfsync", "always")
    ).start()
    yield srv
    srv.stop()


@pytest.fixture
def procs(aof_always: EmbeddedServer, tmp_path: Path) -> Iterator[Procs]:
    p = Procs(aof_always.url, tmp_path)
    yield p
    p.cleanup()


def current_fences(r: redis.Redis, run_ids: list[str]) -> dict[str, int]:
    pipe = r.pipeline(transaction=False)
    for run_id in run_ids:
        pipe.hget(PK.run(run_id), "fence")
    return {i: int(f or 0) for i, f in zip(run_ids, pipe.execute(), strict=True)}


def crash_restart(srv: EmbeddedServer) -> None:
    """restart(), but the server dies of SIGKILL: only what appendfsync always wrote is left."""
    assert srv.process is not None
    srv.process.terminate = srv.process.kill  # type: ignore[method-assign]
    restart(srv)


def restarted(srv: EmbeddedServer, how: Callable[[EmbeddedServer], None]) -> None:
    """``how(srv)``, tolerating the instant between the new server creating its socket file
    and listening on it, where restart()'s probe gets ECONNREFUSED; then wait for PING."""
    try:
        how(srv)
    except redis.exceptions.ConnectionError:
        probe = redis.Redis.from_url(srv.url, socket_timeout=5)
        wait_for(lambda: quietly(lambda: int(probe.ping())) == 1, 20, "the restarted server")
        probe.close()


def quietly(fn: Callable[[], int]) -> int:
    """The test's own reads during a server restart may fail: count them as 'not yet'."""
    try:
        return fn()
    except redis.exceptions.RedisError:
        return -1


def test_chaos_soak_every_run_done_once_and_every_fire_time_once(
    aof_always: EmbeddedServer, procs: Procs
) -> None:
    jq = client_for(aof_always.url)
    r = jq.redis
    chaos = Chaos(procs, random.Random(SEED))
    chaos.workers = [procs.worker(*WORKER_ARGS) for _ in range(N_WORKERS)]
    chaos.schedulers = [chaos.scheduler() for _ in range(N_SCHEDULERS)]

    # Recurring jobs: every second from a whole second 2 s ahead, N_FIRES fire times each.
    start_ms = (jq.server_time_ms() // 1000 + 2) * 1000
    fires = [start_ms + 1000 * k for k in range(N_FIRES)]
    expected: dict[str, list[str]] = {}
    for i in range(N_JOBS):
        job = f"soak-{i:02d}"
        jq.schedule(
            job, "chaos", every=1, args=[i], misfire="fire-all", max_attempts=20,
            start_at=start_ms / 1000, end_at=(fires[-1] + 500) / 1000,
        )  # fmt: skip
        expected[job] = fire_ids(job, fires, format_fire_instant)
    enqueued = [f"soak-run-{i:04d}" for i in range(N_RUNS)]
    jq.enqueue_many(
        Request("chaos", (i,), run_id=rid, delay=SPREAD_S * i / N_RUNS)
        for i, rid in enumerate(enqueued)
    )

    total = N_RUNS + N_JOBS * N_FIRES
    restarts_at = {4.0: restart, 9.0: crash_restart}
    began = time.monotonic()
    forced = False
    def chaos_goes_on() -> bool:
        elapsed = time.monotonic() - began
        enough = min(chaos.kills, chaos.pauses) >= MIN_FAULTS
        return elapsed < CHAOS_S or (not enough and elapsed < CHAOS_MAX_S)

    while chaos_goes_on():
        time.sleep(chaos.rng.uniform(0.2, 0.6))  # kept: the chaos's pace, a fault at a time
        chaos.resume_due()
        elapsed = time.monotonic() - began
        for at, how in list(restarts_at.items()):
            if elapsed >= at:
                restarted(aof_always, how)
                del restarts_at[at]
        if not forced and elapsed >= FORCED_AT_S:
            chaos.pause_until_reclaimed(r)
            forced = True
        chaos.strike()
    chaos.resume_due(everyone=True)
    assert not restarts_at and forced

    try:
        wait_for(lambda: quietly(lambda: int(r.zcard(PK.done))) >= total, FINISH_S, "all done")
    except AssertionError:
        # Say what is missing before failing: the checker's findings and the processes' logs.
        report = check(r, PK, enqueued, expected, Report())
        logs = "\n".join(f"--- {p.log.name}\n{p.text()[-1500:]}" for p in procs.started)
        raise AssertionError(f"{report.line()}\n{report.problems}\n{logs[-12000:]}") from None
    # Every process this test did not kill is still alive: none died of the faults.
    for proc in chaos.workers + chaos.schedulers:
        assert proc.alive(), proc.text()[-3000:]
    for proc in chaos.workers:
        assert stop_gracefully(proc, r) == 0, proc.text()[-3000:]
    for proc in chaos.schedulers:
        proc.popen.send_signal(signal.SIGTERM)
        try:
            code = proc.popen.wait(15)
        except subprocess.TimeoutExpired:
            proc.popen.send_signal(signal.SIGUSR1)  # its threads' stacks, into its log
            time.sleep(1)  # kept: a real process's time to write its stacks before the kill
            proc.popen.kill()
            raise AssertionError(f"scheduler hung after SIGTERM:\n{proc.text()[-6000:]}") from None
        assert code == 0, proc.text()[-3000:]

    report = check(
        r, PK, enqueued, expected, Report(kills=chaos.kills, pauses=chaos.pauses, restarts=2)
    )
    print("\n" + report.line())
    assert report.problems == []
    assert (report.duplicates, report.lost) == (0, 0)
    assert report.runs == total
    # The faults were real: processes died and stalled, and stalls cost stale commits (the
    # forced one at least, whatever the timing).
    assert chaos.kills >= MIN_FAULTS and chaos.pauses >= MIN_FAULTS
    assert report.rejected_stale_commits >= 1
