"""`jobqueue top`: the frame as a pure function of a snapshot, and the live loop for real (a
pseudo-terminal, a real server): it shows a run the test created and quits on q or Ctrl-C."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Callable
from pathlib import Path

import redis
from click.testing import CliRunner, Result

from jobqueue.cli import State, main
from jobqueue.cli.top_view import render
from jobqueue.client.sync import JobQueue
from jobqueue.ops.queries import Lease, PartitionStats, TopSnapshot, WorkerInfo
from jobqueue.store.embedded import EmbeddedServer
from jobqueue.store.runs import CLAIM

JOBQUEUE = str(Path(sys.executable).parent / "jobqueue")
NOW = 1_796_000_000_000  # 2026-11-30 00:53:20 UTC


def part(queue: str, partition: int, **counts: int) -> PartitionStats:
    fields = dict(due_now=0, scheduled_later=0, running=0, expired_leases=0, dead=0,
                  done_last_minute=0, done_last_hour=0)
    fields.update({k: v for k, v in counts.items() if k in fields})
    age = counts.get("age")
    return PartitionStats(
        queue=queue, partition=partition, **fields,
        oldest_due_age_ms=age, oldest_due_ms=None if age is None else NOW - age,
        counters={"completed": counts.get("completed", 0)},
    )


def lease(run_id: str, remaining_ms: int) -> Lease:
    return Lease(run_id=run_id, queue="mail", partition=0, task="send", owner="w-1", host="h",
                 pid=1, fence=3, attempt=2, lease_until_ms=NOW + remaining_ms,
                 remaining_ms=remaining_ms, running_for_ms=5_000)


def worker(worker_id: str, stale: bool) -> WorkerInfo:
    return WorkerInfo(id=worker_id, host="h", pid=1, queues=["mail"], concurrency=8,
                      in_flight=1, started_ms=NOW - 60_000, last_seen_ms=NOW, seen_ago_ms=0,
                      stale=stale)


def snapshot(now: int = NOW, completed: int = 0) -> TopSnapshot:
    return TopSnapshot(
        now_ms=now,
        stats=[
            part("mail", 0, due_now=3, scheduled_later=1, running=2, expired_leases=1, dead=1,
                 done_last_minute=30, done_last_hour=900, age=4_000, completed=completed),
            part("mail", 1, due_now=2, running=1, done_last_minute=30, done_last_hour=100,
                 age=65_000),
            part("reports", 0, scheduled_later=7),
        ],
        leases=[lease("late-one", -2_000), lease("fine-one", 25_000)],
        workers=[worker("w-1", False), worker("w-2", True)],
    )


def cells(lines: list[str], first: str) -> list[str]:
    return next(line for line in lines if line.startswith(first + " ")).split()


def test_frame_adds_up_each_queues_partitions() -> None:
    lines = render(snapshot())
    assert cells(lines, "mail") == ["mail", "2", "5", "1", "3", "1", "1", "60", "1000", "1m05s"]
    assert cells(lines, "reports") == ["reports", "1", "0", "7", "0", "0", "0", "0", "0", "-"]


def test_frame_shows_throughput_lateness_and_totals() -> None:
    text = "\n".join(render(snapshot()))
    assert "throughput  done 60/min (1.0/s), 1,000/h" in text
    assert "lateness    oldest due 1m05s late (queue mail, due 2026-11-30 00:52:15)" in text
    assert "totals      due now 5  later 8  running 3  expired 1  dead 1" in text
    assert "workers 2 (1 STALE)" in text


def test_frame_lists_leases_in_the_order_given_and_flags_expired_ones() -> None:
    lines = render(snapshot())
    rows = [line for line in lines if line.startswith(("late-one", "fine-one"))]
    assert [r.split()[0] for r in rows] == ["late-one", "fine-one"]
    assert "-2.0s EXPIRED" in rows[0] and "EXPIRED" not in rows[1]
    assert "(in 25.0s)" in rows[1]


def test_frame_rate_comes_from_completed_counters_between_frames() -> None:
    previous, now = snapshot(NOW, completed=100), snapshot(NOW + 2_000, completed=160)
    assert "; now 30.0/s" in render(now, previous=previous)[1]
    assert "now" not in render(now)[1]  # one frame: no rate yet


def test_frame_fits_the_terminal() -> None:
    lines = render(snapshot(), width=30, height=6)
    assert len(lines) == 6 and max(map(len, lines)) <= 30


def test_frame_of_an_empty_server_says_so() -> None:
    text = "\n".join(render(TopSnapshot(NOW, [], [], [])))
    assert "no queues yet" in text and "no leases" in text and "nothing due" in text


def invoke(jq: JobQueue, *args: str) -> Result:
    return CliRunner().invoke(main, list(args), obj=State(None, jq))


def hold_lease(jq: JobQueue, run_id: str) -> None:
    jq.declare_task("report")
    jq.enqueue(jq.resolve_task("report").with_options(run_id=run_id))
    keys = jq.keys_for("default", run_id)
    (r,) = CLAIM.parse(jq.scripts.run(CLAIM.call(keys, 1, "w-top", 60_000, 60_000))).runs
    assert r.run_id == run_id


def test_top_once_prints_one_frame_with_the_live_lease(jq: JobQueue) -> None:
    hold_lease(jq, "top-run-1")
    jq.enqueue(jq.resolve_task("report").with_options(run_id="waiting"))
    result = invoke(jq, "top", "--once")
    assert result.exit_code == 0, result.output
    assert cells(result.stdout.splitlines(), "default")[:5] == ["default", "1", "1", "0", "1"]
    assert cells(result.stdout.splitlines(), "top-run-1")[3] == "w-top"
    assert "\x1b" not in result.stdout  # no terminal control codes when not on a terminal


def test_top_json_is_one_snapshot(jq: JobQueue) -> None:
    hold_lease(jq, "top-run-1")
    snap = json.loads(invoke(jq, "top", "--json").stdout)
    assert [x["run_id"] for x in snap["leases"]] == ["top-run-1"]
    assert snap["stats"][0]["running"] == 1 and snap["now_ms"] > 0


def spawn_in_pty(argv: list[str]) -> tuple[subprocess.Popen[bytes], int]:
    """argv on a new terminal that is its controlling terminal (so Ctrl-C is a signal)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))
    proc = subprocess.Popen(
        argv, stdin=slave, stdout=slave, stderr=slave, start_new_session=True,
        preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0),
        env={**os.environ, "TERM": "xterm"},
    )
    os.close(slave)
    return proc, master


