"""Worker daemons as real processes on a real Redis server (one private server per test).

Real server only: these tests kill, stop and restart processes, including the server itself,
which fakeredis (an in-process emulation) cannot stand for. Workers run
``python -m jobqueue.cli --redis-url URL worker --app chaos_app:jq`` with tests/apps on
PYTHONPATH. Every process started here is killed at teardown, pass or fail.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
from helpers import pid_alive, wait_for

from jobqueue.client.base import Request
from jobqueue.client.sync import JobQueue
from jobqueue.store.embedded import EmbeddedServer, find_server_binary
from jobqueue.store.keys import WORKERS_KEY, PartitionKeys
from jobqueue.store.scripts import scripts

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
APPS = Path(__file__).resolve().parent / "apps"
PK = PartitionKeys("default", 0)  # one partition: every run of these tests lives here


# -- processes -----------------------------------------------------------------------------


@dataclass
class Proc:
    popen: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def alive(self) -> bool:
        return self.popen.poll() is None


@dataclass
class Procs:
    """Starts worker processes and guarantees they are gone at teardown."""

    url: str
    logs: Path
    started: list[Proc] = field(default_factory=list)
    extra_pids: set[int] = field(default_factory=set)  # grandchildren (supervised workers)

    def worker(
        self,
        *args: str,
        session: bool = False,
        app: str = "chaos_app:jq",
        env: dict[str, str] | None = None,
    ) -> Proc:
        """A worker process of ``app``; one given ``env`` connects by itself (no --redis-url)."""
        log = self.logs / f"worker-{len(self.started)}.log"
        full_env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(APPS), str(ROOT)]),
            "PYTHONUNBUFFERED": "1",
            **(env or {}),
        }
        full_env.pop("JOBQUEUE_REDIS_URL", None)
        cmd = [sys.executable, "-m", "jobqueue.cli"]
        if env is None:
            cmd += ["--redis-url", self.url]
        cmd += ["worker", "--app", app, *args]
        with log.open("wb") as err:
            popen = subprocess.Popen(
                cmd,
                cwd=ROOT,
                env=full_env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                start_new_session=session,
            )
        proc = Proc(popen, log)
        self.started.append(proc)
        return proc

    def cleanup(self) -> None:
        for pid in self.extra_pids:
            _kill(pid)
        for proc in self.started:
            if proc.alive():
                _kill(proc.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(10)


def _kill(pid: int) -> None:
    for sig in (signal.SIGCONT, signal.SIGKILL):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return


def owner_pid(owner: str) -> int:
    """Worker ids are ``host:pid:random``."""
    return int(owner.rsplit(":", 2)[1])


def stopped(pid: int) -> bool:
    """The process is in the stopped state (T): a SIGSTOP is delivered asynchronously."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] == "T"


def held_by(r: redis.Redis, pid: int) -> dict[str, int]:
    """The runs the worker of ``pid`` holds (leased, its claim the current one): run id ->
    fence."""
    leased = r.zrange(PK.leases, 0, -1)
    pipe = r.pipeline(transaction=False)
    for run_id in leased:
        pipe.hmget(PK.run(run_id), "owner", "fence")
    return {
        run_id: int(fence)
        for run_id, (owner, fence) in zip(leased, pipe.execute(), strict=True)
        if owner and fence and owner_pid(owner) == pid
    }


def stop_holding(r: redis.Redis, proc: Proc) -> dict[str, int]:
    """SIGSTOP ``proc`` and read the runs it holds then (held_by). Once it is stopped (/proc
    says so) only what it had already sent can change them, a commit on the wire; the server
    has run that before it answers a call sent after (its reply waits for the end of the
    event loop's round, in which the stopped worker's socket was readable already): a PING,
    then the read."""
    proc.popen.send_signal(signal.SIGSTOP)
    wait_for(lambda: stopped(proc.pid), 5, f"worker {proc.pid} to stop")
    r.ping()
    return held_by(r, proc.pid)


# The chaos test's kills, at most: enough to reclaim runs from many killed workers, few
# enough that the workers also get to work on a loaded machine.
MAX_CHAOS_KILLS = 12


def kill_one(
    r: redis.Redis, live: list[Proc], rng: random.Random, *, holding: bool
) -> Proc | None:
    """SIGKILL one of ``live``, chosen by ``rng``. With ``holding``, one that holds runs (each
    stopped to look in ``rng``'s order, the others continued), so that the kill certainly
    leaves runs to reclaim, or None when none held a run (between runs, the work done): a
    kill at a random moment can hit a worker holding nothing, and a test whose kills all did
    proved nothing (seen: 'no kill hit a worker holding runs').
    Only a worker that runs (registered) is a candidate, or None when none does yet: on a
    loaded machine a replacement may take longer to start than the pause between kills, and
    kills of workers still starting left the fleet without one working (seen: no progress
    for 90 s, 76 workers in a row killed before they logged a line)."""
    running = registered_pids(r)
    live = [p for p in live if p.pid in running]
    if not live:
        return None
    if not holding:
        victim = live[rng.randrange(len(live))]
    else:
        victim = next((p for p in rng.sample(live, len(live)) if held_after_stop(r, p)), None)
        if victim is None:
            return None
    victim.popen.send_signal(signal.SIGKILL)
    victim.popen.wait(5)
    return victim


def held_after_stop(r: redis.Redis, proc: Proc) -> bool:
    """Whether ``proc`` holds runs once stopped (stop_holding); left stopped if it does."""
    if stop_holding(r, proc):
        return True
    proc.popen.send_signal(signal.SIGCONT)
    return False


# -- fixtures ------------------------------------------------------------------------------


@pytest.fixture
def server() -> Iterator[EmbeddedServer]:
    srv = EmbeddedServer(find_server_binary()).start()
    yield srv
    srv.stop()


@pytest.fixture
def aof_server() -> Iterator[EmbeddedServer]:
    srv = EmbeddedServer(
        find_server_binary(), extra_args=("--appendonly", "yes", "--appendfsync", "always")
    ).start()
    yield srv
    srv.stop()


