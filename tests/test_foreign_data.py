"""Foreign or corrupt data in jobqueue's own keys (a key of another type, a garbage field, a
garbage JSON definition, a partition count that is not one): every reading path (CLI
listings and ``show``, dashboard pages, ``jobqueue.queries``, the client's listing methods,
metrics) reports it as an anomaly of the item it concerns and goes on; a command that cannot
do what was asked because of it is refused in one line (exit 1) and writes nothing. Never a
traceback, never a hang."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import pytest
import redis
from click.testing import CliRunner, Result
from keyspace import keyspace
from starlette.testclient import TestClient

from jobqueue.cli import State, main
from jobqueue.client.aio import AsyncJobQueue
from jobqueue.client.sync import JobQueue
from jobqueue.dashboard.app import create_app
from jobqueue.errors import ConfigError, CorruptData, RunNotFound
from jobqueue.ops import queries
from jobqueue.recurring.definitions import SCHED_CONFIG_KEY
from jobqueue.runtime.metrics import PrometheusMetrics
from jobqueue.store.embedded import EmbeddedServer
from jobqueue.store.keys import MAX_PARTITIONS, QUEUES_KEY, WORKERS_KEY, PartitionKeys
from jobqueue.store.runs import CLAIM

# What this module checks does not depend on the backend: run on the real server only
# (real_only, tests/conftest.py); the scripts and the client API are tested on fakeredis too.
pytestmark = pytest.mark.real_only

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
    jq.enqueue(jq.resolve_task("t").with_options(run_id="held"), 1)
    jq.enqueue(jq.resolve_task("t").with_options(run_id="waiting"), 2)
    claimed = CLAIM.parse(jq.scripts.run(CLAIM.call(P0, 1, "w-1", 30_000, 60_000)))
    assert [r.run_id for r in claimed.runs] == ["held"]
    return jq


LISTINGS = [
    ("queues",),
    ("queues", "--json"),
    ("runs",),
    ("runs", "--json"),
    ("leases",),
    ("dead", "list"),
    ("top", "--once"),
    ("top", "--json"),
]
RUN_COMMANDS = [("show", "waiting"), ("cancel", "waiting"), ("requeue", "waiting")]


# -- partition counts in jq:queues ----------------------------------------------------------------


BAD_COUNTS = ["x", "0", "-1", "1.5", " 1", str(MAX_PARTITIONS + 1), "99999999"]


@pytest.mark.parametrize("count", BAD_COUNTS)
@pytest.mark.parametrize("command", LISTINGS, ids=" ".join)
def test_a_partition_count_that_is_not_one_is_an_anomaly_of_every_listing(
    seeded: JobQueue, redis_client: Any, command: tuple[str, ...], count: str
) -> None:
    redis_client.hset(QUEUES_KEY, "default", count)
    result = invoke(seeded, *command)
    if command[0] == "top":  # the frame (or the JSON) says it: stderr would tear the screen
        assert "partition count" in result.stdout
        listed(result)
    else:
        (line,) = listed(result)
        assert line == (
            f"anomaly: jq:queues: field 'default': partition count {count!r} is not an "
            f"integer from 1 to {MAX_PARTITIONS}"
        )


def test_a_huge_partition_count_is_never_iterated(seeded: JobQueue, redis_client: Any) -> None:
    redis_client.hset(QUEUES_KEY, "evil", "99999999")
    started = time.monotonic()
    for command in LISTINGS:
        listed(invoke(seeded, *command))
    queries.throughput(seeded)
    assert time.monotonic() - started < 10
    # The healthy queue is still listed whole.
    assert {r["run_id"] for r in json.loads(invoke(seeded, "runs", "--json").stdout)} == {
        "held",
        "waiting",
    }


@pytest.mark.parametrize("command", RUN_COMMANDS, ids=" ".join)
def test_a_run_in_a_queue_whose_count_is_unusable_is_not_found_saying_what_was_not_searched(
    seeded: JobQueue, redis_client: Any, command: tuple[str, ...]
) -> None:
    redis_client.hset(QUEUES_KEY, "default", "x")
    before = keyspace(redis_client)
    line = refused(invoke(seeded, *command))
    assert "not searched: jq:queues: field 'default': partition count 'x'" in line
    assert keyspace(redis_client) == before


@pytest.mark.parametrize("command", RUN_COMMANDS, ids=" ".join)
def test_naming_a_queue_whose_count_is_unusable_is_refused_and_writes_nothing(
    seeded: JobQueue, redis_client: Any, command: tuple[str, ...]
) -> None:
    redis_client.hset(QUEUES_KEY, "default", "x")
    before = keyspace(redis_client)
    line = refused(invoke(seeded, *command, "--queue", "default"))
    assert line.startswith("error: cannot look in queue 'default': jq:queues: field 'default'")
    assert keyspace(redis_client) == before


@pytest.mark.parametrize("count", ["x", "99999999"])
def test_enqueue_to_a_queue_whose_count_is_unusable_is_refused_and_writes_nothing(
    seeded: JobQueue, redis_client: Any, count: str
) -> None:
    redis_client.hset(QUEUES_KEY, "default", count)
    before = keyspace(redis_client)
    line = refused(invoke(JobQueue(redis_client), "enqueue", "t", "--run-id", "new"))
    assert f"jq:queues field 'default': partition count {count!r}" in line
    assert keyspace(redis_client) == before


def test_register_queue_refuses_a_stored_count_above_the_maximum(
    jq: JobQueue, redis_client: Any
) -> None:
    redis_client.hset(QUEUES_KEY, "big", str(MAX_PARTITIONS + 1))
    with pytest.raises(CorruptData, match="partition count '16385' is not an integer"):
        jq.register_queue("big")


def test_a_count_already_read_is_adopted_and_checked_like_the_stored_text(jq: JobQueue) -> None:
    assert jq.adopt_partition_count("q", 4) == 4
    assert jq.partitions_of("q") == 4
    with pytest.raises(CorruptData, match="partition count '99999999' is not an integer"):
        jq.adopt_partition_count("big", 99999999)


def test_a_partition_count_above_the_maximum_is_refused_in_code() -> None:
    with pytest.raises(ConfigError, match=f"an integer from 1 to {MAX_PARTITIONS}"):
        JobQueue(partitions={"big": MAX_PARTITIONS + 1})
    assert JobQueue(partitions={"big": MAX_PARTITIONS}).partitions_of("big") == MAX_PARTITIONS


def test_repartition_with_jq_queues_of_another_type_is_refused_and_writes_nothing(
    seeded: JobQueue, redis_client: Any
) -> None:
    redis_client.delete(QUEUES_KEY)
    redis_client.set(QUEUES_KEY, "not a hash")
    before = keyspace(redis_client)
    line = refused(invoke(seeded, "repartition", "default", "--partitions", "2", "--yes"))
    assert line == "error: jq:queues is not a hash; nothing moved"
    assert keyspace(redis_client) == before


def test_repartition_of_a_queue_whose_count_is_unusable_is_refused_and_writes_nothing(
    seeded: JobQueue, redis_client: Any
) -> None:
    redis_client.hset(QUEUES_KEY, "default", "x")
    before = keyspace(redis_client)
    line = refused(invoke(seeded, "repartition", "default", "--partitions", "2", "--yes"))
    assert line.endswith("partition count 'x' is not an integer from 1 to 16384; nothing moved")
    assert keyspace(redis_client) == before


def test_jq_queues_of_another_type_is_an_anomaly_of_listings_and_refuses_enqueue(
    seeded: JobQueue, redis_client: Any
) -> None:
    redis_client.delete(QUEUES_KEY)
    redis_client.set(QUEUES_KEY, "not a hash")
    assert listed(invoke(seeded, "runs")) == [
        "anomaly: jq:queues: not a hash: no queue can be read"
    ]
    before = keyspace(redis_client)
    assert "jq:queues is not a hash" in refused(invoke(JobQueue(redis_client), "enqueue", "t"))
    assert keyspace(redis_client) == before


def test_the_async_client_reports_an_unusable_count_like_the_sync_one(
    real_server: EmbeddedServer,
) -> None:
    admin = redis.Redis.from_url(real_server.url, decode_responses=True)
    admin.flushall()
    admin.hset(QUEUES_KEY, "default", "x")

    async def scenario() -> None:
        ajq = AsyncJobQueue.from_url(real_server.url)
        ajq.declare_task("t")
        try:
            assert await ajq.queues() == {}
            with pytest.raises(RunNotFound, match="not searched: jq:queues: field 'default'"):
                await ajq.get_run("waiting")
            with pytest.raises(CorruptData, match="partition count 'x'"):
                await ajq.enqueue("t")
        finally:
            await ajq.close()

    asyncio.run(scenario())
    assert admin.keys("*") == [QUEUES_KEY]


# -- keys of another type, garbage fields ---------------------------------------------------------


# The partition keys each listing reads (an anomaly is reported by those that meet it).
READS = {
    "queues": {"due", "leases", "dead", "done", "stats", "waiting"},
    "top": {"due", "leases", "dead", "done", "stats", "waiting"},
    "runs": {"due", "leases", "dead", "done", "waiting"},
    "leases": {"leases"},
    "dead": {"dead"},
}


@pytest.mark.parametrize("suffix", ["due", "leases", "dead", "done", "stats", "waiting"])
@pytest.mark.parametrize("command", LISTINGS, ids=" ".join)
def test_a_partition_key_of_another_type_is_an_anomaly_and_the_rest_is_listed(
    seeded: JobQueue, redis_client: Any, suffix: str, command: tuple[str, ...]
) -> None:
    key = P0.prefix + suffix
    redis_client.delete(key)
    redis_client.set(key, "foreign")
    result = invoke(seeded, *command)
    listed(result)
    kind = "hash" if suffix == "stats" else "sorted set"
    problem = f"holds another type, not a {kind}"
    if command == ("top", "--json"):
        found = json.loads(result.stdout)["anomalies"]
        assert {"key": key, "problem": problem} in found
    else:
        assert (f"{key}: {problem}" in result.output) == (suffix in READS[command[0]])
    if command == ("runs", "--json"):  # what the other indexes hold is still listed
        ids = {r["run_id"] for r in json.loads(result.stdout)}
        assert ids == {"held", "waiting"} - {"due": {"waiting"}, "leases": {"held"}}.get(
            suffix, set()
        )


def test_a_garbage_counter_is_an_anomaly_of_its_partition_and_the_others_are_counted(
    seeded: JobQueue, redis_client: Any
) -> None:
    redis_client.hset(P0.stats, "completed", "many")
    result = invoke(seeded, "queues", "--json")
    assert listed(result) == [
        "anomaly: jq:{default#0}:stats: field 'completed' is 'many', not a counter"
    ]
    (row,) = json.loads(result.stdout)
    assert row["counters"]["created"] == 2 and "completed" not in row["counters"]
    assert row["anomalies"] == [
        {"key": P0.stats, "problem": "field 'completed' is 'many', not a counter"}
    ]


def test_a_garbage_counter_marks_its_row_in_the_queues_table(
    seeded: JobQueue, redis_client: Any
) -> None:
    redis_client.hset(P0.stats, "completed", "many")
    header, row = invoke(seeded, "queues").stdout.splitlines()
    assert header.endswith("ANOMALY")
    assert row.endswith("stats: field 'completed' is 'many', not a counter")


@pytest.mark.parametrize("score", ["-inf", "+inf"])
def test_an_infinite_score_in_an_index_is_an_anomaly_not_an_overflow(
    seeded: JobQueue, redis_client: Any, score: str
) -> None:
    redis_client.zadd(P0.due, {"odd": float(score)})
    redis_client.zadd(P0.leases, {"odd": float(score)})
    for command in LISTINGS:
        listed(invoke(seeded, *command))
    assert "member 'odd' has score" in invoke(seeded, "leases").stderr


@pytest.mark.parametrize("score", [2.0**63, 1e300, -5.0])
def test_a_score_no_date_can_show_is_an_anomaly_of_every_listing_and_page(
    seeded: JobQueue, redis_client: Any, score: float
) -> None:
    redis_client.zadd(P0.leases, {"odd": score})
    redis_client.zadd(P0.due, {"odd": score})
    for command in LISTINGS:
        listed(invoke(seeded, *command))
    assert f"member 'odd' has score {score!r}" in invoke(seeded, "leases").stderr
    for page in ("/leases", "/queues", "/runs"):
        assert TestClient(create_app(seeded)).get(page).status_code == 200


def test_a_time_field_no_date_can_show_is_shown_as_a_number_and_an_anomaly(
    seeded: JobQueue, redis_client: Any
) -> None:
    redis_client.hset(P0.run("waiting"), "due", "99999999999999999")
    result = invoke(seeded, "show", "waiting")
    assert listed(result) == [
        f"anomaly: {P0.run('waiting')}: field 'due' is '99999999999999999', not a time in ms"
    ]
    assert "99999999999999999 ms (not a date)" in result.stdout
    assert TestClient(create_app(seeded)).get("/run?id=waiting").status_code == 200


def test_show_marks_a_garbage_field_of_the_record(seeded: JobQueue, redis_client: Any) -> None:
    redis_client.hset(P0.run("waiting"), "fence", "abc")
    result = invoke(seeded, "show", "waiting")
    problem = "field 'fence' is 'abc', not an integer"
    assert listed(result) == [f"anomaly: {P0.run('waiting')}: {problem}"]
    assert f"anomaly      {P0.run('waiting')}: {problem}" in result.stdout
    shown = json.loads(invoke(seeded, "show", "waiting", "--json").stdout)
    assert shown["anomalies"] == [{"key": P0.run("waiting"), "problem": problem}]


def test_a_history_key_of_another_type_is_an_anomaly_of_show(
    seeded: JobQueue, redis_client: Any
) -> None:
    redis_client.set(P0.history("waiting"), "foreign")
    assert listed(invoke(seeded, "show", "waiting")) == [
        f"anomaly: {P0.history('waiting')}: holds another type, not a list"
    ]


def test_runs_marks_a_record_of_another_type_and_lists_the_others(
    seeded: JobQueue, redis_client: Any
) -> None:
    redis_client.delete(P0.run("waiting"))
    redis_client.set(P0.run("waiting"), "foreign")
    result = invoke(seeded, "runs")
    assert listed(result) == [
        f"anomaly: {P0.run('waiting')}: holds another type, not a hash (not a run record)"
    ]
    table, _, footer = result.stdout.partition("\n\n")
    header, *rows = table.splitlines()
    assert header.endswith("ANOMALY") and len(rows) == 2
    assert footer.startswith("2 shown of 2")


def test_dead_retry_of_a_record_of_another_type_is_refused_not_a_traceback(
    seeded: JobQueue, redis_client: Any
) -> None:
    redis_client.delete(P0.run("waiting"))
    redis_client.set(P0.run("waiting"), "foreign")
    result = invoke(seeded, "dead", "retry", "waiting")
    no_traceback(result)
    assert result.exit_code == 1
    assert result.stderr == (
        "error: refused waiting: is not a run record; only dead runs retry\n"
    )


def test_a_garbage_worker_entry_is_an_anomaly_naming_its_field(
    seeded: JobQueue, redis_client: Any
) -> None:
    redis_client.hset(WORKERS_KEY, "w-9", "{garbage")
    redis_client.hset(WORKERS_KEY, "w-10", json.dumps({"id": "w-10", "last_seen_ms": 1e400}))
    queues_text = {"id": "w-11", "last_seen_ms": 1, "queues": "abc"}  # not a list of queues
    redis_client.hset(WORKERS_KEY, "w-11", json.dumps(queues_text))
    redis_client.hset(WORKERS_KEY, "w-12", "-1")  # JSON, but not an object
    lines = listed(invoke(seeded, "workers"))
    assert [line.split(" is not")[0] for line in lines] == [
        "anomaly: jq:workers: field 'w-10'",
        "anomaly: jq:workers: field 'w-11'",
        "anomaly: jq:workers: field 'w-12'",
        "anomaly: jq:workers: field 'w-9'",
    ]


def test_jq_workers_of_another_type_is_an_anomaly(seeded: JobQueue, redis_client: Any) -> None:
    redis_client.set(WORKERS_KEY, "foreign")
    assert listed(invoke(seeded, "workers")) == [
        "anomaly: jq:workers: holds another type, not a hash"
    ]
    listed(invoke(seeded, "leases"))  # which reads the registry for hosts


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


def test_a_job_whose_next_fire_score_is_fractional_can_be_removed(
    scheduled: JobQueue, redis_client: Any
) -> None:
    """Found by the hostile-data fuzz: the removal compared a whole ms with the stored 0.5
    and gave up as 'kept changing', the job left in place."""
    redis_client.zadd("jq:{sched#0}:next", {"good": 0.5})
    result = invoke(scheduled, "schedules", "remove", "good", "--yes")
    assert result.exit_code == 0, result.output
    assert scheduled.get_schedule("good") is None
    assert redis_client.zscore("jq:{sched#0}:next", "good") is None


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


def test_a_first_schedule_refused_over_foreign_data_records_nothing(
    jq: JobQueue, redis_client: Any
) -> None:
    redis_client.set("jq:{sched#0}:next", "foreign")
    before = keyspace(redis_client)
    line = refused(invoke(jq, "schedules", "add", "nightly", "t", "--every", "60"))
    assert "jq:{sched#0}:next is not a sorted set" in line
    assert keyspace(redis_client) == before


def test_the_first_write_records_the_scheduler_partition_count(
    jq: JobQueue, redis_client: Any
) -> None:
    jq.declare_task("t")
    assert jq.get_schedule("nightly") is None
    assert redis_client.exists(SCHED_CONFIG_KEY) == 0
    jq.schedule("nightly", "t", every=60)
    assert redis_client.hget(SCHED_CONFIG_KEY, "partitions") == "1"


# -- groups (fair shares) -------------------------------------------------------------------------


@pytest.fixture
def grouped(jq: JobQueue) -> JobQueue:
    """Fair shares on in 'default'; group 'a' holds one run waiting and one running."""
    jq.declare_task("t")
    jq.set_fair_shares("default")
    for run_id in ("a-held", "a-waiting"):
        jq.enqueue(jq.resolve_task("t").with_options(run_id=run_id, limit_key="a"))
    claimed = CLAIM.parse(jq.scripts.run(CLAIM.call(P0, 1, "w-1", 30_000, 60_000)))
    assert [r.run_id for r in claimed.runs] == ["a-held"]
    return jq


def test_a_gconf_of_another_type_is_an_anomaly_of_the_groups_listing_which_goes_on(
    grouped: JobQueue, redis_client: Any
) -> None:
    redis_client.delete(P0.gconf)
    redis_client.set(P0.gconf, "foreign")
    found = grouped.groups("default")
    assert [(g.name, g.waiting, g.running, g.served) for g in found] == [("a", 1, 1, 1)]
    assert [str(a) for a in found.anomalies] == [f"{P0.gconf}: holds another type, not a hash"]


def test_fair_shares_over_a_gconf_of_another_type_read_as_off(
    grouped: JobQueue, redis_client: Any
) -> None:
    redis_client.delete(P0.gconf)
    redis_client.set(P0.gconf, "foreign")
    assert grouped.fair_shares("default") is False


@pytest.mark.parametrize(
    ("key", "field", "value", "read_as"),
    [
        ("gconf", "w:a", "\u00b2", ("weight", 1)),  # str.isdigit() says yes, int() says no
        ("gconf", "w:a", "0", ("weight", 1)),
        ("gconf", "max:a", "lots", ("max_size", None)),
        ("gserved", "a", "\u00b2", ("served", 0)),
        ("gserved", "a", "-5", ("served", 0)),
    ],
)
def test_a_garbage_group_setting_or_count_marks_its_group_and_reads_as_the_default(
    grouped: JobQueue, redis_client: Any, key: str, field: str, value: str,
    read_as: tuple[str, Any],
) -> None:  # fmt: skip
    redis_client.hset(getattr(P0, key), field, value)
    (group,) = grouped.groups("default")
    assert getattr(group, read_as[0]) == read_as[1]
    assert [str(a) for a in group.anomalies] == [
        f"{getattr(P0, key)}: field {field!r} is {value!r}, not a "
        + {"w": "weight", "max": "max_size"}.get(field.split(":")[0], "count")
    ]


def test_a_group_queue_of_another_type_marks_its_group_and_the_others_are_counted(
    grouped: JobQueue, redis_client: Any
) -> None:
    grouped.enqueue(grouped.resolve_task("t").with_options(run_id="b-1", limit_key="b"))
    redis_client.delete(P0.gq("a"))
    redis_client.set(P0.gq("a"), "foreign")
    got = {g.name: g for g in grouped.groups("default")}
    assert (got["a"].waiting, got["b"].waiting) == (0, 1)
    assert [str(a) for a in got["a"].anomalies] == [
        f"{P0.gq('a')}: holds another type, not a sorted set"
    ]


def test_groups_list_reports_foreign_data_on_stderr_and_lists_the_groups(
    grouped: JobQueue, redis_client: Any
) -> None:
    redis_client.hset(P0.gserved, "a", "many")
    result = invoke(grouped, "groups", "list", "default", "--json")
    assert listed(result) == [f"anomaly: {P0.gserved}: field 'a' is 'many', not a count"]
    assert [json.loads(line)["group"] for line in result.stdout.splitlines()] == ["a"]


# -- the dashboard --------------------------------------------------------------------------------

PAGES = ["/queues", "/runs", "/leases", "/dead", "/workers", "/schedules", "/flows",
         "/run?id=waiting"]


def corrupt_everything(redis_client: Any) -> None:
    """One of each kind of foreign data, none touching the run 'waiting' itself."""
    redis_client.hset(QUEUES_KEY, "evil", "99999999")
    redis_client.hset(P0.stats, "completed", "many")
    redis_client.delete(P0.dead)
    redis_client.set(P0.dead, "foreign")
    redis_client.hset(WORKERS_KEY, "w-9", "{garbage")
    redis_client.hset(DEF, "bad", "{garbage")
    redis_client.hset(P0.run("waiting"), "fence", "abc")
    redis_client.rpush(P0.history("waiting"), "\u00b2 odd line")
    redis_client.hset(P0.run("waiting"), "hist", "1")


@pytest.mark.parametrize("page", PAGES)
def test_every_dashboard_page_lists_the_anomalies_it_met_and_renders(
    scheduled: JobQueue, redis_client: Any, page: str
) -> None:
    corrupt_everything(redis_client)
    reply = TestClient(create_app(scheduled)).get(page)
    assert reply.status_code == 200, reply.text
    assert 'id="anomalies"' in reply.text


def test_the_dashboard_marks_the_run_whose_record_has_a_garbage_field(
    scheduled: JobQueue, redis_client: Any
) -> None:
    corrupt_everything(redis_client)
    page = TestClient(create_app(scheduled)).get("/runs").text
    assert 'title="jq:{default#0}:run:waiting: field &#39;fence&#39; is &#39;abc&#39;' in page


def test_the_queue_page_lists_a_gconf_of_another_type_and_still_shows_the_groups(
    grouped: JobQueue, redis_client: Any
) -> None:
    redis_client.delete(P0.gconf)
    redis_client.set(P0.gconf, "foreign")
    reply = TestClient(create_app(grouped)).get("/queue?name=default")
    assert reply.status_code == 200, reply.text
    box = reply.text.split('id="anomalies"')[1].split("</section>")[0]
    assert P0.gconf in box and 'id="groups-table"' in reply.text


def test_the_dashboard_marks_the_group_whose_setting_is_garbage(
    grouped: JobQueue, redis_client: Any
) -> None:
    redis_client.hset(P0.gconf, "w:a", "heavy")
    page = TestClient(create_app(grouped)).get("/queue?name=default").text
    assert "<td>a <span class=\"anomaly\" title=\"jq:{default#0}:gconf: field &#39;w:a&#39;" in page


# -- metrics --------------------------------------------------------------------------------------


def test_metrics_refresh_logs_each_anomaly_once_and_counts_the_readable_queues(
    seeded: JobQueue, redis_client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    pytest.importorskip("prometheus_client")
    seeded.register_queue("other")
    redis_client.hset(QUEUES_KEY, "other", "x")
    redis_client.hset(P0.stats, "lease_expired", "lots")
    metrics = PrometheusMetrics("worker")
    with caplog.at_level(logging.WARNING, logger="jobqueue.metrics"):
        for _ in range(3):
            metrics.refresh_depth(seeded, ["other", "default", "gone"])
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 3 and len(set(warnings)) == 3, warnings
    for state in ("due", "running"):
        labels = {"queue": "default", "state": state}
        assert metrics.registry.get_sample_value("jobqueue_queue_runs", labels) == 1


def test_metrics_refresh_logs_a_gconf_of_another_type_once_and_exports_no_groups(
    grouped: JobQueue, redis_client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    pytest.importorskip("prometheus_client")
    redis_client.delete(P0.gconf)
    redis_client.set(P0.gconf, "foreign")
    metrics = PrometheusMetrics("worker")
    with caplog.at_level(logging.WARNING, logger="jobqueue.metrics"):
        for _ in range(3):
            metrics.refresh_depth(grouped, ["default"])
    warnings = [r.getMessage() for r in caplog.records]
    assert warnings == [f"queue depth: {P0.gconf}: holds another type, not a hash"]
    labels = {"queue": "default", "group": "a", "state": "waiting"}
    assert metrics.registry.get_sample_value("jobqueue_group_runs", labels) is None
