"""Hostile input at the entry points: each mistake is refused with one clear line (the CLI:
``error: ...`` and the README's exit code, the API: a typed error), and nothing is written,
byte for byte."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from helpers import finished, make_worker, running
from keyspace import keyspace
from starlette.testclient import TestClient

from jobqueue.cli import State, main
from jobqueue.client.aio import AsyncJobQueue
from jobqueue.client.base import Request
from jobqueue.client.sync import JobQueue
from jobqueue.dashboard.app import create_app
from jobqueue.errors import ConfigError, PayloadError
from jobqueue.payload import encode_result
from jobqueue.store.keys import validate_queue_name


def invoke(jq: JobQueue, *args: str, input: str | bytes | None = None) -> Result:
    return CliRunner().invoke(main, list(args), obj=State(None, jq), input=input)


def one_line_error(result: Result) -> str:
    """The only line on stderr, checked to be an ``error:`` line and not a traceback."""
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(
        result.exception
    )
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


@pytest.fixture
def seeded(jq: JobQueue) -> JobQueue:
    """A queue with one run: refusals must leave it exactly as it is."""
    jq.declare_task("t")
    jq.enqueue(jq.resolve_task("t").with_options(run_id="seed"), 1)
    return jq


# -- queue names ------------------------------------------------------------------------------

BAD_QUEUE_NAMES = ["q\n", "q\r\n", "\nq", "q\x00", "q q", "", "q" * 65, "{q}", "q#0", "ü"]


@pytest.mark.parametrize("name", BAD_QUEUE_NAMES, ids=repr)
def test_validate_queue_name_refuses_anything_but_the_whole_name_matching(name: str) -> None:
    with pytest.raises(ConfigError, match="invalid queue name"):
        validate_queue_name(name)


@pytest.mark.parametrize("name", ["q\n", "default\n"], ids=repr)
def test_enqueue_to_a_queue_name_ending_in_a_newline_is_refused_and_writes_nothing(
    seeded: JobQueue, redis_client: Any, name: str
) -> None:
    before = keyspace(redis_client)
    result = invoke(seeded, "enqueue", "t", "--queue", name)
    assert result.exit_code == 2
    assert "invalid queue name" in one_line_error(result)
    assert keyspace(redis_client) == before


# Every command that takes --queue: a malformed name is bad input (2) everywhere, never
# "not found" (1) in some and 2 in others.
QUEUE_COMMANDS = [
    ("enqueue", "t", "--queue", "{q}"),
    ("show", "seed", "--queue", "{q}"),
    ("cancel", "seed", "--queue", "{q}"),
    ("requeue", "seed", "--queue", "{q}"),
    ("runs", "--queue", "{q}"),
    ("leases", "--queue", "{q}"),
    ("queues", "--queue", "{q}"),
    ("stats", "--queue", "{q}"),
    ("top", "--once", "--queue", "{q}"),
    ("dead", "list", "--queue", "{q}"),
    ("dead", "retry", "seed", "--queue", "{q}"),
    ("dead", "purge", "seed", "--yes", "--queue", "{q}"),
    ("repartition", "{q}", "--partitions", "2", "--yes"),
]


@pytest.mark.parametrize("command", QUEUE_COMMANDS, ids=lambda c: " ".join(c[:2]))
@pytest.mark.parametrize("name", ["q\n", "bad name", ""], ids=repr)
def test_a_malformed_queue_name_is_exit_2_in_every_command_and_writes_nothing(
    seeded: JobQueue, redis_client: Any, command: tuple[str, ...], name: str
) -> None:
    before = keyspace(redis_client)
    result = invoke(seeded, *(name if arg == "{q}" else arg for arg in command))
    assert result.exit_code == 2, result.output
    assert "invalid queue name" in one_line_error(result)
    assert keyspace(redis_client) == before


def test_a_malformed_queue_name_is_a_config_error_in_the_client_not_a_missing_run(
    seeded: JobQueue,
) -> None:
    with pytest.raises(ConfigError, match="invalid queue name"):
        seeded.find_run("seed", queue="bad name")


@pytest.mark.parametrize("page", ["/runs", "/leases", "/dead", "/run?id=seed&"])
def test_a_malformed_queue_name_is_a_400_on_the_dashboard(seeded: JobQueue, page: str) -> None:
    sep = "&" if "?" in page else "?"
    reply = TestClient(create_app(seeded)).get(f"{page}{sep}queue=bad%20name")
    assert reply.status_code == 400
    assert "invalid queue name" in reply.text


def test_a_dashboard_search_for_text_no_run_id_can_be_lists_the_runs_containing_it(
    seeded: JobQueue,
) -> None:
    reply = TestClient(create_app(seeded)).get("/runs?q=" + "x" * 600)
    assert reply.status_code == 200
    assert "No runs." in reply.text


# -- enqueue --from-file -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "line"),
    [
        (b"\xff\xfe{}\n", 1),
        (b'{"args": [1]}\n{"args": ["\xc3\x28"]}\n', 2),
        (b'{}\n\n{"run_id": "a\x80"}', 3),  # after a blank line, without a final newline
    ],
    ids=["bad-start-byte", "bad-continuation", "last-line"],
)
def test_a_file_line_that_is_not_utf8_is_one_line_exit_2_naming_it_and_writes_nothing(
    seeded: JobQueue, redis_client: Any, tmp_path: Path, content: bytes, line: int
) -> None:
    path = tmp_path / "runs.jsonl"
    path.write_bytes(content)
    before = keyspace(redis_client)
    result = invoke(seeded, "enqueue", "t", "--from-file", str(path))
    assert result.exit_code == 2
    assert one_line_error(result).startswith(f"error: {path} line {line}: not valid UTF-8")
    assert keyspace(redis_client) == before


def test_stdin_that_is_not_utf8_is_one_line_exit_2_and_writes_nothing(
    seeded: JobQueue, redis_client: Any
) -> None:
    before = keyspace(redis_client)
    result = invoke(seeded, "enqueue", "t", "--from-file", "-", input=b'{}\n{"args": ["\xe9"]}\n')
    assert result.exit_code == 2
    assert one_line_error(result).startswith("error: <stdin> line 2: not valid UTF-8")
    assert keyspace(redis_client) == before


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("{not json", "not valid JSON"),
        ('{"args": 5}', "args must be a JSON array"),
        ('{"run_id": 7}', "run_id must be a string"),
        ('{"args": [{"a": NaN}]}', "not JSON-serialisable"),
        ("[" * 100_000, "JSON nested too deeply"),
    ],
)
def test_a_bad_file_line_is_one_error_line_not_a_usage_message(
    seeded: JobQueue, redis_client: Any, line: str, problem: str
) -> None:
    before = keyspace(redis_client)
    result = invoke(seeded, "enqueue", "t", "--from-file", "-", input=f"{{}}\n{line}\n")
    assert result.exit_code == 2
    assert one_line_error(result).startswith("error: <stdin> line 2: ")
    assert problem in result.stderr
    assert keyspace(redis_client) == before


# -- URLs -------------------------------------------------------------------------------------

BAD_URLS = [
    "redis://[::1/0",
    "redis://user:s3cret@[::1/0",
    "rediss+cluster://[x",
    "redis://ho\uff0fst/0",  # a fullwidth solidus: NFKC makes it '/', inside the host
]


@pytest.mark.parametrize("url", BAD_URLS)
def test_a_url_urllib_cannot_split_is_one_line_exit_2_without_the_password(url: str) -> None:
    result = CliRunner().invoke(main, ["--redis-url", url, "queues"])
    assert result.exit_code == 2
    assert one_line_error(result).startswith("error: bad Redis URL")
    assert "s3cret" not in result.output


@pytest.mark.parametrize("url", BAD_URLS)
def test_a_url_urllib_cannot_split_is_a_config_error_in_both_clients(url: str) -> None:
    with pytest.raises(ConfigError, match="bad Redis URL"):
        JobQueue.from_url(url)
    with pytest.raises(ConfigError, match="bad Redis URL"):
        AsyncJobQueue.from_url(url)


def test_a_url_urllib_cannot_split_in_the_environment_is_one_line_exit_2(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("JOBQUEUE_REDIS_URL", "redis://[::1/0")
    result = CliRunner().invoke(main, ["show", "r"])
    assert result.exit_code == 2
    assert one_line_error(result).startswith("error: bad Redis URL")


# -- payloads: what is stored is exactly what was given ------------------------------------------

# (args, kwargs, the path the error names, the key as JSON would have stored it)
NON_STRING_KEYS = [
    ([{1: "a"}], {}, "args[0]", '"1"'),
    ([], {"flags": {True: 1}}, "kwargs['flags']", '"true"'),
    ([[{"a": [{None: 2}]}]], {}, "args[0][0]['a'][0]", '"null"'),
    ([(1, {2.5: 3})], {}, "args[0][1]", '"2.5"'),
    ([{"ok": 1, 7: 2}], {}, "args[0]", '"7"'),
]


@pytest.mark.parametrize(("args", "kwargs", "path", "stored"), NON_STRING_KEYS)
def test_a_non_string_dict_key_in_the_arguments_is_refused_naming_its_path_and_writes_nothing(
    seeded: JobQueue,
    redis_client: Any,
    args: list[Any],
    kwargs: dict[str, Any],
    path: str,
    stored: str,
) -> None:
    before = keyspace(redis_client)
    with pytest.raises(PayloadError) as refused:
        seeded.enqueue_many([Request("t", args, kwargs, run_id="r")])
    assert f" in {path} is not a string" in str(refused.value)
    assert f"stored as {stored}" in str(refused.value)
    assert keyspace(redis_client) == before


def test_a_non_string_keyword_key_is_refused_even_at_the_top_of_kwargs(
    seeded: JobQueue, redis_client: Any
) -> None:
    before = keyspace(redis_client)
    with pytest.raises(PayloadError, match=r"key 1 \(int\) in kwargs is not a string"):
        seeded.enqueue_many([Request("t", (), {1: "a"})])  # type: ignore[dict-item]
    assert keyspace(redis_client) == before


def test_a_schedule_whose_arguments_have_a_non_string_key_is_refused_and_writes_nothing(
    seeded: JobQueue, redis_client: Any
) -> None:
    before = keyspace(redis_client)
    with pytest.raises(PayloadError, match=r"in args\[0\] is not a string"):
        seeded.schedule("nightly", "t", every=60, args=[{1: "a"}])
    assert keyspace(redis_client) == before


def test_a_task_result_with_a_non_string_key_is_refused_naming_its_path() -> None:
    with pytest.raises(PayloadError, match=r"task result: key True \(bool\) in result\['x'\]"):
        encode_result({"x": {True: 1}})


def test_a_run_whose_task_returns_a_non_string_key_goes_dead_naming_the_key(
    jq: JobQueue,
) -> None:
    @jq.task(max_attempts=3)
    def counts() -> dict[int, str]:
        return {1: "a"}

    with running(make_worker(jq)):
        run = finished(jq, jq.enqueue(counts).run_id)
    assert (run.state, run.attempt, run.result) == ("dead", 1, None)
    assert run.error is not None and "key 1 (int) in result is not a string" in run.error


def test_string_keys_nested_anywhere_are_stored_exactly(seeded: JobQueue) -> None:
    args = [{"a": [{"b": {"c": (1, 2)}}]}, [[{}]]]
    run = seeded.get_run(seeded.enqueue("t", *args, k={"x": {"y": None}}).run_id)
    assert run.args == [{"a": [{"b": {"c": (1, 2)}}]}, [[{}]]]
    assert run.kwargs == {"k": {"x": {"y": None}}}


# -- one line, whatever the argument holds --------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ("schedules", "add", "j", "t", "--cron", "0\r0"),
        ("schedules", "add", "j", "t", "--every", "60", "--tz", "Mars\nOlympus"),
        ("schedules", "add", "j", "t", "--every", "60", "--misfire", "often\nand more"),
    ],
    ids=["cron", "tz", "misfire"],
)
def test_an_error_quoting_a_line_break_from_the_arguments_stays_one_line(
    seeded: JobQueue, redis_client: Any, args: tuple[str, ...]
) -> None:
    before = keyspace(redis_client)
    result = invoke(seeded, *args)
    assert result.exit_code == 2
    assert "\\" in one_line_error(result)  # the break is shown escaped
    assert keyspace(redis_client) == before


@pytest.mark.parametrize(
    "args",
    [("runs", "--state", "x\ny"), ("schedules", "add", "j", "--", "t", "extra\n")],
    ids=["choice", "extra-argument"],
)
def test_a_usage_error_quoting_a_line_break_stays_clicks_three_lines(
    seeded: JobQueue, args: tuple[str, ...]
) -> None:
    result = invoke(seeded, *args)
    assert result.exit_code == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert [line.split(" ")[0] for line in lines] == ["Usage:", "Try", "Error:"], result.stderr


# -- a question not answered yes ------------------------------------------------------------------


@pytest.mark.parametrize("answer", ["n\n", "", "maybe\n"], ids=["no", "end-of-input", "garbage"])
@pytest.mark.parametrize(
    "command", [("dead", "purge", "seed"), ("schedules", "remove", "nightly")], ids=" ".join
)
def test_a_question_not_answered_yes_is_one_error_line_exit_1_and_writes_nothing(
    seeded: JobQueue, redis_client: Any, command: tuple[str, ...], answer: str
) -> None:
    seeded.schedule("nightly", "t", every=60)
    before = keyspace(redis_client)
    result = invoke(seeded, *command, input=answer)
    assert result.exit_code == 1
    assert one_line_error(result) == (
        "error: not confirmed: nothing changed (--yes skips the question)"
    )
    assert keyspace(redis_client) == before
