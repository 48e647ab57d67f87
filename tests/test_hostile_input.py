"""Hostile input at the entry points: each mistake is refused with one clear line (the CLI:
``error: ...`` and the README's exit code, the API: a typed error), and nothing is written,
byte for byte."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner, Result
from keyspace import keyspace

from jobqueue.cli import State, main
from jobqueue.client import JobQueue
from jobqueue.errors import ConfigError
from jobqueue.keys import validate_queue_name


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
    jq.enqueue("t", 1, run_id="seed")
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