def restart(srv: EmbeddedServer) -> None:
    """Stop the server process (SIGTERM: it syncs its AOF and exits) and start a new one on
    the same directory and socket. EmbeddedServer.stop() would delete the directory, so this
    stops the process by hand."""
    proc = srv.process
    assert proc is not None
    proc.terminate()
    proc.wait(10)
    if proc.stderr:
        proc.stderr.close()
    srv.process = None
    srv.socket.unlink(missing_ok=True)
    srv.start()
    # Until the AOF is loaded the server answers LOADING; the test's own client waits here.
    probe = redis.Redis.from_url(srv.url)

    def loaded() -> bool:
        try:
            return bool(probe.ping())
        # LOADING while it reads the AOF; refused in the moment between creating its socket
        # file and listening on it.
        except (redis.exceptions.BusyLoadingError, redis.exceptions.ConnectionError):
            return False

    wait_for(loaded, 20, "the restarted server to load its AOF")
    probe.close()


def client_for(url: str) -> JobQueue:
    jq = JobQueue(redis.Redis.from_url(url, decode_responses=True))
    # The tasks of tests/apps/chaos_app.py, by name and with the same options; their code is
    # only in the worker processes.
    jq.declare_task("chaos", max_attempts=20)
    jq.declare_task("stall")
    jq.declare_task("work", max_attempts=10)
    jq.declare_task("stuck_once")
    jq.declare_task("capped", max_attempts=20)
    jq.declare_task("keycapped", max_attempts=20)
    return jq


@pytest.fixture
def procs_factory(tmp_path: Path) -> Iterator[Callable[[str], Procs]]:
    made: list[Procs] = []

    def make(url: str) -> Procs:
        p = Procs(url, tmp_path)
        made.append(p)
        return p

    yield make
    for p in made:
        p.cleanup()


# -- reading runs in bulk ------------------------------------------------------------------


@dataclass
class RunView:
    run_id: str
    fields: dict[str, str]
    history: list[str]

    @property
    def state(self) -> str:
        return self.fields.get("state", "missing")

    @property
    def attempt(self) -> int:
        return int(self.fields.get("attempt", "0"))

    @property
    def fence(self) -> int:
        return int(self.fields.get("fence", "0"))

    @property
    def result(self) -> Any:
        return json.loads(self.fields["result"])

    def claim_owners(self) -> list[str]:
        """Every claim's owner in order: the earlier attempts' from the history entries that
        ended them (lease expired, released, failed), the last one's from the record."""
        ended = [h.split(" owner=", 1)[1].split(" ", 1)[0] for h in self.history if " owner=" in h]
        return [o.rstrip(":") for o in ended] + [self.fields["owner"]]

    def count(self, word: str) -> int:
        return sum(f" {word} " in f"{h} " for h in self.history)


def read_runs(r: redis.Redis, run_ids: list[str]) -> dict[str, RunView]:
    pipe = r.pipeline(transaction=False)
    for run_id in run_ids:
        pipe.hgetall(PK.run(run_id))
        pipe.lrange(PK.history(run_id), 0, -1)
    replies = pipe.execute()
    return {
        run_id: RunView(run_id, replies[2 * i], replies[2 * i + 1])
        for i, run_id in enumerate(run_ids)
    }


def done_count(r: redis.Redis) -> int:
    return int(r.zcard(PK.done))


def registered_pids(r: redis.Redis) -> set[int]:
    return {json.loads(v)["pid"] for v in r.hvals(WORKERS_KEY)}


def stop_gracefully(proc: Proc, r: redis.Redis, timeout: float = 15.0) -> int:
    """SIGTERM once the worker runs (registered): a process still importing has no handler
    yet and would die of the signal, harmlessly but not with exit code 0."""
    wait_for(lambda: proc.pid in registered_pids(r) or not proc.alive(), 20, "registration")
    proc.popen.send_signal(signal.SIGTERM)
    return proc.popen.wait(timeout)


# -- the tests -----------------------------------------------------------------------------


