"""Mutating commands (cancel, requeue, dead retry/purge): they say what they did, ask before
bulk or destructive changes unless --yes, and a second run is harmless with a sensible exit
code. Plus the exit code when Redis goes away mid-command."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import redis
from click.testing import CliRunner, Result

from jobqueue.cli import State, main
from jobqueue.client.sync import JobQueue
from jobqueue.store.embedded import EmbeddedServer
from jobqueue.store.runs import CLAIM, COMPLETE, FAIL

JOBQUEUE = str(Path(sys.executable).parent / "jobqueue")


def invoke(jq: JobQueue, *args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(main, list(args), obj=State(None, jq), input=input)


def make(jq: JobQueue, **states: str) -> None:
    """Runs named by id, each brought to its state through the real scripts (pending ones
    last, so that each claim takes the run just created)."""
    jq.declare_task("report")
    keys = jq.keys_for("default", "x")
    for run_id, state in sorted(states.items(), key=lambda item: item[1] == "pending"):
        jq.enqueue(jq.resolve_task("report").with_options(run_id=run_id))
        if state == "pending":
            continue
        (r,) = CLAIM.parse(jq.scripts.run(CLAIM.call(keys, 1, "w", 60_000, 60_000))).runs
        assert r.run_id == run_id
        if state == "done":
            jq.scripts.run(COMPLETE.call(keys, [(run_id, r.fence, "null")], 60_000))
        elif state == "dead":
            jq.scripts.run(FAIL.call(keys, run_id, r.fence, "boom", None, 60_000))


def test_cancel_says_what_it_did_and_a_second_cancel_exits_0(jq: JobQueue) -> None:
    make(jq, c1="running")
    first = invoke(jq, "cancel", "c1")
    assert (first.exit_code, first.stdout.strip()) == (0, "cancelled c1 (was running)")
    again = invoke(jq, "cancel", "c1", "--yes")
    assert (again.exit_code, again.stdout.strip()) == (0, "c1 is already cancelled (nothing to do)")
    assert jq.get_run("c1").state == "cancelled"


def test_cancel_of_a_done_run_is_refused_with_exit_1(jq: JobQueue) -> None:
    make(jq, d1="done")
    result = invoke(jq, "cancel", "d1")
    assert result.exit_code == 1
    assert result.stderr.strip() == "error: run d1 is done; only pending or running runs cancel"
    assert jq.get_run("d1").state == "done"


def test_cancel_of_an_unknown_run_exits_1(jq: JobQueue) -> None:
    make(jq)
    result = invoke(jq, "cancel", "ghost")
    assert result.exit_code == 1 and "no run 'ghost'" in result.stderr


def test_requeue_says_what_it_did_and_a_second_requeue_exits_0(jq: JobQueue) -> None:
    make(jq, d1="dead")
    first = invoke(jq, "requeue", "d1")
    assert (first.exit_code, first.stdout.strip()) == (0, "requeued d1 (was dead)")
    again = invoke(jq, "requeue", "d1")
    assert (again.exit_code, again.stdout.strip()) == (0, "d1 is already pending (nothing to do)")


def test_requeue_of_a_done_run_without_an_answer_is_refused_and_names_force(
    jq: JobQueue,
) -> None:
    make(jq, d1="done")
    result = invoke(jq, "requeue", "d1")
    assert result.exit_code == 1 and "--force" in result.stderr
    assert jq.get_run("d1").state == "done"


def test_requeue_of_a_done_run_asks_and_a_no_changes_nothing(jq: JobQueue) -> None:
    make(jq, d1="done")
    result = invoke(jq, "requeue", "d1", input="n\n")
    assert result.exit_code == 1 and "run again?" in result.stdout
    assert jq.get_run("d1").state == "done"


def test_requeue_of_a_done_run_asks_and_a_yes_requeues_it(jq: JobQueue) -> None:
    make(jq, d1="done")
    result = invoke(jq, "requeue", "d1", input="y\n")
    assert result.exit_code == 0 and "requeued d1 (was done)" in result.stdout
    assert jq.get_run("d1").state == "pending"


def test_requeue_force_of_a_done_run_requeues_it_without_asking(jq: JobQueue) -> None:
    make(jq, d1="done", d2="done")
    for run_id, flag in (("d1", "--force"), ("d2", "--yes")):
        result = invoke(jq, "requeue", run_id, flag)
        assert (result.exit_code, result.stdout.strip()) == (0, f"requeued {run_id} (was done)")


def test_requeue_of_a_running_run_is_refused_with_exit_1(jq: JobQueue) -> None:
    make(jq, r1="running")
    result = invoke(jq, "requeue", "r1")
    assert result.exit_code == 1 and "is running" in result.stderr
    assert jq.get_run("r1").state == "running"


def test_dead_retry_retries_only_dead_runs_and_is_idempotent(jq: JobQueue) -> None:
    make(jq, d1="dead", ok="done")
    first = invoke(jq, "dead", "retry", "d1")
    assert (first.exit_code, first.stdout.strip()) == (0, "retried 1 of 1 dead run(s)")
    assert jq.get_run("d1").state == "pending"
    again = invoke(jq, "dead", "retry", "d1")
    assert again.exit_code == 0
    assert again.stdout.strip() == "retried 0 of 1 dead run(s); 1 already pending"
    refused = invoke(jq, "dead", "retry", "ok")
    assert refused.exit_code == 1 and "refused ok: is done; only dead runs retry" in refused.stderr
    assert jq.get_run("ok").state == "done"


def test_dead_retry_of_an_id_with_a_line_break_refuses_on_one_line(jq: JobQueue) -> None:
    """NEL (U+0085) breaks a line for str.splitlines and for terminals: shown escaped."""
    refused = invoke(jq, "dead", "retry", "\x85")
    assert refused.exit_code == 1
    assert refused.stderr.splitlines() == ["error: refused \\x85: not found; only dead runs retry"]


def test_dead_retry_all_asks_first_unless_yes(jq: JobQueue) -> None:
    make(jq, d1="dead", d2="dead", p1="pending")
    declined = invoke(jq, "dead", "retry", "--all", input="n\n")
    assert declined.exit_code == 1 and jq.get_run("d1").state == "dead"
    done = invoke(jq, "dead", "retry", "--all", "--yes")
    assert (done.exit_code, done.stdout.strip()) == (0, "retried 2 of 2 dead run(s)")
    assert {jq.get_run(r).state for r in ("d1", "d2")} == {"pending"}
    nothing = invoke(jq, "dead", "retry", "--all", "--yes")
    assert (nothing.exit_code, nothing.stdout.strip()) == (0, "no dead runs to retry")


def test_dead_retry_needs_ids_or_all(jq: JobQueue) -> None:
    make(jq)
    assert invoke(jq, "dead", "retry").exit_code == 2
    assert invoke(jq, "dead", "retry", "x", "--all").exit_code == 2


def test_dead_purge_is_idempotent(jq: JobQueue) -> None:
    make(jq, d1="dead")
    first = invoke(jq, "dead", "purge", "d1", "--yes")
    assert first.exit_code == 0
    assert first.stdout.strip() == "purged 1 dead run(s); 0 not dead or not found"
    again = invoke(jq, "dead", "purge", "d1", "--yes")
    assert again.exit_code == 0
    assert again.stdout.strip() == "purged 0 dead run(s); 1 not dead or not found"
    assert jq.find_run("d1") is None


def test_mutations_from_a_real_subprocess(real_server: EmbeddedServer) -> None:
    redis.Redis.from_url(real_server.url).flushall()
    make(JobQueue.from_url(real_server.url), p1="pending", d1="dead")

    def run(*args: str) -> tuple[int, str, str]:
        done = subprocess.run([JOBQUEUE, "--redis-url", real_server.url, *args],
                              capture_output=True, text=True, timeout=30)
        return done.returncode, done.stdout.strip(), done.stderr.strip()

    assert run("cancel", "p1") == (0, "cancelled p1 (was pending)", "")
    assert run("cancel", "p1") == (0, "p1 is already cancelled (nothing to do)", "")
    assert run("dead", "retry", "--all", "--yes") == (0, "retried 1 of 1 dead run(s)", "")
    code, _, err = run("requeue", "nope")
    assert code == 1 and err.startswith("error: no run 'nope'") and "Traceback" not in err


def test_redis_lost_after_connecting_exits_3_with_one_line() -> None:
    server = EmbeddedServer().start()
    jq = JobQueue.from_url(server.url)
    jq.connect()
    server.stop()
    result = invoke(jq, "queues")
    assert result.exit_code == 3
    assert result.stderr.startswith("error: ")
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
