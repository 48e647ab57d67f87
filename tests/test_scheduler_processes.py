"""Real scheduler processes against one real Redis server (bounded to ~20 s each): three
``jobqueue scheduler`` processes for 200 jobs firing every second, one killed with SIGKILL
mid-run; and two sharing a herd, the owner of its partition SIGSTOPped mid-herd past its lease.
Every fire time gets exactly one run: no gap, no duplicate, counted once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from helpers import wait_for

from jobqueue.client.sync import JobQueue
from jobqueue.policy.cron import parse_fire_instant
from jobqueue.recurring.declarations import make_definition
from jobqueue.recurring.fires import first_fire_after
from jobqueue.recurring.membership import read_members
from jobqueue.store.embedded import EmbeddedServer

JOBS = 200
RUN_SECONDS = 12.0
KILL_AFTER = 2.0  # s after all three run

pytestmark = pytest.mark.slow

APP = "from jobqueue import JobQueue\n\njq = JobQueue.from_url()\n"


def start_scheduler(url: str, cwd: Path, *extra: str) -> subprocess.Popen[bytes]:
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    cmd = [
        sys.executable,
        "-m",
        "jobqueue.cli",
        "--redis-url",
        url,
        "--log-level",
        "WARNING",
        "scheduler",
        "--app",
        "sched_app:jq",
        "--lookahead",
        "2",
        "--interval",
        "0.1",
        *extra,
    ]
    return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def member_pids(jq: JobQueue) -> set[int]:
    return {m.pid for m in read_members(jq)}


HERD = 6000
HERD_EVERY = 6  # s
PAUSED_LEASE = 1.0  # s: the schedulers' partition lease in the pause test


def bulk_herd(jq: JobQueue, n: int) -> int:
    """n jobs firing every HERD_EVERY s from the same instant, written in pipelined batches
    (the definition ``jq.schedule`` writes; one schedule validated, not n): the first fire."""
    template = make_definition(jq, "job-0", "tick", every=HERD_EVERY, misfire="fire-all")
    first = first_fire_after(template, jq.server_time_ms() + 1000)
    assert first is not None
    text = template.to_json()
    (sk,) = jq.recurring.all_keys()
    for start in range(0, n, 2000):
        ids = [f"job-{i}" for i in range(start, min(n, start + 2000))]
        pipe = jq.redis.pipeline(transaction=False)
        pipe.hset(sk.defs, mapping=dict.fromkeys(ids, text))
        pipe.zadd(sk.next, dict.fromkeys(ids, first))
        pipe.execute()
    return first


def test_a_scheduler_paused_mid_herd_past_its_lease_neither_doubles_nor_loses_a_fire(
    real_server: EmbeddedServer, tmp_path: Path
) -> None:
    """Scheduler A owns the one scheduler partition, B stands by. While A is creating a herd
    (batches of 100), A is SIGSTOPped for 2.5 partition leases: B takes the partition over and
    fires what A had not advanced; A, continued, is fenced out (its batch dropped or its
    advance refused) and gives the partition up. Every fire of every job has exactly one
    run, counted once. Bounded: ~15 s."""
    client: Any = redis.Redis.from_url(real_server.url, decode_responses=True)
    client.flushall()
    (tmp_path / "sched_app.py").write_text(APP)
    jq = JobQueue(client)
    jq.recurring.record_partitions()  # K = 1
    first = bulk_herd(jq, HERD)
    stats = jq.partition_keys("default", 0).stats
    lease = ("--lookahead", "0", "--batch", "100", "--partition-lease", str(PAUSED_LEASE))
    a = start_scheduler(real_server.url, tmp_path, *lease)
    procs = [a]

    def owners() -> list[list[int]]:
        return [m.partitions for m in read_members(jq)]

    def created() -> int:
        return int(client.hget(stats, "created") or 0)

    def b_owns(pid: int) -> bool:
        return any(m.pid == pid and m.partitions == [0] for m in read_members(jq))

    try:
        wait_for(lambda: owners() == [[0]], 15, "A to own the partition", interval=0.005)
        b = start_scheduler(real_server.url, tmp_path, *lease)
        procs.append(b)
        wait_for(lambda: sorted(owners()) == [[], [0]], 15, "B to register", interval=0.005)

        def herd_in_the_middle() -> int | None:
            """The herd A is creating (1 for the second) when A is in its middle."""
            done, into = divmod(created(), HERD)
            return done if done >= 1 and 0 < into < HERD - 500 else None

        # A creates a herd (after the first) batch after batch; pause it in the middle. A
        # loaded machine may poll past one herd's middle: the next herds come every 6 s.
        herd = wait_for(herd_in_the_middle, 4 * HERD_EVERY, "A in the middle of a herd",
                        interval=0.005)
        a.send_signal(signal.SIGSTOP)
        paused_at = created()
        # A stays stopped until its lease has run out and B holds the partition.
        wait_for(lambda: b_owns(b.pid), 10 + 2.5 * PAUSED_LEASE, "B to take the partition over",
                 interval=0.005)
        wait_for(lambda: created() >= (herd + 1) * HERD, 10, "B to finish the herd",
                 interval=0.005)
        a.send_signal(signal.SIGCONT)
        wait_for(lambda: created() >= (herd + 2) * HERD, 3 * HERD_EVERY, "the next herd",
                 interval=0.005)
        time.sleep(1.0)  # kept: a window for A, continued, to act on what it held (fenced)
    finally:
        for p in procs:
            p.send_signal(signal.SIGCONT)
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
    errors = [p.stderr.read().decode() if p.stderr else "" for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errors
    assert herd * HERD < paused_at < (herd + 1) * HERD
    # A found out it no longer owned the partition: fenced, dropped, or lost at renewal.
    assert any(w in errors[0] for w in ("refused", "dropped", "lost")), errors[0]
    runs: dict[str, list[int]] = {}
    keys = list(client.scan_iter(match="jq:{default#0}:run:*", count=10_000))
    for key in keys:
        job, _, when = key.split(":run:", 1)[1].rpartition("@")
        runs.setdefault(job, []).append(parse_fire_instant(when))
    assert len(runs) == HERD
    last = max(max(f) for f in runs.values())
    for job, fires in runs.items():
        # No gap and no duplicate: one run per fire from the first to the last fired.
        assert sorted(fires) == list(range(first, last + 1, HERD_EVERY * 1000)), job
    total = len(keys)
    assert int(client.hget(stats, "created")) == total
    assert sum(i.state.fired for i in jq.list_schedules()) == total
    client.close()


def test_three_scheduler_processes_one_killed_create_every_fire_exactly_once(
    real_server: EmbeddedServer, tmp_path: Path
) -> None:
    client: Any = redis.Redis.from_url(real_server.url, decode_responses=True)
    client.flushall()
    (tmp_path / "sched_app.py").write_text(APP)
    jq = JobQueue(client)
    for i in range(JOBS):
        jq.schedule(f"job-{i}", "tick", every=1, misfire="fire-all")
    # Creating 200 schedules can straddle a second boundary, so each job's first fire is its own.
    first_fire = {i.job_id: i.next_fire_ms for i in jq.list_schedules()}
    assert all(first_fire.values())

    procs = [start_scheduler(real_server.url, tmp_path) for _ in range(3)]
    by_pid = {p.pid: p for p in procs}
    try:
        # The victim is a scheduler that owns partitions (so it has been creating runs), and
        # all three run: a kill before start-up, or of an idle one, would prove nothing.
        def owners() -> set[int]:
            members = read_members(jq)
            if {m.pid for m in members} != set(by_pid):
                return set()
            return {m.pid for m in members if m.partitions}

        wait_for(owners, 30, "three schedulers, partitions owned", interval=0.005)
        time.sleep(KILL_AFTER)  # kept: the three create fires a while (every 1 s, real time)
        owning = wait_for(owners, 10, "a scheduler owning partitions", interval=0.005)
        victim = by_pid[min(owning)]
        victim.send_signal(signal.SIGKILL)  # mid-run, possibly between create and advance
        victim.wait(timeout=10)
        time.sleep(RUN_SECONDS - KILL_AFTER)  # kept: the survivors fire on, in real time
    finally:
        survivors = [p for p in procs if p.poll() is None]
        for p in survivors:
            p.send_signal(signal.SIGTERM)
        for p in survivors:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
    assert victim.returncode == -signal.SIGKILL
    for p in procs:
        if p is not victim:
            assert p.returncode == 0, p.stderr.read().decode() if p.stderr else ""

    stopped_ms = jq.server_time_ms()
    runs: dict[str, list[int]] = {}
    keys = list(client.scan_iter(match="jq:{default#0}:run:*", count=10_000))
    for key in keys:
        job, _, when = key.split(":run:", 1)[1].rpartition("@")
        runs.setdefault(job, []).append(parse_fire_instant(when))
    assert set(runs) == {f"job-{i}" for i in range(JOBS)}
    total = 0
    for job, fires in runs.items():
        fires.sort()
        # No gap: one run per second from the first fire on, up to (at least) the stop.
        assert fires[0] == first_fire[job], job
        assert fires == list(range(fires[0], fires[-1] + 1, 1000)), job
        assert fires[-1] >= stopped_ms - 3000, job
        total += len(fires)
    # No duplicate: each run was created once (SET NX) and each fire counted once.
    assert int(client.hget("jq:{default#0}:stats", "created")) == total == len(keys)
    assert sum(i.state.fired for i in jq.list_schedules()) == total
    assert total >= JOBS * (RUN_SECONDS - 1)
    client.close()


def test_scheduler_process_retrying_its_start_up_exits_0_on_sigterm(tmp_path: Path) -> None:
    """Redis refuses writes (OOM) from the start: the scheduler keeps retrying its start-up
    (one warning line per attempt, no traceback) and a SIGTERM meanwhile is a clean exit."""
    server = EmbeddedServer().start()
    try:
        admin: Any = redis.Redis.from_url(server.url, decode_responses=True)
        admin.config_set("maxmemory-policy", "noeviction")
        admin.config_set("maxmemory", "1")
        (tmp_path / "sched_app.py").write_text(APP)
        proc = start_scheduler(server.url, tmp_path)
        try:
            assert proc.stderr is not None
            line = proc.stderr.readline().decode()  # bounded: the first attempt fails at once
            assert "start-up failed (OutOfMemoryError" in line, line
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=15)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 0, err.decode()
        assert b"Traceback" not in err
    finally:
        server.stop()


def test_sigusr1_prints_every_threads_stack_and_the_scheduler_runs_on(
    real_server: EmbeddedServer, tmp_path: Path
) -> None:
    """What an operator does with a daemon that seems stuck: `kill -USR1 PID`."""
    (tmp_path / "sched_app.py").write_text(APP)
    jq = JobQueue(redis.Redis.from_url(real_server.url, decode_responses=True))
    proc = start_scheduler(real_server.url, tmp_path)
    try:
        # Registered, so started: the CLI installed its SIGUSR1 handler before the scheduler
        # ran (a signal sent before it, on a busy machine, killed the process).
        wait_for(lambda: proc.pid in member_pids(jq), 30, "the scheduler to register",
                 interval=0.005)
        proc.send_signal(signal.SIGUSR1)
        time.sleep(0.5)  # kept: a window in which the signal must not end the process
        assert proc.poll() is None, "SIGUSR1 ended the scheduler"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        jq.redis.close()
    text = err.decode(errors="replace")
    assert proc.returncode == 0, text
    assert "Current thread" in text or "Thread 0x" in text, text
    assert "recurring/daemon.py" in text, text  # the main thread's loop, among the stacks