def test_sigkill_chaos_every_run_done_once_and_every_effect_applied_once(
    server: EmbeddedServer, procs_factory: Callable[[str], Procs]
) -> None:
    """3 workers, 2,000 runs sleeping 0-50 ms with a fenced, idempotent side effect; a random
    worker is SIGKILLed every 0.5 s and replaced, the first one among those holding runs.

    What at-least-once execution with fencing guarantees, and what is asserted:
    - exactly one accepted commit per run (state done, stats.completed = N),
      made by the holder of the run's last fence;
    - the fenced resource holds the committing attempt's write (a killed attempt's write, if
      it got that far, was overwritten by the newer fence, never the other way round);
    - the effect keyed by run id is applied exactly once; the executions counter shows where
      the code really ran twice, which may only happen for a run reclaimed from a killed
      worker;
    - attempt > 1 only where every earlier claim's owner was killed by this test.
    """
    n_runs, n_workers = 2000, 3
    worker_args = ("--concurrency", "4", "--lease", "2", "--grace", "1")
    procs = procs_factory(server.url)
    jq = client_for(server.url)
    r = jq.redis
    rng = random.Random(20601)
    live = [procs.worker(*worker_args) for _ in range(n_workers)]
    run_ids = [f"chaos-{i:04d}" for i in range(n_runs)]
    jq.enqueue_many(Request("chaos", (i,), run_id=run_ids[i]) for i in range(n_runs))

    killed: set[int] = set()
    deadline = time.monotonic() + 60
    while done_count(r) < n_runs:
        assert time.monotonic() < deadline, f"only {done_count(r)} of {n_runs} runs done"
        time.sleep(0.5)  # kept: the chaos's pace, a kill every 0.5 s
        if done_count(r) >= n_runs:
            break
        if len(killed) >= MAX_CHAOS_KILLS:
            continue  # (bounded: on a loaded machine, kills every 0.5 s left workers starting)
        # The first kill hits a worker holding runs, for certain; the others, any worker.
        victim = kill_one(r, live, rng, holding=not killed)
        if victim is None:
            continue
        live.remove(victim)
        killed.add(victim.pid)
        live.append(procs.worker(*worker_args))

    for proc in live:
        assert stop_gracefully(proc, r) == 0, proc.text()[-2000:]

    runs = read_runs(r, run_ids)
    resources = r.pipeline(transaction=False)
    for run_id in run_ids:
        resources.hgetall(PK.fence_resource(f"chaos:{run_id}"))
    fenced = dict(zip(run_ids, resources.execute(), strict=True))
    effects = r.hgetall("chaos:effects")
    executions = {k: int(v) for k, v in r.hgetall("chaos:executions").items()}
    stats = r.hgetall(PK.stats)

    # Every run done, exactly one accepted commit each, nothing left in any index.
    assert {v.state for v in runs.values()} == {"done"}
    assert int(stats["completed"]) == n_runs
    assert r.zcard(PK.leases) == r.zcard(PK.due) == r.zcard(PK.dead) == 0
    for v in runs.values():
        # The commit came from the last claim, with the run's current fence.
        assert v.result["fence"] == v.fence
        assert v.result["pid"] == owner_pid(v.claim_owners()[-1])
        # The fenced resource holds that attempt's write.
        assert int(fenced[v.run_id]["fence"]) == v.fence
        assert json.loads(fenced[v.run_id]["value"]) == v.result

    # The idempotent effect: applied exactly once per run.
    assert r.scard("chaos:applied") == n_runs
    assert set(effects) == set(run_ids) and set(effects.values()) == {"1"}

    # Reclaims only where a killed worker held the run.
    reclaimed = [v for v in runs.values() if v.attempt > 1]
    for v in runs.values():
        owners = v.claim_owners()
        assert len(owners) == v.attempt, v.history  # no release here: claims == attempts
        assert all(owner_pid(o) in killed for o in owners[:-1]), (v.history, killed)
        assert v.count("expired") == v.attempt - 1, v.history
        assert executions[v.run_id] <= v.attempt
        if executions[v.run_id] > 1:
            assert v.attempt > 1

    assert len(killed) >= 5
    assert reclaimed, "no kill hit a worker holding runs: the test proved nothing"
    print(
        f"\nchaos: runs={n_runs} kills={len(killed)} reclaimed_runs={len(reclaimed)} "
        f"lease_expiries={stats.get('lease_expired', 0)} "
        f"rejected_commits={stats.get('rejected', 0)} "
        f"double_executions={sum(1 for c in executions.values() if c > 1)} "
        f"max_attempt={max(v.attempt for v in runs.values())}"
    )


def test_a_concurrency_limit_of_3_holds_under_4_workers_and_sigkills(
    server: EmbeddedServer, procs_factory: Callable[[str], Procs]
) -> None:
    """4 workers of 4 slots each, a limit of 3 on the queue, 150 runs of 50-200 ms; a random
    worker is SIGKILLed every 0.7 s and replaced, the first one among those holding runs. The
    runs themselves count how many of them are in progress (tests/apps/chaos_app.py: capped):
    never more than 3, and 3 is reached; every run ends done, so no slot leaked (a killed
    worker's slots come back when its leases expire)."""
    n_runs = 150
    worker_args = ("--concurrency", "4", "--lease", "2", "--grace", "1")
    procs = procs_factory(server.url)
    jq = client_for(server.url)
    r = jq.redis
    jq.set_queue_concurrency("default", 3)
    rng = random.Random(2103)
    live = [procs.worker(*worker_args) for _ in range(4)]
    run_ids = [f"capped-{i:04d}" for i in range(n_runs)]
    jq.enqueue_many(Request("capped", (0.05, 0.2), run_id=run_id) for run_id in run_ids)

    kills = 0
    deadline = time.monotonic() + 90
    while done_count(r) < n_runs:
        assert time.monotonic() < deadline, f"only {done_count(r)} of {n_runs} runs done"
        time.sleep(0.7)  # kept: the chaos's pace, a kill every 0.7 s
        if done_count(r) >= n_runs:
            break
        # The first kill hits a worker holding runs, for certain; the others, any worker.
        victim = kill_one(r, live, rng, holding=not kills)
        if victim is None:
            continue
        live.remove(victim)
        kills += 1
        live.append(procs.worker(*worker_args))
    for proc in live:
        assert stop_gracefully(proc, r) == 0, proc.text()[-2000:]

    runs = read_runs(r, run_ids)
    assert {v.state for v in runs.values()} == {"done"}
    assert int(r.get("capped:most")) == 3
    reclaimed = sum(v.attempt > 1 for v in runs.values())
    assert kills >= 5
    assert reclaimed, "no kill hit a worker holding runs: the test proved nothing"
    print(f"\ncapped: runs={n_runs} kills={kills} reclaimed={reclaimed}")


