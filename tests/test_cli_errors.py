"""User mistakes at the CLI: one line on stderr, the documented exit code, no traceback."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from jobqueue.cli import main
from jobqueue.store.embedded import EmbeddedServer


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_unreachable_redis_exits_3_with_one_line() -> None:
    code, _, err = invoke("--redis-url", "redis://127.0.0.1:1/0", "show", "x")
    assert code == 3
    assert err.startswith("error: cannot reach Redis at redis://127.0.0.1:1/0")
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_wrong_password_exits_3_and_never_prints_the_password(real_server: EmbeddedServer) -> None:
    secured = EmbeddedServer(extra_args=("--requirepass", "right-secret")).start()
    try:
        url = f"unix://:wrong-secret@{secured.socket}"
        code, out, err = invoke("--redis-url", url, "show", "x")
    finally:
        secured.stop()
    assert code == 3
    assert "refused" in err
    assert "wrong-secret" not in err + out


def test_malformed_json_args_is_a_usage_error(real_server: EmbeddedServer) -> None:
    code, _, err = invoke("--redis-url", real_server.url, "enqueue", "report", "--args", "[1,")
    assert code == 2
    assert "not valid JSON" in err


def test_unknown_run_exits_1(real_server: EmbeddedServer) -> None:
    code, _, err = invoke("--redis-url", real_server.url, "show", "no-such-run")
    assert code == 1
    assert "no run 'no-such-run'" in err


def test_unsupported_url_scheme_is_a_usage_error() -> None:
    code, _, err = invoke("--redis-url", "http://localhost", "show", "x")
    assert code == 2
    assert "unsupported Redis URL" in err


def test_bad_app_spec_is_a_usage_error(real_server: EmbeddedServer) -> None:
    code, _, err = invoke("--redis-url", real_server.url, "worker", "--app", "no_such_module:jq")
    assert code == 2
    assert "cannot import app module 'no_such_module'" in err


def test_enqueue_then_show_as_json_in_a_real_subprocess(real_server: EmbeddedServer) -> None:
    base = [sys.executable, "-m", "jobqueue.cli", "--redis-url", real_server.url]
    created = subprocess.run(
        [*base, "enqueue", "report", "--args", "[1, 2]", "--run-id", "cli-1", "--json"],
        capture_output=True, text=True, check=True,
    )
    assert json.loads(created.stdout) == {
        "run_id": "cli-1", "queue": "default", "created": True, "outcome": "created"
    }
    again = subprocess.run(
        [*base, "enqueue", "report", "--args", "[1, 2]", "--run-id", "cli-1", "--json"],
        capture_output=True, text=True, check=True,
    )
    assert json.loads(again.stdout)["created"] is False
    shown = subprocess.run([*base, "show", "cli-1", "--json"], capture_output=True, text=True,
                           check=True)
    run = json.loads(shown.stdout)
    assert (run["state"], run["task"], run["args"]) == ("pending", "report", [1, 2])


@pytest.mark.parametrize("payload", ['{"a": 1}', "3"])
def test_args_must_be_a_json_array(real_server: EmbeddedServer, payload: str) -> None:
    code, _, err = invoke("--redis-url", real_server.url, "enqueue", "t", "--args", payload)
    assert code == 2
    assert "must be a JSON list" in err
