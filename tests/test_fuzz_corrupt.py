"""Corrupt data found in Redis: a run hash with a missing or garbage field must not crash a
worker or the CLI. A run that cannot be run safely is dead-lettered with a reason; fields that
are only informational (lease_until, due, timeout...) do not stop the run; and the worker keeps
serving the other runs of the same batch.

The worker is a real ``jobqueue.worker.Worker`` in-process (tests/helpers.py);
the CLI runs through click's CliRunner with a JobQueue over the parametrized backend."""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from typing import Any

import pytest
from click.testing import CliRunner
from helpers import FAST, make_worker, running, wait_for
from starlette.testclient import TestClient

from jobqueue import JobQueue
from jobqueue.cli import State, main
from jobqueue.dashboard.app import create_app
from jobqueue.store.runs import CLAIM

# What this module checks does not depend on the backend: run on the real server only
# (real_only, tests/conftest.py); the scripts and the client API are tested on fakeredis too.
pytestmark = pytest.mark.real_only

MISSING = None


@dataclass(frozen=True)
class Corruption:
    field: str
    value: str | None  # None: the field is deleted
    outcome: str  # 'dead' (with ``reason`` in the error) or 'done'
    reason: str = ""

    @property
    def id(self) -> str:
        return f"{self.field}={'<missing>' if self.value is None else self.value!r}"


CORRUPTIONS = [
    Corruption("task", MISSING, "dead", "no task"),
    Corruption("task", "", "dead", "no task"),
    # handed back until the hand-back window (FAST's: 0.5 s) is over
    Corruption("task", "os.system", "dead", "no code for task 'os.system' in this worker"),
    Corruption("payload", MISSING, "dead", "no payload"),
    Corruption("payload", "{not json", "dead", "not valid JSON"),
    Corruption("payload", "[1, 2]", "dead", "not a JSON object"),
    Corruption("payload", '{"args": 5}', "dead", "must hold a list"),
    Corruption("max_attempts", "many", "dead", "bad max_attempts"),
    Corruption("max_attempts", MISSING, "dead", "bad max_attempts"),
    Corruption("max_attempts", "nan", "dead", "bad max_attempts"),
    Corruption("max_attempts", "inf", "dead", "bad max_attempts"),
    Corruption("max_attempts", "0", "dead", "bad max_attempts"),
    Corruption("max_attempts", "2.5", "dead", "bad max_attempts"),
    Corruption("lease_until", "soon", "done"),
    Corruption("due", "tomorrow", "done"),
    Corruption("lease_ms", "long", "done"),
    Corruption("timeout_ms", "-x", "done"),
    Corruption("scheduled_for", "yesterday", "done"),
    Corruption("scheduled_for", "\u00b2", "done"),  # '²': isdigit() says yes, int() no
    Corruption("created", "\udcff", "done"),
    Corruption("job", "", "done"),
]
STATE_AND_FENCE = [
    Corruption("state", MISSING, "dead", "corrupt record"),
    Corruption("state", "garbage", "dead", "corrupt record"),
    Corruption("fence", "abc", "dead", "corrupt record"),
    Corruption("fence", "nan", "dead", "corrupt record"),
    Corruption("attempt", "one", "dead", "corrupt record"),
    Corruption("attempt", "-inf", "dead", "corrupt record"),
]


def corrupt(client: Any, key: str, c: Corruption) -> None:
    if c.value is None:
        client.hdel(key, c.field)
    else:
        client.hset(key, c.field, c.value.encode("utf-8", "surrogateescape"))


def serve_until_settled(jq: JobQueue, victim: str, canary: str) -> Any:
    """Run a real worker until the canary (enqueued after the victim) is done, then give the
    victim a moment to settle; return the victim's record."""
    with running(make_worker(jq, lease=2.0)):
        wait_for(lambda: jq.get_run(canary).state == "done", 15, "the canary run")
        # Asserted by the caller, with the record in the message.
        with contextlib.suppress(AssertionError):
            wait_for(lambda: jq.get_run(victim).finished, 3, "the corrupt run to settle")
    return jq.get_run(victim)


def check_worker_outcome(redis_client: Any, c: Corruption) -> None:
    jq = JobQueue(redis_client, settings=FAST)

    @jq.task
    def echo(x: Any) -> Any:
        return x

    victim = jq.enqueue(echo.with_options(run_id="victim"), 1)
    canary = jq.enqueue(echo.with_options(run_id="canary"), "canary")
    corrupt(redis_client, jq.keys_for("default", "victim").run("victim"), c)

    run = serve_until_settled(jq, victim.run_id, canary.run_id)
    assert run.state == c.outcome, (run.state, run.error, run.history)
    if c.outcome == "dead":
        assert run.error is not None and c.reason in run.error, run.error
    else:
        assert run.result == 1
    assert jq.get_run("canary").result == "canary"


@pytest.mark.parametrize("c", CORRUPTIONS, ids=lambda c: c.id)
def test_worker_survives_a_corrupt_run_and_settles_it(redis_client: Any, c: Corruption) -> None:
    check_worker_outcome(redis_client, c)


@pytest.mark.parametrize("c", STATE_AND_FENCE, ids=lambda c: c.id)
def test_worker_dead_letters_a_run_with_a_corrupt_state_fence_or_attempt(
    redis_client: Any, c: Corruption
) -> None:
    check_worker_outcome(redis_client, c)