def test_a_key_cap_of_2_holds_under_4_workers_and_sigkills(
    server: EmbeddedServer, procs_factory: Callable[[str], Procs]
) -> None:
    """4 workers of 4 slots each, a per-key cap of 2 on the queue, 60 runs of key 'hot' and
    20 of key 'cold' (50-150 ms each); a random worker is SIGKILLed every 0.7 s and replaced,
    the first one among those holding runs.
    The runs count how many of their key are in progress (tests/apps/chaos_app.py:
    keycapped): never more than 2 of a key, and 2 is reached; every run ends done, so no slot
    leaked (a killed worker's slots come back when a claim takes its expired lease back or
    buries it)."""
    n_hot, n_cold = 60, 20
    worker_args = ("--concurrency", "4", "--lease", "2", "--grace", "1")
    procs = procs_factory(server.url)
    jq = client_for(server.url)
    r = jq.redis
    jq.set_queue_concurrency("default", 2, per_key=True)
    rng = random.Random(2104)
    live = [procs.worker(*worker_args) for _ in range(4)]
    keys = ["hot"] * n_hot + ["cold"] * n_cold
    rng.shuffle(keys)
    run_ids = [f"keycapped-{i:04d}" for i in range(len(keys))]
    jq.enqueue_many(
        Request("keycapped", (key, 0.05, 0.15), run_id=run_id, limit_key=key)
        for run_id, key in zip(run_ids, keys, strict=True)
    )

    kills = 0
    deadline = time.monotonic() + 40
    while done_count(r) < len(run_ids):
        assert time.monotonic() < deadline, f"only {done_count(r)} of {len(run_ids)} runs done"
        time.sleep(0.7)  # kept: the chaos's pace, a kill every 0.7 s
        if done_count(r) >= len(run_ids) or kills >= 8:
            # Bounded: kills without end on a loaded machine (each costing the hot key's two
            # slots a lease) starved the rest past the deadline (78 of 80 done at load 11).
            continue
        # The first kill hits a worker holding runs, for certain; the others, any worker.
        victim = kill_one(r, live, rng, holding=not kills)
        if victim is None:
            continue
        live.remove(victim)
        kills += 1
        live.append(procs.worker(*worker_args))
    for proc in live:
        assert stop_gracefully(proc, r) == 0, proc.text()[-2000:]

    runs = read_runs(r, run_ids)
    assert {v.state for v in runs.values()} == {"done"}
    assert int(r.get("keycapped:most:hot")) == 2
    assert int(r.get("keycapped:most:cold")) <= 2
    reclaimed = sum(v.attempt > 1 for v in runs.values())
    assert kills >= 4
    assert reclaimed, "no kill hit a worker holding runs: the test proved nothing"
    print(f"\nkeycapped: runs={len(run_ids)} kills={kills} reclaimed={reclaimed}")


def test_a_rate_limit_of_50_per_second_holds_over_20_seconds_under_2_workers(
    server: EmbeddedServer, procs_factory: Callable[[str], Procs]
) -> None:
    """2 workers of 8 slots, a limit of 50 claims per second on the queue, 1,000 short runs
    (about 20 s). Each run's `started` is its claim time on the server clock, the one the
    limit counts by: in no window of 1,000 ms do more than 50 start (exact), and the workers
    keep up with the limit: 40 per second or more on average (the tolerance: a worker idle
    while the window is full sleeps until the window's oldest claim leaves it)."""
    n_runs = 1_000
    procs = procs_factory(server.url)
    jq = client_for(server.url)
    r = jq.redis
    jq.set_queue_rate("default", 50, per=1)
    run_ids = [f"rated-{i:04d}" for i in range(n_runs)]
    jq.enqueue_many(Request("work", (0, 0.005), run_id=run_id) for run_id in run_ids)
    live = [procs.worker("--concurrency", "8", "--lease", "5") for _ in range(2)]
    wait_for(lambda: done_count(r) >= n_runs, 60,
             lambda: f"{n_runs} runs done (only {done_count(r)})", interval=0.5)
    for proc in live:
        assert stop_gracefully(proc, r) == 0, proc.text()[-2000:]

    runs = read_runs(r, run_ids)
    assert {v.attempt for v in runs.values()} == {1}
    starts = sorted(int(v.fields["started"]) for v in runs.values())
    busiest = max(
        bisect.bisect_left(starts, t + 1_000) - i for i, t in enumerate(starts)
    )  # starts in [t, t + 1000) for each start t
    assert busiest == 50
    per_second = (n_runs - 50) * 1000 / (starts[-1] - starts[0])
    assert 40 <= per_second <= 50.1, per_second
    print(f"\nrated: busiest 1 s window {busiest}, average {per_second:.1f}/s")


def test_sigstopped_worker_is_fenced_out_and_the_second_workers_result_stands(
    server: EmbeddedServer, procs_factory: Callable[[str], Procs]
) -> None:
    procs = procs_factory(server.url)
    jq = client_for(server.url)
    args = ("--concurrency", "1", "--lease", "1", "--grace", "1")
    first = procs.worker(*args)
    jq.enqueue(jq.resolve_task("stall").with_options(run_id="stalled"), 1.5)

    def held_by_first() -> bool:
        run = jq.get_run("stalled")
        return run.state == "running" and owner_pid(run.owner or "x:0:x") == first.pid

    wait_for(held_by_first, 15, "the first worker to hold the run")
    first_fence = jq.get_run("stalled").fence
    first.popen.send_signal(signal.SIGSTOP)
    try:
        second = procs.worker(*args)
        run = wait_for(
            lambda: (x := jq.get_run("stalled")).finished and x, 15, "the second to finish"
        )
    finally:
        first.popen.send_signal(signal.SIGCONT)
    assert (run.state, run.attempt) == ("done", 2) and run.fence > first_fence
    assert run.result == {"fence": run.fence, "pid": second.pid, "wrote": True}

    line = f"fenced out: commit of run_id=stalled fence={first_fence} attempt=1 refused (fenced"
    wait_for(lambda: line in first.text(), 15, "the first worker to log its refused commit")

    after = jq.get_run("stalled")
    assert (after.state, after.fence, after.result) == ("done", run.fence, run.result)
    assert int(jq.redis.hget(PK.stats, "completed") or 0) == 1  # one commit accepted
    resource = jq.redis.hgetall(PK.fence_resource("stall:stalled"))
    assert (int(resource["fence"]), json.loads(resource["value"])["pid"]) == (
        run.fence, second.pid
    )
    assert int(jq.redis.hget(PK.stats, "rejected") or 0) >= 1
    assert stop_gracefully(first, jq.redis) == 0
    assert stop_gracefully(second, jq.redis) == 0


