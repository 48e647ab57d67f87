"""Property-based fuzzing of the public entry points: enqueue arguments and run ids, payload
contents, schedule definitions, and CLI arguments. Each call either succeeds or raises a typed
``jobqueue.errors`` error (the CLI: exits 0/1/2/3 without a traceback), and a refused call
writes nothing at all (not a byte: DUMP of every key is unchanged), and what is stored is what
was given (a dict key that is not a string is refused, not rewritten)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from keyspace import keyspace

from jobqueue import JobQueue, Request
from jobqueue.cli import main
from jobqueue.errors import InvalidRunId, JobQueueError, PayloadError
from jobqueue.payload import DEFAULT_MAX_PAYLOAD_BYTES, encode_payload
from jobqueue.store.embedded import EmbeddedServer

# What this module checks does not depend on the backend: run on the real server only
# (real_only, tests/conftest.py); the scripts and the client API are tested on fakeredis too.
pytestmark = pytest.mark.real_only

FUZZ = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

ODD_IDS = [
    "a b",
    "job@2026-11-29T00:00:00Z",
    "@",
    "@@",
    "{x}",
    "}{",
    "{default#0}",
    "ü-日本-🎉",
    "x" * 512,
    "x" * 513,
    "",
    "tab\tinside",
    "new\nline",
    "\x7f",
    "\ud800",  # a lone surrogate: not encodable, must be refused, not crash
    "a\udcffb",  # what surrogateescape makes of a non-UTF-8 byte in argv
    "*",
    "jq:{default#0}:due",
]
run_ids = st.sampled_from(ODD_IDS) | st.text(max_size=40) | st.text(min_size=500, max_size=520)

json_leaves = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=30)
)
odd_leaves = st.sampled_from([b"bytes", {1, 2}, object(), 1j, Ellipsis])
values = st.recursive(
    json_leaves | odd_leaves,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=8), inner, max_size=4)
        | st.tuples(inner, inner)
    ),
    max_leaves=20,
)
# Non-string keys are what json.dumps refuses or rewrites.
odd_kwargs = st.dictionaries(st.text(max_size=10) | st.integers(), values, max_size=4)


def typed_or_ok(action: Callable[[], Any], client: Any) -> Any:
    """Run action: success, or a typed error with nothing written (not a byte: DUMP of every
    key). Returns the result or the error."""
    before = keyspace(client)
    try:
        return action()
    except JobQueueError as exc:
        assert keyspace(client) == before, f"refused with {exc!r} but wrote something"
        return exc


def refuse(constant: str) -> Any:
    raise AssertionError(f"{constant} stored: not JSON")


def as_stored(value: Any) -> Any:
    """What a task gets back for ``value``: the same, tuples included (a dict key that is not
    a string is refused, never rewritten)."""
    if isinstance(value, tuple):
        return tuple(as_stored(v) for v in value)
    if isinstance(value, list):
        return [as_stored(v) for v in value]
    if isinstance(value, dict):
        assert all(isinstance(k, str) for k in value)
        return {k: as_stored(v) for k, v in value.items()}
    return value


@pytest.fixture
def fuzz_jq(jq: JobQueue) -> JobQueue:
    jq.declare_task("t")
    jq.enqueue(
        jq.resolve_task("t").with_options(run_id="seed")
    )  # the queue is registered: later writes are all runs
    jq.schedule("seed-job", "t", every=60)
    return jq


# -- enqueue -------------------------------------------------------------------------------


@FUZZ
@given(run_id=run_ids)
def test_enqueue_with_any_run_id_succeeds_or_raises_invalid_run_id(
    fuzz_jq: JobQueue, redis_client: Any, run_id: str
) -> None:
    result = typed_or_ok(lambda: fuzz_jq.enqueue(
        fuzz_jq.resolve_task("t").with_options(run_id=run_id), 1
    ), redis_client)
    if isinstance(result, JobQueueError):
        assert isinstance(result, InvalidRunId), result
        return
    run = fuzz_jq.get_run(run_id)
    assert (run.run_id, run.args) == (run_id, [1])
    # Idempotent: a second enqueue with the same id writes nothing.
    again = typed_or_ok(lambda: fuzz_jq.enqueue(
        fuzz_jq.resolve_task("t").with_options(run_id=run_id), 2
    ), redis_client)
    assert again.created is False
    assert fuzz_jq.get_run(run_id).args == [1]


@FUZZ
@given(args=st.lists(values, max_size=4), kwargs=odd_kwargs)
def test_enqueue_with_any_payload_stores_it_exactly_or_raises_payload_error(
    fuzz_jq: JobQueue, redis_client: Any, args: list[Any], kwargs: dict[Any, Any]
) -> None:
    result = typed_or_ok(lambda: fuzz_jq.enqueue_many([Request("t", args, kwargs)]), redis_client)
    if isinstance(result, JobQueueError):
        assert isinstance(result, PayloadError), result
        return
    run = fuzz_jq.get_run(result[0].run_id)
    assert run.args == as_stored(args)
    assert run.kwargs == as_stored(kwargs)
    json.loads(run.payload, parse_constant=refuse)  # strict JSON: no NaN or Infinity stored


@FUZZ
@given(
    delay=st.none() | st.floats() | st.integers(-(2**70), 2**70) | st.sampled_from(["5", [], True]),
    at=st.none() | st.floats() | st.integers(-(2**70), 2**70) | st.sampled_from(["now", {}]),
)
def test_enqueue_with_any_delay_or_instant_succeeds_or_raises_a_typed_error(
    fuzz_jq: JobQueue, redis_client: Any, delay: Any, at: Any
) -> None:
    result = typed_or_ok(lambda: fuzz_jq.enqueue(
        fuzz_jq.resolve_task("t").with_options(delay=delay, at=at)
    ), redis_client)
    if not isinstance(result, JobQueueError):
        assert fuzz_jq.get_run(result.run_id).state == "pending"


def test_one_bad_request_in_a_batch_writes_no_run_of_the_batch(
    fuzz_jq: JobQueue, redis_client: Any
) -> None:
    good = [Request("t", (i,), run_id=f"batch-{i}") for i in range(50)]
    bad = Request("t", (math.nan,), run_id="batch-bad")
    result = typed_or_ok(lambda: fuzz_jq.enqueue_many([*good, bad]), redis_client)
    assert isinstance(result, PayloadError)
    assert fuzz_jq.find_run("batch-0") is None


@pytest.mark.parametrize(
    "args",
    [
        ["x" * (DEFAULT_MAX_PAYLOAD_BYTES + 1)],
        [["y" * 1000] * 600],
        [{"k" * 100_000: "v" * 500_000}],
        ["é" * (DEFAULT_MAX_PAYLOAD_BYTES // 2)],  # 2 bytes each in UTF-8: over the limit
    ],
    ids=["one-huge-string", "many-strings", "huge-key-and-value", "multibyte"],
)
def test_payload_above_the_limit_is_refused_and_writes_nothing(
    fuzz_jq: JobQueue, redis_client: Any, args: list[Any]
) -> None:
    result = typed_or_ok(lambda: fuzz_jq.enqueue("t", *args), redis_client)
    assert isinstance(result, PayloadError) and "limit" in str(result)


def test_payload_just_under_the_limit_is_stored_whole(fuzz_jq: JobQueue) -> None:
    overhead = len(
        encode_payload(
            [
                "",
            ],
            {},
        )
    )
    text = "z" * (DEFAULT_MAX_PAYLOAD_BYTES - overhead)
    run = fuzz_jq.get_run(fuzz_jq.enqueue("t", text).run_id)
    assert run.args == [text]


@pytest.mark.parametrize("depth", [50, 100_000])
def test_deeply_nested_payload_is_stored_or_refused_with_payload_error(
    fuzz_jq: JobQueue, redis_client: Any, depth: int
) -> None:
    nested: Any = []
    for _ in range(depth):
        nested = [nested]
    result = typed_or_ok(lambda: fuzz_jq.enqueue(
        fuzz_jq.resolve_task("t").with_options(run_id=f"deep-{depth}"), nested
    ), redis_client)
    if depth > 1000:
        assert isinstance(result, PayloadError)
    else:
        assert fuzz_jq.get_run(f"deep-{depth}").args == [nested]


@pytest.mark.parametrize("text", ["\ud800", "ok \udcff", "\udfff\ud800"])
def test_text_that_is_not_unicode_is_refused_as_payload_error_not_mangled(
    fuzz_jq: JobQueue, redis_client: Any, text: str
) -> None:
    result = typed_or_ok(lambda: fuzz_jq.enqueue("t", text), redis_client)
    assert isinstance(result, PayloadError)


# -- schedule definitions ------------------------------------------------------------------

cron_fields = st.sampled_from(
    ["*", "*/5", "0", "59", "60", "1-5", "5-1", "MON", "foo", "?", "L", "#", "1,2", "*/0", "-1"]
)
crons = (
    st.lists(cron_fields, min_size=1, max_size=7).map(" ".join)
    | st.sampled_from(["@daily", "@hourly", "@reboot", "@every", "* * * * *", "0 0 31 2 *"])
    | st.text(max_size=20)
)
zones = st.sampled_from(
    ["UTC", "America/New_York", "Australia/Lord_Howe", "Asia/Hebron", "Mars/Olympus", "", "utc"]
) | st.text(max_size=15)
policies = st.sampled_from(
    ["fire-all", "fire-all:3", "fire-all:0", "fire-once", "skip", "deadline-30s", "deadline--1s"]
) | st.text(max_size=12)
seconds = st.none() | st.floats() | st.integers(-5, 10**12)


@FUZZ
@given(
    job_id=st.sampled_from(ODD_IDS) | st.text(max_size=20),
    cron=st.none() | crons,
    every=seconds,
    tz=zones,
    jitter=seconds,
    misfire=policies,
    overlap=st.sampled_from(["allow", "forbid", "buffer-one"]) | st.text(max_size=10),
    args=st.lists(values, max_size=2),
)
def test_schedule_with_any_definition_succeeds_or_raises_a_typed_error(
    fuzz_jq: JobQueue,
    redis_client: Any,
    job_id: str,
    cron: str | None,
    every: float | None,
    tz: str,
    jitter: float | None,
    misfire: str,
    overlap: str,
    args: list[Any],
) -> None:
    def action() -> Any:
        return fuzz_jq.schedule(
            job_id,
            "t",
            cron=cron,
            every=every,
            tz=tz,
            jitter=jitter,
            misfire=misfire,
            overlap=overlap,
            args=args,
        )

    result = typed_or_ok(action, redis_client)
    if not isinstance(result, JobQueueError):
        stored = fuzz_jq.get_schedule(job_id)
        assert stored is not None and stored.next_fire_ms is not None
        assert fuzz_jq.list_schedules()  # every stored definition still reads back


# -- the CLI -------------------------------------------------------------------------------

cli_text = st.sampled_from(ODD_IDS) | st.text(max_size=30)


def cli(url: str, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["--redis-url", url, *args])
    out = result.output  # stdout and stderr, interleaved
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        args,
        result.exception,
        out,
    )
    assert result.exit_code in (0, 1, 2, 3), (args, result.exit_code, out)
    assert "Traceback" not in out, (args, out)
    return result.exit_code, out


@FUZZ
@given(
    args=cli_text | st.sampled_from(["[1, NaN]", "[1e999]", "[" * 5000, '{"a":1}', "[]"]),
    kwargs=cli_text | st.sampled_from(['{"a": NaN}', "[]", '{"x":' * 3000, "{}"]),
    run_id=st.none() | cli_text,
    delay=st.none() | cli_text | st.sampled_from(["1e400", "nan", "-1", "inf"]),
    at=st.none()
    | cli_text
    | st.sampled_from(["2026-01-01", "2026-13-01T00:00Z", "9999-12-31T23:59Z"]),
)
def test_cli_enqueue_with_any_arguments_exits_0_to_3_without_a_traceback(
    real_server: EmbeddedServer,
    args: str,
    kwargs: str,
    run_id: str | None,
    delay: str | None,
    at: str | None,
) -> None:
    argv = ["enqueue", "t", "--args", args, "--kwargs", kwargs]
    for flag, value in (("--run-id", run_id), ("--delay", delay), ("--at", at)):
        if value is not None:
            argv += [flag, value]
    cli(real_server.url, *argv)


@FUZZ
@given(command=st.sampled_from(["show", "cancel", "requeue"]), run_id=cli_text)
def test_cli_run_commands_with_any_run_id_exit_0_to_3_without_a_traceback(
    real_server: EmbeddedServer, command: str, run_id: str
) -> None:
    code, out = cli(real_server.url, command, run_id)
    assert code in (1, 2), out  # never created: not found (1) or an invalid id (2)


@FUZZ
@given(
    job_id=cli_text,
    cron=st.none() | crons,
    every=st.none() | cli_text | st.sampled_from(["0", "-1", "nan", "inf", "1e400", "0.0001"]),
    tz=zones,
    jitter=st.none() | st.sampled_from(["nan", "-1", "inf", "59", "1e9"]) | cli_text,
    misfire=policies,
)
def test_cli_schedule_add_with_any_arguments_exits_0_to_3_without_a_traceback(
    real_server: EmbeddedServer,
    job_id: str,
    cron: str | None,
    every: str | None,
    tz: str,
    jitter: str | None,
    misfire: str,
) -> None:
    argv = ["schedule", "add", job_id, "t", "--tz", tz, "--misfire", misfire]
    for flag, value in (("--cron", cron), ("--every", every), ("--jitter", jitter)):
        if value is not None:
            argv += [flag, value]
    cli(real_server.url, *argv)