def test_a_run_key_of_the_wrong_type_is_dead_lettered_not_a_poison_pill(
    redis_client: Any,
) -> None:
    """A run key that is not a hash would make HMGET fail inside claim.lua, and the whole
    claim with it on every call: one bad key must not block its partition for every worker."""
    jq = JobQueue(redis_client, settings=FAST)

    @jq.task
    def echo(x: Any) -> Any:
        return x

    jq.enqueue(echo.with_options(run_id="victim"), 1)
    jq.enqueue(echo.with_options(run_id="canary"), "canary")
    key = jq.keys_for("default", "victim").run("victim")
    redis_client.delete(key)
    redis_client.set(key, "not a hash")
    with running(make_worker(jq, lease=2.0)):
        wait_for(lambda: jq.get_run("canary").state == "done", 5, "the canary run")
    assert redis_client.zscore(jq.keys_for("default", "victim").dead, "victim") is not None


def test_a_dead_listed_key_of_the_wrong_type_is_listed_and_purged_by_the_cli(
    redis_client: Any,
) -> None:
    jq = JobQueue(redis_client)
    keys = jq.keys_for("default", "victim")
    jq.declare_task("t")
    jq.enqueue(jq.resolve_task("t").with_options(run_id="victim"))
    redis_client.delete(keys.run("victim"))
    redis_client.set(keys.run("victim"), "not a hash")
    jq.scripts.run(CLAIM.call(keys, 1, "w", 30_000, 60_000))  # dead-letters the key
    assert "victim" in cli(jq, "dead", "list")
    listed = json.loads(cli(jq, "runs", "--state", "dead", "--json"))
    assert [(x["run_id"], x["state"]) for x in listed] == [("victim", "dead")]
    assert "not a run record" in listed[0]["error"]
    cli(jq, "dead", "purge", "victim", "--yes")
    assert redis_client.zscore(keys.dead, "victim") is None
    assert redis_client.get(keys.run("victim")) == "not a hash"  # someone else's key: kept


# -- the CLI -------------------------------------------------------------------------------

CLI_GARBAGE = [
    *[(c.field, c.value) for c in CORRUPTIONS + STATE_AND_FENCE],
    ("fence", "1.5"),
    ("attempt", "-"),
    ("started", "noon"),
    ("finished", "never"),
    ("owner", MISSING),
    ("result", "{not json"),
    ("error", "\udcff\x00"),
]


def cli(jq: JobQueue, *args: str) -> str:
    """stdout of a command that must succeed; stderr may only hold ``anomaly:`` lines (the
    corrupt data it met, one line each)."""
    result = CliRunner().invoke(main, list(args), obj=State(None, jq))
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        args,
        repr(result.exception),
        result.output,
    )
    assert "Traceback" not in result.output
    assert result.exit_code == 0, (args, result.output)
    assert all(line.startswith("anomaly: ") for line in result.stderr.splitlines()), result.stderr
    return result.stdout


@pytest.mark.parametrize(
    ("field", "value"),
    CLI_GARBAGE,
    ids=[f"{f}={'<missing>' if v is None else v!r}" for f, v in CLI_GARBAGE],
)
def test_cli_shows_runs_and_leases_with_corrupt_fields_without_crashing(
    redis_client: Any, field: str, value: str | None
) -> None:
    jq = JobQueue(redis_client)
    jq.declare_task("t")
    jq.enqueue(jq.resolve_task("t").with_options(run_id="held"), 1)
    jq.enqueue(jq.resolve_task("t").with_options(run_id="waiting"), 2)
    keys = jq.keys_for("default", "held")
    # 'held' is running (in the leases zset), 'waiting' pending (in the due zset).
    call = CLAIM.call(keys, 1, "host:1:abc", 30_000, 60_000)
    assert [r.run_id for r in CLAIM.parse(jq.scripts.run(call)).runs] == ["held"]
    for run_id in ("held", "waiting"):
        corrupt(redis_client, keys.run(run_id), Corruption(field, value, ""))

    for run_id in ("held", "waiting"):
        assert run_id in cli(jq, "show", run_id)
        assert json.loads(cli(jq, "show", run_id, "--json"))["run_id"] == run_id
    assert "held" in cli(jq, "leases")
    assert [x["run_id"] for x in json.loads(cli(jq, "leases", "--json"))] == ["held"]
    listed = cli(jq, "runs")
    assert "held" in listed and "waiting" in listed
    assert {x["run_id"] for x in json.loads(cli(jq, "runs", "--json"))} >= {"held", "waiting"}
    cli(jq, "stats")
    cli(jq, "dead", "list")


def test_a_history_line_whose_stamp_only_looks_numeric_is_shown_whole(redis_client: Any) -> None:
    """'²'.isdigit() is true but int('²') raises: such a line (never written by jobqueue) is
    shown as it is, by `show` and by the dashboard's run page."""
    jq = JobQueue(redis_client)
    jq.declare_task("t")
    jq.enqueue(jq.resolve_task("t").with_options(run_id="odd"))
    keys = jq.keys_for("default", "odd")
    redis_client.rpush(keys.history("odd"), "\u00b2 written by someone else")
    redis_client.hset(keys.run("odd"), "hist", "1")
    assert "\u00b2 written by someone else" in cli(jq, "show", "odd")
    page = TestClient(create_app(jq)).get("/run?id=odd")
    assert page.status_code == 200
    assert "\u00b2 written by someone else" in page.text