def test_sigterm_under_load_releases_without_counting_attempts_and_loses_nothing(
    server: EmbeddedServer, procs_factory: Callable[[str], Procs]
) -> None:
    """The draining worker also holds runs stuck in code that ignores cancellation: it must
    still exit 0 promptly after the grace period (those runs released, not waited for)."""
    procs = procs_factory(server.url)
    jq = client_for(server.url)
    args = ("--concurrency", "8", "--lease", "5", "--grace", "0.3")
    draining = procs.worker(*args)
    # Three runs that cannot end within the grace (their first execution sleeps 120 s): three
    # releases for certain. (Before, one, and the rest left to runs of 1.0-1.5 s ending past
    # the grace by chance.)
    stuck = ["stuck", "stuck-2", "stuck-3"]
    for run_id in stuck:
        jq.enqueue(jq.resolve_task("stuck_once").with_options(run_id=run_id))
    wait_for(
        lambda: all(jq.get_run(r).state == "running" for r in stuck), 15, "the stuck runs to start"
    )
    # Runs of 1.0-1.5 s, ~5 of them in flight at the signal: released too unless they end
    # within the grace.
    handles = jq.enqueue_many(Request("work", (1.0, 1.5)) for _ in range(60))
    run_ids = [*stuck, *(h.run_id for h in handles)]
    other = procs.worker(*args)
    wait_for(lambda: done_count(jq.redis) >= 10, 15, "work to be under way")

    sent = time.monotonic()
    draining.popen.send_signal(signal.SIGTERM)
    assert draining.popen.wait(10) == 0, draining.text()[-2000:]
    exit_s = time.monotonic() - sent
    assert exit_s < 5, f"drain took {exit_s:.1f}s with a 0.3s grace"
    assert "released run_id=stuck" in draining.text()

    wait_for(lambda: done_count(jq.redis) >= len(run_ids), 30, "every run to be done")
    assert stop_gracefully(other, jq.redis) == 0

    runs = read_runs(jq.redis, run_ids)
    assert {v.state for v in runs.values()} == {"done"}
    released = [v for v in runs.values() if v.count("released")]
    assert all(runs[r] in released for r in stuck)
    assert len(released) >= 3  # the stuck runs, and runs in flight past the 0.3 s grace
    for v in released:
        # Released attempts are not counted: attempt = claims - releases, here 1.
        assert len(v.claim_owners()) - v.count("released") == v.attempt == 1, v.history
        assert v.count("expired") == 0, v.history
        assert v.result == other.pid
    assert all(v.attempt == 1 for v in runs.values())
    print(f"\ngraceful: runs={len(run_ids)} released={len(released)} exit_s={exit_s:.2f}")


def test_redis_restart_with_aof_under_load_workers_recover_and_no_run_is_lost(
    aof_server: EmbeddedServer, procs_factory: Callable[[str], Procs]
) -> None:
    procs = procs_factory(aof_server.url)
    jq = client_for(aof_server.url)
    args = ("--concurrency", "4", "--lease", "5", "--grace", "1")
    workers = [procs.worker(*args) for _ in range(2)]
    n_runs = 1500
    run_ids = [f"r-{i:04d}" for i in range(n_runs)]
    jq.enqueue_many(Request("work", (0.005, 0.015), run_id=run_ids[i]) for i in range(n_runs))
    wait_for(lambda: done_count(jq.redis) >= 200, 20, "work to be under way")

    before = done_count(jq.redis)
    restart(aof_server)
    restarted_ms = jq.server_time_ms()  # the client reconnects on its own
    assert done_count(jq.redis) >= before  # the AOF kept what was done

    wait_for(lambda: done_count(jq.redis) >= n_runs, 40, "every run to be done")
    assert all(w.alive() for w in workers), [w.text()[-2000:] for w in workers]
    # The new server started with no scripts; only the workers call claim: they met NOSCRIPT
    # and loaded it again.
    assert jq.redis.script_exists(scripts()["claim"].sha) == [True]
    # They saw the outage (and carried on): a warning, not a crash.
    logs = [w.text() for w in workers]
    assert any("WARNING" in t and ("failed" in t or "unavailable" in t) for t in logs), logs
    assert not any("Traceback" in t for t in logs), logs
    runs = read_runs(jq.redis, run_ids)
    assert {v.state for v in runs.values()} == {"done"}
    finished_after = sum(int(v.fields["finished"]) > restarted_ms for v in runs.values())
    assert finished_after > 0
    assert jq.redis.zcard(PK.leases) == jq.redis.zcard(PK.due) == 0
    for w in workers:
        assert stop_gracefully(w, jq.redis) == 0, w.text()[-2000:]
    print(
        f"\nrestart: runs={n_runs} done_before_restart={before} "
        f"finished_after_restart={finished_after} "
        f"max_attempt={max(v.attempt for v in runs.values())}"
    )


@pytest.fixture
def everysec_server() -> Iterator[EmbeddedServer]:
    """The compose file's (and most production's) setting: a crash loses up to ~1 s."""
    srv = EmbeddedServer(
        find_server_binary(), extra_args=("--appendonly", "yes", "--appendfsync", "everysec")
    ).start()
    yield srv
    srv.stop()


def newest_aof_increment(srv: EmbeddedServer) -> Path:
    """The AOF file that takes the server's writes now (Redis 7's appendonlydir layout)."""
    return sorted((srv.directory / "appendonlydir").glob("*.incr.aof"))[-1]


def crash_and_restart(srv: EmbeddedServer, synced: tuple[Path, int] | None = None) -> None:
    """SIGKILL (what a crashed machine looks like: no final fsync), then start again from
    the AOF as it was on disk. A SIGKILLed process loses nothing the kernel already holds, so
    ``synced`` (a file and its size at some earlier moment) cuts the AOF back to that moment:
    the writes after it are lost for certain, as a crashed machine loses its unsynced tail."""
    proc = srv.process
    assert proc is not None
    proc.kill()
    proc.wait(10)
    if proc.stderr:
        proc.stderr.close()
    if synced is not None:
        path, size = synced
        os.truncate(path, size)  # mid-command is fine: aof-load-truncated drops the torn tail
    srv.process = None
    srv.socket.unlink(missing_ok=True)
    srv.start()
    probe = redis.Redis.from_url(srv.url)

    def loaded() -> bool:
        try:
            return bool(probe.ping())
        except (redis.exceptions.BusyLoadingError, redis.exceptions.ConnectionError):
            return False

    wait_for(loaded, 20, "the restarted server to load its AOF")
    probe.close()


