"""Bulk CLI operations: `enqueue --from-file`, `schedules backfill`, `dead retry` of many.
A progress bar on a terminal (a real pty), nothing but the summary in a pipe."""

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
from jobqueue.client.base import Request
from jobqueue.client.sync import JobQueue
from jobqueue.store.embedded import EmbeddedServer
from jobqueue.store.runs import CLAIM, FAIL

JOBQUEUE = str(Path(sys.executable).parent / "jobqueue")


def invoke(jq: JobQueue, *args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(main, list(args), obj=State(None, jq), input=input)


def write_lines(path: Path, items: list[object]) -> Path:
    path.write_text("".join(json.dumps(i) + "\n" for i in items))
    return path


def run_in_pty(argv: list[str], timeout: float = 30) -> tuple[int, str]:
    """Run argv with stdin/stdout/stderr on a new pseudo-terminal; its exit code and output."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave,
                            start_new_session=True, env={**os.environ, "TERM": "xterm"})
    os.close(slave)
    out = read_until(master, lambda _: False, timeout)
    os.close(master)
    return proc.wait(timeout=5), out.decode(errors="replace")


def read_until(master: int, done: Callable[[bytes], bool], timeout: float) -> bytes:
    """Drain the terminal until done(output), its other end closes, or the timeout."""
    out, deadline = b"", time.monotonic() + timeout
    while not done(out) and (left := deadline - time.monotonic()) > 0:
        if select.select([master], [], [], left)[0]:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: every process holding the terminal has exited
                break
            if not chunk:
                break
            out += chunk
    return out


def test_enqueue_from_file_creates_one_run_per_line_and_is_idempotent(
    jq: JobQueue, tmp_path: Path
) -> None:
    lines = [{"args": [i], "kwargs": {"k": i}, "run_id": f"f-{i}"} for i in range(1200)]
    lines.append({})  # every key optional: a random run id, no arguments
    path = write_lines(tmp_path / "runs.jsonl", lines)
    first = invoke(jq, "enqueue", "report", "--from-file", str(path))
    assert (first.exit_code, first.stdout) == (0, "1,201 runs: 1,201 created, 0 existed already\n")
    run = jq.get_run("f-1199")
    assert (run.task, run.args, run.kwargs, run.state) == ("report", [1199], {"k": 1199}, "pending")
    again = invoke(jq, "enqueue", "report", "--from-file", str(path), "--json")
    assert json.loads(again.stdout) == {"runs": 1201, "created": 1, "existed": 1200}


def test_enqueue_from_stdin_applies_delay_and_queue_to_every_line(jq: JobQueue) -> None:
    text = '{"run_id": "a"}\n\n{"run_id": "b", "args": [1]}\n'
    result = invoke(jq, "enqueue", "report", "--from-file", "-", "--delay", "600",
                    "--queue", "slow", input=text)
    assert result.exit_code == 0, result.output
    runs = [jq.get_run(r, queue="slow") for r in ("a", "b")]
    assert all(r.state == "pending" and r.due_ms and r.created_ms and
               r.due_ms - r.created_ms >= 599_000 for r in runs)


def test_a_bad_line_is_a_usage_error_naming_it_and_nothing_is_written(
    jq: JobQueue, tmp_path: Path
) -> None:
    path = tmp_path / "runs.jsonl"
    path.write_text('{"run_id": "ok-1"}\n{"run_id": "ok-2"}\n{"args": 5}\n')
    result = invoke(jq, "enqueue", "report", "--from-file", str(path))
    assert result.exit_code == 2
    assert f"{path} line 3: args must be a JSON array" in result.stderr
    assert jq.find_run("ok-1") is None
    path.write_text('{"run_id": "ok-1"}\n{"run_id": "x", "colour": "red"}\n')
    assert "line 2: expected an object with only" in invoke(
        jq, "enqueue", "report", "--from-file", str(path)).stderr
    path.write_text('{"args": [NaN]}\n')
    assert invoke(jq, "enqueue", "report", "--from-file", str(path)).exit_code == 2


def test_from_file_and_args_together_is_a_usage_error(jq: JobQueue, tmp_path: Path) -> None:
    path = write_lines(tmp_path / "runs.jsonl", [{}])
    result = invoke(jq, "enqueue", "report", "--from-file", str(path), "--args", "[1]")
    assert result.exit_code == 2 and "--from-file takes args" in result.stderr


def bulk_state(url: str, tmp_path: Path) -> Path:
    """600 dead runs (two retry chunks), a job to backfill, and a file of 3,000 runs."""
    redis.Redis.from_url(url).flushall()
    jq = JobQueue.from_url(url)
    jq.declare_task("report")
    jq.enqueue_many([Request("report", run_id=f"d-{i}") for i in range(600)])
    keys = jq.keys_for("default", "x")
    claimed = CLAIM.parse(jq.scripts.run(CLAIM.call(keys, 600, "w", 60_000, 600_000)))
    jq.scripts.run_many([FAIL.call(keys, r.run_id, r.fence, "boom", None, 600_000)
                         for r in claimed.runs])
    jq.schedule("minutely", "report", every=60)
    return write_lines(tmp_path / "runs.jsonl", [{"run_id": f"f-{i}"} for i in range(3000)])


BULK = [
    ("enqueue", "report", "--from-file", "{file}"),
    ("schedules", "backfill", "minutely", "--start", "2026-01-01T00:00Z",
     "--end", "2026-01-01T20:00Z"),
    ("dead", "retry", "--all", "--yes"),
]
LABELS = ["enqueueing 3,000 runs", "backfilling minutely", "retrying dead runs"]
SUMMARIES = [
    "3,000 runs: 3,000 created, 0 existed already",
    "1201 fire times: 1201 runs created, 0 existed",
    "retried 600 of 600 dead run(s)",
]


def test_bulk_commands_show_a_progress_bar_on_a_terminal(
    real_server: EmbeddedServer, tmp_path: Path
) -> None:
    path = bulk_state(real_server.url, tmp_path)
    for args, label, summary in zip(BULK, LABELS, SUMMARIES, strict=True):
        argv = [JOBQUEUE, "--redis-url", real_server.url,
                *(a.format(file=path) for a in args)]
        code, out = run_in_pty(argv)
        assert code == 0, out
        bar = next(line for line in out.split("\r") if label in line and "100%" in line)
        assert "[####" in bar, out
        assert summary in out


def test_bulk_commands_print_only_their_summary_in_a_pipe(
    real_server: EmbeddedServer, tmp_path: Path
) -> None:
    path = bulk_state(real_server.url, tmp_path)
    for args, summary in zip(BULK, SUMMARIES, strict=True):
        done = subprocess.run(
            [JOBQUEUE, "--redis-url", real_server.url, *(a.format(file=path) for a in args)],
            capture_output=True, text=True, timeout=30,
        )
        assert (done.returncode, done.stdout) == (0, summary + "\n")
        # No bar: stderr holds at most enqueue's one-line note that the task is not checked.
        assert [line for line in done.stderr.splitlines() if not line.startswith("note: ")] == []