def read_until(master: int, done: Callable[[bytes], bool], timeout: float) -> bytes:
    out, deadline = b"", time.monotonic() + timeout
    while not done(out) and (left := deadline - time.monotonic()) > 0:
        if select.select([master], [], [], left)[0]:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the process left the terminal
                break
            if not chunk:
                break
            out += chunk
    return out


def live_top_until(url: str, key: bytes) -> tuple[bytes, int | None, bytes]:
    """Start `top` live, wait for a frame showing top-run-1, press key; what it drew before,
    its exit code within 5 s of the key (None: still running), and what it wrote after."""
    argv = [JOBQUEUE, "--redis-url", url, "top", "--interval", "0.2", "--iterations", "300"]
    proc, master = spawn_in_pty(argv)  # --iterations: gone within a minute whatever happens
    try:
        before = read_until(master, lambda out: b"top-run-1" in out, timeout=20)
        os.write(master, key)
        try:
            code: int | None = proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        after = read_until(master, lambda _: False, timeout=0.5 if code is not None else 0)
        return before, code, after
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)


def fresh(real_server: EmbeddedServer) -> JobQueue:
    redis.Redis.from_url(real_server.url).flushall()
    return JobQueue.from_url(real_server.url)


def test_live_top_shows_a_run_the_test_created_and_quits_on_q(
    real_server: EmbeddedServer,
) -> None:
    hold_lease(fresh(real_server), "top-run-1")
    before, code, after = live_top_until(real_server.url, b"q")
    assert b"top-run-1" in before and b"w-top" in before
    assert b"\x1b[?1049h" in before  # drawn on the alternate screen
    assert code == 0
    assert b"\x1b[?1049l" in after  # and the operator's screen given back
    assert b"Traceback" not in before + after


def test_live_top_quits_cleanly_on_ctrl_c(real_server: EmbeddedServer) -> None:
    hold_lease(fresh(real_server), "top-run-1")
    before, code, after = live_top_until(real_server.url, b"\x03")
    assert b"top-run-1" in before
    assert code == 0
    assert b"\x1b[?1049l" in after and b"Traceback" not in after and b"Aborted" not in after


def test_top_prints_one_frame_and_exits_when_stdout_is_not_a_terminal(
    real_server: EmbeddedServer,
) -> None:
    hold_lease(fresh(real_server), "top-run-1")
    done = subprocess.run([JOBQUEUE, "--redis-url", real_server.url, "top"],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("jobqueue top ") and done.stdout.count("jobqueue top ") == 1
    assert "top-run-1" in done.stdout and "\x1b" not in done.stdout