def test_a_redis_crash_that_loses_its_last_second_loses_no_run_and_reuses_no_fence(
    everysec_server: EmbeddedServer, procs_factory: Callable[[str], Procs]
) -> None:
    """appendfsync everysec, Redis SIGKILLed under load: the claims, commits and fenced
    writes of its last second are gone, while the workers that made them live on. The
    restarted server's fences are above the lost ones (its clock moved on), so a worker that
    still holds a lost fence is refused, and its work is redone by the new holder: every run
    done once, its commit and its fenced write from the holder of its last fence."""
    procs = procs_factory(everysec_server.url)
    jq = client_for(everysec_server.url)
    r = jq.redis
    workers = [procs.worker("--concurrency", "4", "--lease", "3", "--grace", "1")
               for _ in range(2)]
    n_runs = 1200
    run_ids = [f"crash-{i:04d}" for i in range(n_runs)]
    jq.enqueue_many(Request("chaos", (i,), run_id=run_ids[i]) for i in range(n_runs))
    wait_for(lambda: done_count(r) >= 150, 30, "work to be under way")
    # The moment the disk holds: everything written after it is lost by the crash. Runs seen
    # done only after it had their completions (and claims) written past it.
    aof = newest_aof_increment(everysec_server)
    cut = (aof, aof.stat().st_size)
    done_at_cut = set(r.zrange(PK.done, 0, -1))
    wait_for(lambda: done_count(r) >= len(done_at_cut) + 100, 30, "work past the cut")
    before_crash = read_runs(r, run_ids)
    lost = [v for v in before_crash.values() if v.state == "done" and v.run_id not in done_at_cut]
    crash_and_restart(everysec_server, synced=cut)
    wait_for(lambda: done_count(r) >= n_runs, 60, "every run to be done")

    runs = read_runs(r, run_ids)
    pipe = r.pipeline(transaction=False)
    for run_id in run_ids:
        pipe.hgetall(PK.fence_resource(f"chaos:{run_id}"))
    fenced = dict(zip(run_ids, pipe.execute(), strict=True))
    assert {v.state for v in runs.values()} == {"done"}
    # Each run whose completion the crash lost is done again by a claim whose fence is above
    # the forgotten one, never equal to it; the exceptions, a commit whose reply the crash
    # cut (at most one per worker slot), are resent by their holder under the same fence.
    assert len(lost) >= 100
    redone = [g for g in lost if runs[g.run_id].fence > g.fence]
    resent = [g for g in lost if runs[g.run_id].fence == g.fence]
    assert len(redone) + len(resent) == len(lost)
    assert len(resent) <= 8 and all(runs[g.run_id].result == g.result for g in resent)
    for v in runs.values():
        assert v.result["fence"] == v.fence  # committed by the holder of the last fence...
        assert v.result["pid"] == owner_pid(v.fields["owner"])  # ...that very worker
        assert int(fenced[v.run_id]["fence"]) == v.fence
        assert json.loads(fenced[v.run_id]["value"]) == v.result
    assert r.scard("chaos:applied") == n_runs
    assert set(r.hvals("chaos:effects")) == {"1"}
    for w in workers:
        assert w.alive(), w.text()[-2000:]
        assert stop_gracefully(w, r) == 0, w.text()[-2000:]


def test_supervisor_restarts_a_sigkilled_child_and_drains_on_ctrl_c(
    server: EmbeddedServer, procs_factory: Callable[[str], Procs]
) -> None:
    procs = procs_factory(server.url)
    jq = client_for(server.url)
    r = jq.redis
    # Own session, so that a "Ctrl-C" can go to its whole process group as a terminal's would.
    supervisor = procs.worker("--processes", "2", "--lease", "2", "--grace", "1", session=True)

    def live_children() -> set[int]:
        alive = {p for p in registered_pids(r) if pid_alive(p)}
        procs.extra_pids |= alive
        return alive

    children = wait_for(lambda: len(x := live_children()) == 2 and x, 20, "two workers")
    assert supervisor.pid not in children
    victim = sorted(children)[0]
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: len(x := live_children()) == 2 and victim not in x, 20, "a replacement worker")
    handles = jq.enqueue_many(Request("work", (0.0, 0.01)) for _ in range(20))
    wait_for(lambda: done_count(r) >= len(handles), 20, "runs done by the new set of workers")
    assert "restarting" in supervisor.text()

    survivors = live_children()
    os.killpg(supervisor.pid, signal.SIGINT)  # what Ctrl-C at a terminal does
    assert supervisor.popen.wait(20) == 0, supervisor.text()[-3000:]
    assert not any(pid_alive(p) for p in survivors)
    assert "second signal: exiting at once" not in supervisor.text()


def test_a_worker_with_runs_due_never_waits_on_the_wake_list(
    server: EmbeddedServer, procs_factory: Callable[[str], Procs]
) -> None:
    """A burst of due runs, a Redis slow to take commits, the default concurrency: the worker
    sleeps on the wake lists only once a claim found nothing, never while runs are due. Seen
    before: outcomes awaiting their commit filled the worker's room during the short batching
    wait; it then asked for 0 runs and slept 2 s on the wake list with hundreds due. MONITOR
    shows every BLPOP; none may come before the last run was claimed (its record's 'started',
    on the same server clock), since every run was due before the worker started."""
    procs = procs_factory(server.url)
    jq = client_for(server.url)
    jq.declare_task("brief")
    n_runs = 600
    handles = jq.enqueue_many(Request("brief", (4.0,)) for _ in range(n_runs))
    blpops: list[float] = []
    monitor = redis.Redis.from_url(server.url).monitor()
    monitor.__enter__()

    def watch() -> None:
        with contextlib.suppress(Exception):  # ends when the test closes the connection
            while True:
                command = monitor.next_command()
                if command["command"].upper().startswith("BLPOP"):
                    blpops.append(float(command["time"]))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    procs.worker(
        "--concurrency", "8", app="slow_commit_app:jq", env={"SLOW_COMMIT_URL": server.url}
    )
    wait_for(lambda: done_count(jq.redis) == n_runs, 120, f"{n_runs} runs done")
    monitor.connection.disconnect()
    watcher.join(5)
    runs = read_runs(jq.redis, [h.run_id for h in handles])
    last_claim_s = max(int(v.fields["started"]) for v in runs.values()) / 1000
    early = [t for t in blpops if t < last_claim_s]
    assert early == [], (
        f"{len(early)} waits on the wake list while runs were due "
        f"(the first {last_claim_s - early[0]:.3f} s before the last claim)"
    )


