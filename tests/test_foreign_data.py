"""Foreign or corrupt data in jobqueue's own keys (a key of another type, a garbage field, a
garbage JSON definition, a partition count that is not one): every reading path (CLI
listings and ``show``, dashboard pages, ``jobqueue.inspect``, the client's listing methods,
metrics) reports it as an anomaly of the item it concerns and goes on; a command that cannot
do what was asked because of it is refused in one line (exit 1) and writes nothing. Never a
traceback, never a hang."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner, Result
from keyspace import keyspace

from jobqueue import ops
from jobqueue.cli import State, main
from jobqueue.client import JobQueue
from jobqueue.keys import PartitionKeys
from jobqueue.recurring import SCHED_CONFIG_KEY

P0 = PartitionKeys("default", 0)
DEF = "jq:{sched#0}:def"


def invoke(jq: JobQueue, *args: str) -> Result:
    return CliRunner().invoke(main, list(args), obj=State(None, jq))


def no_traceback(result: Result) -> None:
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(
        result.exception
    )
    assert "Traceback" not in result.output


def listed(result: Result) -> list[str]:
    """The anomaly lines of a listing that succeeded (exit 0); nothing else on stderr."""
    no_traceback(result)
    assert result.exit_code == 0, result.output
    lines = result.stderr.splitlines()
    assert all(line.startswith("anomaly: ") for line in lines), result.stderr
    return lines


def refused(result: Result) -> str:
    """The one error line of a command refused (exit 1) because of corrupt data."""
    no_traceback(result)
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


@pytest.fixture
def seeded(jq: JobQueue) -> JobQueue:
    """Two runs in queue 'default': one pending ('waiting'), one running ('held')."""
    jq.declare_task("t")
    jq.enqueue("t", 1, run_id="held")
    jq.enqueue("t", 2, run_id="waiting")
    claimed = ops.parse_claim(jq.scripts.run(ops.claim_call(P0, 1, "w-1", 30_000, 60_000)))
    assert [r.run_id for r in claimed.runs] == ["held"]
    return jq


# -- recurring jobs -------------------------------------------------------------------------------


@pytest.fixture
def scheduled(seeded: JobQueue) -> JobQueue:
    seeded.schedule("good", "t", every=60)
    seeded.schedule("bad", "t", every=60)
    return seeded


GARBAGE_DEFINITIONS = [
    "{garbage",
    "[1, 2]",
    '{"task": "t"}',
    '{"task": "t", "queue": "default", "every_ms": "soon"}',
    '{"task": "t", "queue": "default", "every_ms": 60000, "jitter_ms": 1e400}',
    '{"task": "t", "queue": "default", "cron": "not a cron"}',
    '{"task": "t", "queue": "default", "every_ms": 60000, "tz": "Mars/Olympus"}',
    '{"task": "t", "queue": "bad name", "every_ms": 60000}',
    '{"task": "t", "queue": "default", "every_ms": 60000, "overlap": "sometimes"}',
    "[" * 100_000,
]


@pytest.mark.parametrize("text", GARBAGE_DEFINITIONS, ids=lambda t: t[:40])
def test_schedules_show_of_a_garbage_definition_is_one_line_naming_the_key(
    scheduled: JobQueue, redis_client: Any, text: str
) -> None:
    redis_client.hset(DEF, "bad", text)
    before = keyspace(redis_client)
    line = refused(invoke(scheduled, "schedules", "show", "bad"))
    assert line.startswith(f"error: recurring job 'bad' cannot be read: {DEF}: field 'bad'")
    assert keyspace(redis_client) == before


@pytest.mark.parametrize("text", GARBAGE_DEFINITIONS, ids=lambda t: t[:40])
def test_schedules_list_shows_the_usable_jobs_and_the_garbage_one_as_an_anomaly(
    scheduled: JobQueue, redis_client: Any, text: str
) -> None:
    redis_client.hset(DEF, "bad", text)
    result = invoke(scheduled, "schedules", "list", "--json")
    (line,) = listed(result)
    assert line.startswith("anomaly: jq:{sched#0}:def: field 'bad': definition")
    assert [j["job_id"] for j in json.loads(result.stdout)] == ["good"]
    assert [i.job_id for i in scheduled.list_schedules()] == ["good"]
    assert [a.key for a in scheduled.list_schedules().anomalies] == [DEF]


@pytest.mark.parametrize("command", ["pause", "resume", "trigger"])
def test_changing_a_job_whose_definition_is_garbage_is_refused_and_writes_nothing(
    scheduled: JobQueue, redis_client: Any, command: str
) -> None:
    redis_client.hset(DEF, "bad", "{garbage")
    before = keyspace(redis_client)
    assert "field 'bad': definition is not valid JSON" in refused(
        invoke(scheduled, "schedules", command, "bad")
    )
    assert keyspace(redis_client) == before


def test_a_job_whose_definition_is_garbage_can_be_removed(
    scheduled: JobQueue, redis_client: Any
) -> None:
    redis_client.hset(DEF, "bad", "{garbage")
    result = invoke(scheduled, "schedules", "remove", "bad", "--yes")
    assert result.exit_code == 0, result.output
    assert redis_client.hget(DEF, "bad") is None
    assert scheduled.get_schedule("good") is not None


def test_garbage_counters_of_a_job_mark_its_row(scheduled: JobQueue, redis_client: Any) -> None:
    redis_client.hset("jq:{sched#0}:state", "bad", "many times")
    result = invoke(scheduled, "schedules", "list")
    assert listed(result) == [
        "anomaly: jq:{sched#0}:state: field 'bad' is 'many times', not counters"
    ]
    rows = {line.split()[0]: line for line in result.stdout.splitlines()[1:]}
    assert rows["bad"].endswith("state: field 'bad' is 'many times', not counters")
    assert "anomaly" in invoke(scheduled, "schedules", "show", "bad").stdout


@pytest.mark.parametrize("stored", ["x", "0", "99999999"])
def test_a_garbage_scheduler_partition_count_is_one_error_line_for_schedule_commands(
    scheduled: JobQueue, redis_client: Any, stored: str
) -> None:
    redis_client.hset(SCHED_CONFIG_KEY, "partitions", stored)
    before = keyspace(redis_client)
    for command in (("list",), ("show", "good"), ("pause", "good"), ("remove", "good", "--yes")):
        line = refused(invoke(JobQueue(redis_client), "schedules", *command))
        assert f"jq:sched:config field 'partitions': partition count {stored!r}" in line
    assert keyspace(redis_client) == before


def test_a_recurring_keys_of_another_type_is_an_anomaly_of_the_listing(
    scheduled: JobQueue, redis_client: Any
) -> None:
    redis_client.delete("jq:{sched#0}:next")
    redis_client.set("jq:{sched#0}:next", "foreign")
    result = invoke(scheduled, "schedules", "list", "--json")
    assert listed(result) == ["anomaly: jq:{sched#0}:next: holds another type, not a sorted set"]
    assert [j["job_id"] for j in json.loads(result.stdout)] == ["bad", "good"]


# -- reading and refused commands write nothing ---------------------------------------------------

READ_OR_REFUSED = [
    ("schedules", "remove", "nope", "--yes"),
    ("schedules", "show", "nope"),
    ("schedules", "list"),
    ("schedules",),
    ("schedules", "pause", "nope"),
    ("schedules", "trigger", "nope"),
    ("schedules", "backfill", "nope", "--start", "2026-01-01T00:00Z", "--end", "2026-01-02T00:00Z"),
    ("show", "nope"),
    ("cancel", "nope"),
    ("runs",),
    ("queues",),
    ("workers",),
]


@pytest.mark.parametrize("command", READ_OR_REFUSED, ids=" ".join)
def test_a_reading_or_refused_command_on_an_empty_server_writes_no_key(
    jq: JobQueue, redis_client: Any, command: tuple[str, ...]
) -> None:
    result = invoke(jq, *command)
    no_traceback(result)
    assert result.exit_code in (0, 1), result.output
    assert keyspace(redis_client) == {}


def test_the_first_write_records_the_scheduler_partition_count(
    jq: JobQueue, redis_client: Any
) -> None:
    jq.declare_task("t")
    assert jq.get_schedule("nightly") is None
    assert redis_client.exists(SCHED_CONFIG_KEY) == 0
    jq.schedule("nightly", "t", every=60)
    assert redis_client.hget(SCHED_CONFIG_KEY, "partitions") == "1"
