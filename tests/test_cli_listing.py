"""The listing commands page through every run: `runs` and `dead list` say how many the
listing holds and print the next page's cursor; `dead retry` and `dead purge` act on every
run a filter chooses, all pages of it."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner, Result
from test_listing import MIN, enqueue, finish

from jobqueue.cli import State, main
from jobqueue.client.sync import JobQueue

pytestmark = pytest.mark.real_only


@pytest.fixture
def jq(jq: JobQueue) -> JobQueue:
    jq.declare_task("report", max_attempts=1)
    jq.declare_task("mail", max_attempts=1)
    return jq


def invoke(jq: JobQueue, *args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(main, list(args), obj=State(None, jq), input=input)


def ok(result: Result) -> str:
    assert result.exit_code == 0, result.output
    return result.stdout


def table_rows(out: str) -> list[list[str]]:
    table = out.partition("\n\n")[0]
    return [line.split() for line in table.splitlines()[1:]]


def test_runs_finds_a_cancelled_run_behind_many_done_runs(jq: JobQueue) -> None:
    enqueue(jq, ["c1"])
    jq.cancel("c1")
    finish(jq, [f"d{i}" for i in range(60)], jq.server_time_ms() + MIN)
    out = ok(invoke(jq, "runs", "--state", "cancelled", "--limit", "10"))
    assert [row[0] for row in table_rows(out)] == ["c1"]
    assert "1 shown of at most 61" in out and "the end" in out


def test_runs_prints_the_count_and_the_next_pages_cursor(jq: JobQueue) -> None:
    finish(jq, [f"x{i}" for i in range(5)], jq.server_time_ms(), fail=True)
    out = ok(invoke(jq, "runs", "--state", "dead", "--limit", "2"))
    assert "2 shown of 5" in out
    cursor = out.split("next page: --cursor ")[1].split()[0]
    rest = ok(invoke(jq, "runs", "--state", "dead", "--limit", "10", "--cursor", cursor))
    first, second = table_rows(out), table_rows(rest)
    assert len(first) == 2 and len(second) == 3
    assert {r[0] for r in first + second} == {f"x{i}" for i in range(5)}
    assert "next page" not in rest


def test_runs_json_stays_a_list_and_the_cursor_goes_to_stderr(jq: JobQueue) -> None:
    finish(jq, ["a", "b"], jq.server_time_ms(), fail=True)
    result = invoke(jq, "runs", "--state", "dead", "--limit", "1", "--json")
    assert result.exit_code == 0
    assert [r["run_id"] for r in json.loads(result.stdout)] == ["b"]
    assert result.stderr.startswith("next page: --cursor c1.")
    last = invoke(jq, "runs", "--state", "dead", "--json", "--cursor",
                  result.stderr.split()[-1])
    assert [r["run_id"] for r in json.loads(last.stdout)] == ["a"] and last.stderr == ""


def test_runs_filters_by_task_error_prefix_and_time(jq: JobQueue) -> None:
    now = jq.server_time_ms()
    finish(jq, ["old-1"], now - 3_600_000, fail=True, error="Timeout")
    finish(jq, ["new-1"], now, fail=True, error="Timeout", task="mail")
    finish(jq, ["new-2"], now, fail=True, error="KeyError")

    def ids(*args: str) -> list[str]:
        return sorted(r["run_id"] for r in json.loads(ok(invoke(jq, "runs", *args, "--json"))))

    assert ids("--error", "timeout") == ["new-1", "old-1"]
    assert ids("--task", "mail") == ["new-1"]
    assert ids("--prefix", "new-") == ["new-1", "new-2"]
    assert ids("--contains", "w-") == ["new-1", "new-2"]
    assert ids("--since", "10m") == ["new-1", "new-2"]
    assert ids("--until", "30m", "--state", "dead") == ["old-1"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cursor", "garbage"], "not a listing cursor"),
        (["--since", "yesterday"], "neither a duration ago"),
        (["--state", "running", "--order", "desc"], "oldest first only"),
    ],
)
def test_runs_refuses_bad_input_with_one_line_and_exit_2(
    jq: JobQueue, args: list[str], message: str
) -> None:
    result = invoke(jq, "runs", *args)
    assert result.exit_code == 2, result.output
    assert message in result.stderr and "Traceback" not in result.output


def test_dead_list_pages_too(jq: JobQueue) -> None:
    finish(jq, [f"x{i}" for i in range(3)], jq.server_time_ms(), fail=True)
    out = ok(invoke(jq, "dead", "list", "--limit", "2"))
    assert len(table_rows(out)) == 2 and "2 shown of 3" in out and "--cursor" in out


def test_dead_retry_all_of_a_task_retries_every_page_of_that_task_only(jq: JobQueue) -> None:
    now = jq.server_time_ms()
    finish(jq, [f"m{i}" for i in range(120)], now, fail=True, task="mail")
    finish(jq, ["r1"], now, fail=True)
    out = ok(invoke(jq, "dead", "retry", "--all", "--task", "mail", "--yes"))
    assert "retried 120 of 120" in out
    assert jq.get_run("r1").state == "dead"
    assert {jq.get_run(f"m{i}").state for i in range(120)} == {"pending"}


def test_dead_purge_all_of_an_error_asks_with_the_count(jq: JobQueue) -> None:
    now = jq.server_time_ms()
    finish(jq, ["t1", "t2"], now, fail=True, error="Timeout")
    finish(jq, ["k1"], now, fail=True, error="KeyError")
    result = invoke(jq, "dead", "purge", "--all", "--error", "timeout", input="y\n")
    assert "purge 2 dead run(s) for good?" in result.output and result.exit_code == 0
    assert jq.find_run("t1") is None and jq.get_run("k1").state == "dead"


def test_dead_retry_of_run_ids_takes_their_queue(jq: JobQueue) -> None:
    finish(jq, ["x1"], jq.server_time_ms(), fail=True)
    assert "retried 1 of 1" in ok(invoke(jq, "dead", "retry", "x1", "--queue", "default"))


@pytest.mark.parametrize(
    "args", [["x1", "--all"], ["x1", "--task", "mail"], ["--task", "mail"], []]
)
def test_dead_retry_wants_run_ids_or_all(jq: JobQueue, args: list[str]) -> None:
    result = invoke(jq, "dead", "retry", *args)
    assert result.exit_code == 2 and "Traceback" not in result.output