def test_a_sigkilled_worker_is_pruned_from_the_registry_by_a_live_one(
    server: EmbeddedServer, procs_factory: Callable[[str], Procs]
) -> None:
    """Killed, a worker never withdraws its entry: it shows STALE after 3 missed heartbeats
    and a live worker prunes it after 10 (a lease of 0.6 s: a beat every 0.2 s)."""
    procs = procs_factory(server.url)
    r = redis.Redis.from_url(server.url, decode_responses=True)
    victim = procs.worker("--lease", "0.6")
    wait_for(lambda: victim.pid in registered_pids(r), 20, "the victim's registration")
    victim.popen.send_signal(signal.SIGKILL)
    victim.popen.wait(5)
    assert victim.pid in registered_pids(r)
    survivor = procs.worker("--lease", "0.6")
    wait_for(lambda: victim.pid not in registered_pids(r), 20, "the victim's entry pruned")
    assert survivor.pid in registered_pids(r)
    assert stop_gracefully(survivor, r) == 0


# -- recycling children (--max-runs-per-child, --max-memory-per-child) -----------------------

RECYCLE_APP = "recycle_app:jq"  # tests/apps/recycle_app.py
RECYCLED_LINE = "recycled worker pid "


def recycle_client(url: str) -> JobQueue:
    jq = JobQueue(redis.Redis.from_url(url, decode_responses=True))
    jq.declare_task("record", max_attempts=5)
    jq.declare_task("leak", max_attempts=5)
    return jq


def recycles(supervisor: Proc) -> list[str]:
    """The supervisor's INFO lines, one per recycled child."""
    return [line for line in supervisor.text().splitlines() if RECYCLED_LINE in line]


def executions(r: redis.Redis) -> dict[str, int]:
    return {k: int(v) for k, v in r.hgetall("recycle:executions").items()}


def child_pids(r: redis.Redis, procs: Procs) -> set[int]:
    """Every child that ran a run (and every one registered now), noted for the teardown."""
    pids = {int(p) for p in r.smembers("recycle:pids")} | registered_pids(r)
    procs.extra_pids |= pids
    return pids


def stop_supervisor(supervisor: Proc, r: redis.Redis, procs: Procs, timeout: float = 30) -> int:
    child_pids(r, procs)
    supervisor.popen.send_signal(signal.SIGTERM)
    return supervisor.popen.wait(timeout)


def test_max_runs_per_child_under_load_recycles_children_and_runs_every_run_exactly_once(
    server: EmbeddedServer, procs_factory: Callable[[str], Procs]
) -> None:
    """--processes 2 --max-runs-per-child 50, 1,000 short runs each counting its executions
    by run id: every run done exactly once (a recycled child drains and commits its runs, it
    never leaves one to a lease expiry), each child stopped claiming near 50, and the
    supervisor replaced children many times, never with the back-off of a crash."""
    n_runs, per_child, concurrency = 1000, 50, 4
    procs = procs_factory(server.url)
    jq = recycle_client(server.url)
    r = jq.redis
    run_ids = [f"rec-{i:04d}" for i in range(n_runs)]
    jq.enqueue_many(Request("record", (), run_id=run_id) for run_id in run_ids)
    started = time.monotonic()
    supervisor = procs.worker(
        "--processes", "2", "--max-runs-per-child", str(per_child),
        "--concurrency", str(concurrency), "--lease", "5", "--grace", "10", app=RECYCLE_APP,
    )
    wait_for(lambda: done_count(r) >= n_runs or not supervisor.alive(), 180, "every run done")
    took = time.monotonic() - started
    assert supervisor.alive(), supervisor.text()[-3000:]
    pids = child_pids(r, procs)
    assert stop_supervisor(supervisor, r, procs) == 0, supervisor.text()[-3000:]

    counted = executions(r)
    assert len(counted) == n_runs and set(counted.values()) == {1}  # none lost, none twice
    runs = read_runs(r, run_ids)
    assert {v.state for v in runs.values()} == {"done"}
    assert {v.attempt for v in runs.values()} == {1}  # no lease expired, no release
    per_pid: dict[int, int] = {}
    for v in runs.values():
        per_pid[v.result] = per_pid.get(v.result, 0) + 1
    # A child stops claiming once 50 runs are answered: what it held then still finishes
    # (running, or awaiting its commit: up to twice the concurrency).
    assert max(per_pid.values()) <= per_child + 3 * concurrency, per_pid
    lines = recycles(supervisor)
    assert len(lines) >= 10, supervisor.text()[-3000:]
    assert all(f"runs done (max {per_child} per child); RSS " in line for line in lines), lines
    assert "restarting in" not in supervisor.text()  # no crash, no back-off
    print(
        f"\nrecycle: runs={n_runs} processes=2 max_runs_per_child={per_child} "
        f"took={took:.1f}s recycles={len(lines)} children={len(pids)} "
        f"runs_per_child min={min(per_pid.values())} max={max(per_pid.values())}"
    )


def test_max_memory_per_child_recycles_a_leaking_child_and_every_run_is_done(
    server: EmbeddedServer, procs_factory: Callable[[str], Procs]
) -> None:
    """A task that keeps 8 MB more each run; --max-memory-per-child 160 without --processes
    (one supervised child): children are recycled once their RSS passes 160 MB, every run
    done once."""
    n_runs, leak_mb, max_mb = 60, 8, 160
    procs = procs_factory(server.url)
    jq = recycle_client(server.url)
    r = jq.redis
    run_ids = [f"leak-{i:02d}" for i in range(n_runs)]
    jq.enqueue_many(Request("leak", (leak_mb,), run_id=run_id) for run_id in run_ids)
    started = time.monotonic()
    supervisor = procs.worker(
        "--max-memory-per-child", str(max_mb), "--concurrency", "2", "--lease", "5",
        app=RECYCLE_APP,
    )
    wait_for(lambda: done_count(r) >= n_runs or not supervisor.alive(), 120, "every run done")
    took = time.monotonic() - started
    assert supervisor.alive(), supervisor.text()[-3000:]
    assert stop_supervisor(supervisor, r, procs) == 0, supervisor.text()[-3000:]

    counted = executions(r)
    assert len(counted) == n_runs and set(counted.values()) == {1}
    runs = read_runs(r, run_ids)
    assert {v.state for v in runs.values()} == {"done"}
    kept = max(v.result["kept_mb"] for v in runs.values())
    assert kept < 2 * max_mb  # no child went on far past the limit
    lines = recycles(supervisor)
    assert len(lines) >= 2, supervisor.text()[-3000:]
    assert all(f"over the max of {max_mb} MB per child" in line for line in lines), lines
    assert "restarting in" not in supervisor.text()
    print(
        f"\nrecycle (memory): runs={n_runs} leak={leak_mb}MB/run max={max_mb}MB "
        f"took={took:.1f}s recycles={len(lines)} most_kept_by_a_child={kept}MB"
    )


def test_a_recycled_child_is_replaced_at_once_a_sigkilled_one_after_the_crash_back_off(
    server: EmbeddedServer, procs_factory: Callable[[str], Procs]
) -> None:
    """Exit code 5 (recycled) and a death by SIGKILL take different paths in the supervisor:
    the first is replaced without a pause and is no crash (the back-off is untouched), the
    second is logged as a crash and replaced after the back-off."""
    procs = procs_factory(server.url)
    jq = recycle_client(server.url)
    r = jq.redis
    supervisor = procs.worker(
        "--max-runs-per-child", "5", "--concurrency", "1", "--lease", "2", "--grace", "1",
        app=RECYCLE_APP,
    )
    first = wait_for(lambda: registered_pids(r), 20, "the first child")
    jq.enqueue_many(Request("record", (), run_id=f"first-{i}") for i in range(5))
    wait_for(lambda: recycles(supervisor), 30, "the first child to recycle")
    line = recycles(supervisor)[0]
    (first_pid,) = first
    assert f"{RECYCLED_LINE}{first_pid} (5 runs done (max 5 per child)" in line, line
    second = wait_for(
        lambda: (x := {p for p in registered_pids(r) if pid_alive(p)} - first) and x,
        20,
        "the replacement",
    )
    (second_pid,) = second
    assert f"started worker pid {second_pid} (recycles: 1)" in line
    assert "restarting in" not in supervisor.text()
    procs.extra_pids |= first | second

    os.kill(second_pid, signal.SIGKILL)
    third = wait_for(
        lambda: (x := {p for p in registered_pids(r) if pid_alive(p)} - first - second) and x,
        20,
        "the crashed child's replacement",
    )
    procs.extra_pids |= third
    text = supervisor.text()
    assert f"worker pid {second_pid} exited with -9; restarting in 0.5s" in text, text[-3000:]
    assert len(recycles(supervisor)) == 1  # the crash is not counted as a recycle
    jq.enqueue_many(Request("record", (), run_id=f"then-{i}") for i in range(3))
    wait_for(lambda: done_count(r) >= 8, 20, "the runs enqueued after the crash, done")
    assert set(executions(r).values()) == {1}
    assert stop_supervisor(supervisor, r, procs) == 0, supervisor.text()[-3000:]


def test_a_supervised_child_sigkilled_holding_runs_is_replaced_and_its_runs_reclaimed(
    server: EmbeddedServer, procs_factory: Callable[[str], Procs]
) -> None:
    """--processes 2: a child SIGKILLed while it holds runs is replaced (after the crash
    back-off), and the runs it held are claimed again once their leases (2 s) expire, by the
    other child or the replacement; every run ends done. (The supervisor test above kills a
    child holding nothing.)"""
    procs = procs_factory(server.url)
    jq = client_for(server.url)
    r = jq.redis
    supervisor = procs.worker(
        "--processes", "2", "--concurrency", "4", "--lease", "2", "--grace", "1"
    )

    def live_children() -> set[int]:
        alive = {p for p in registered_pids(r) if pid_alive(p)}
        procs.extra_pids |= alive
        return alive

    children = wait_for(lambda: len(x := live_children()) == 2 and x, 30, "two workers")
    handles = jq.enqueue_many(Request("work", (0.2, 0.4)) for _ in range(60))
    victim, held = 0, dict[str, int]()
    deadline = time.monotonic() + 20
    while not held:  # stop a child and look: kill it if it holds runs, else go on
        assert time.monotonic() < deadline, "no child was seen holding runs"
        for pid in sorted(children):
            os.kill(pid, signal.SIGSTOP)
            wait_for(functools.partial(stopped, pid), 5, f"child {pid} to stop")
            r.ping()
            held = held_by(r, pid)
            if held:
                victim = pid
                break
            os.kill(pid, signal.SIGCONT)
    os.kill(victim, signal.SIGKILL)
    wait_for(
        lambda: len(x := live_children()) == 2 and victim not in x, 30, "a replacement worker"
    )
    wait_for(lambda: done_count(r) >= len(handles), 60, "every run done")
    assert f"worker pid {victim} exited with -9; restarting in" in supervisor.text()

    runs = read_runs(r, [h.run_id for h in handles])
    assert {v.state for v in runs.values()} == {"done"}
    for run_id, fence in held.items():
        v = runs[run_id]
        assert v.fence > fence and v.attempt == 2, v.history  # claimed again, an attempt more
        assert v.count("expired") == 1, v.history  # after its lease expired
        assert owner_pid(v.claim_owners()[0]) == victim
        assert v.result != victim and owner_pid(v.fields["owner"]) == v.result
    survivors = live_children()
    supervisor.popen.send_signal(signal.SIGTERM)
    assert supervisor.popen.wait(30) == 0, supervisor.text()[-3000:]
    assert not any(pid_alive(p) for p in survivors)
    print(f"\nsupervised kill: runs={len(handles)} reclaimed_from_the_killed_child={len(held)}")
