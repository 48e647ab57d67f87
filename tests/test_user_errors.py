"""What a newcomer gets wrong, and what jobqueue says back: a refusal in one line with the
README's exit code (0 ok, 1 refused or not found, 2 bad input, 3 Redis unreachable, 130
interrupted), never a traceback, never a silent success that loses the work."""

from __future__ import annotations

import subprocess
import sys
import types
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from jobqueue.cli import State, main
from jobqueue.cli import enqueue as cli_mod
from jobqueue.cli.common import FiniteFloat
from jobqueue.client.base import Request
from jobqueue.client.sync import JobQueue
from jobqueue.errors import ConfigError, PayloadError
from jobqueue.store import embedded
from jobqueue.store.embedded import EmbeddedServer, resolve_url
from jobqueue.store.keys import QUEUES_KEY


def invoke(*args: str, jq: JobQueue | None = None, input: str | None = None) -> Result:
    obj = None if jq is None else State(None, jq)
    return CliRunner().invoke(main, list(args), obj=obj, input=input)


def one_line_error(result: Result) -> str:
    """The error line, after checking it is the only output on stderr and no traceback."""
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def run_keys(client: Any) -> list[str]:
    return sorted(k for k in client.keys("jq:*") if ":run:" in k)


@pytest.fixture
def no_url(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """No --redis-url and no $JOBQUEUE_REDIS_URL; records every start of the embedded server
    (which a refused command must never reach)."""
    monkeypatch.delenv("JOBQUEUE_REDIS_URL", raising=False)
    started: list[str] = []

    def refuse_to_start() -> EmbeddedServer:
        started.append("embedded")
        raise AssertionError("the embedded server was started")

    monkeypatch.setattr(embedded, "shared_server", refuse_to_start)
    return started


@pytest.fixture
def throwaway(monkeypatch: pytest.MonkeyPatch, real_server: EmbeddedServer) -> EmbeddedServer:
    """No URL configured; the 'private embedded server' is the session's real server."""
    monkeypatch.delenv("JOBQUEUE_REDIS_URL", raising=False)
    monkeypatch.setattr(embedded, "shared_server", lambda: real_server)
    return real_server


# -- 1. no URL: nothing is written to a server that dies on exit ----------------------------

WRITING_COMMANDS = [
    ("enqueue", "ping", "--run-id", "x"),
    ("cancel", "x"),
    ("requeue", "x"),
    ("dead", "retry", "x"),
    ("dead", "purge", "x", "--yes"),
    ("schedules", "add", "nightly", "ping", "--every", "60"),
    ("schedules", "pause", "nightly"),
    ("schedule", "remove", "nightly", "--yes"),
    ("repartition", "default", "--partitions", "4", "--yes"),
]


@pytest.mark.parametrize("args", WRITING_COMMANDS, ids=lambda a: " ".join(a[:2]))
def test_a_writing_command_without_a_redis_url_is_refused_before_any_server_starts(
    no_url: list[str], args: tuple[str, ...]
) -> None:
    result = invoke(*args)
    assert result.exit_code == 2
    assert one_line_error(result) == (
        "error: no Redis URL: pass --redis-url or set JOBQUEUE_REDIS_URL "
        "(or --embedded to use a private throwaway server that keeps nothing)"
    )
    assert no_url == []


def test_an_empty_redis_url_option_is_a_usage_error(no_url: list[str]) -> None:
    result = invoke("--redis-url", "", "queues")
    assert result.exit_code == 2
    assert one_line_error(result).startswith("error: empty Redis URL")
    assert no_url == []


def test_an_empty_redis_url_variable_is_a_usage_error(
    no_url: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JOBQUEUE_REDIS_URL", "")
    result = invoke("enqueue", "ping", "--run-id", "x")
    assert result.exit_code == 2
    assert "JOBQUEUE_REDIS_URL is set but empty" in one_line_error(result)
    assert no_url == []


def test_from_url_and_use_url_refuse_an_empty_url(no_url: list[str]) -> None:
    with pytest.raises(ConfigError, match="empty Redis URL"):
        JobQueue.from_url("")
    with pytest.raises(ConfigError, match="empty Redis URL"):
        JobQueue.from_url().use_url("  ")
    assert no_url == []


def test_a_reading_command_without_a_url_warns_that_nothing_persists(
    throwaway: EmbeddedServer,
) -> None:
    result = invoke("queues")
    assert result.exit_code == 0
    assert result.stderr == (
        "warning: no Redis URL: pass --redis-url or set JOBQUEUE_REDIS_URL; using a private "
        "throwaway server: nothing persists after this command\n"
    )


def test_embedded_flag_allows_a_write_on_the_throwaway_server_without_a_warning(
    throwaway: EmbeddedServer,
) -> None:
    result = invoke("--embedded", "cancel", "no-such-run")
    assert result.exit_code == 1  # it ran: the run is not there
    assert "warning" not in result.stderr
    assert "no run 'no-such-run'" in one_line_error(result)


def test_embedded_flag_together_with_a_url_is_a_usage_error(real_server: EmbeddedServer) -> None:
    result = invoke("--embedded", "--redis-url", real_server.url, "queues")
    assert result.exit_code == 2
    assert "--embedded is for when no URL is given" in result.stderr


def test_a_data_command_with_an_app_whose_jobqueue_has_no_url_is_refused(
    no_url: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    app = types.ModuleType("nourl_app")
    app.jq = JobQueue.from_url()  # type: ignore[attr-defined]
    app.jq.task(name="ping")(lambda: None)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "nourl_app", app)
    result = invoke("enqueue", "--app", "nourl_app:jq", "ping")
    assert result.exit_code == 2
    assert one_line_error(result).startswith("error: no Redis URL")
    assert no_url == []


# -- 2. bad input is one line with the right exit code ----------------------------------------


def test_a_database_number_the_server_refuses_is_a_usage_error_at_the_cli(
    real_server: EmbeddedServer,
) -> None:
    result = invoke("--redis-url", f"{real_server.url}?db=99999", "queues")
    assert result.exit_code == 2
    assert "refused the URL's database" in one_line_error(result)


def test_a_database_number_the_server_refuses_is_a_config_error_in_the_api(
    real_server: EmbeddedServer,
) -> None:
    jq = JobQueue.from_url(f"{real_server.url}?db=99999")
    jq.task(name="ping")(lambda: None)
    with pytest.raises(ConfigError, match="refused the URL's database"):
        jq.enqueue("ping")


def test_an_unknown_url_option_is_a_usage_error_naming_it(real_server: EmbeddedServer) -> None:
    result = invoke("--redis-url", f"{real_server.url}?foo=bar", "queues")
    assert result.exit_code == 2
    assert "unknown URL option foo" in one_line_error(result)


def test_an_unknown_url_option_is_a_config_error_in_the_api(real_server: EmbeddedServer) -> None:
    jq = JobQueue.from_url(f"{real_server.url}?foo=bar")
    with pytest.raises(ConfigError, match="unknown URL option foo"):
        jq.connect()


@pytest.mark.parametrize("spec", [":jq", ".rel:jq"])
def test_an_app_spec_without_a_module_is_a_usage_error(real_server: EmbeddedServer,
                                                       spec: str) -> None:
    result = invoke("--redis-url", real_server.url, "worker", "--app", spec)
    assert result.exit_code == 2
    assert "names no module" in one_line_error(result)


@pytest.mark.parametrize(
    ("source", "kind"),
    [('raise RuntimeError("import boom")\n', "RuntimeError: import boom"),
     ("def f(: pass\n", "SyntaxError: ")],
    ids=["raises", "syntax-error"],
)
def test_an_app_module_that_fails_to_import_is_one_line_exit_2(
    real_server: EmbeddedServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    source: str, kind: str, request: pytest.FixtureRequest,
) -> None:
    name = f"broken_{request.node.callspec.id.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    result = invoke("--redis-url", real_server.url, "worker", "--app", f"{name}:jq")
    line = one_line_error(result)
    assert result.exit_code == 2
    assert line.startswith(f"error: importing {name!r} raised {kind}")
    assert line.endswith("(--log-level debug shows the traceback)")


def test_an_async_client_given_as_the_app_is_refused_with_what_to_give_instead(
    real_server: EmbeddedServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "aioapp_given.py").write_text(
        "from jobqueue.aio import AsyncJobQueue\n\n"
        f"jq = AsyncJobQueue.from_url({real_server.url!r})\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    result = invoke("--redis-url", real_server.url, "worker", "--app", "aioapp_given:jq")
    line = one_line_error(result)
    assert result.exit_code == 2
    assert "is an AsyncJobQueue" in line and "the daemons need a JobQueue" in line


FLOAT_OPTIONS = [
    ("worker", "--app", "x:jq", "--lease"),
    ("worker", "--app", "x:jq", "--grace"),
    ("scheduler", "--lookahead"),
    ("scheduler", "--interval"),
    ("scheduler", "--misfire-grace"),
    ("enqueue", "ping", "--delay"),
    ("top", "--interval"),
]


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
@pytest.mark.parametrize("args", FLOAT_OPTIONS, ids=lambda a: f"{a[0]} {a[-1]}")
def test_float_options_refuse_nan_and_infinity(args: tuple[str, ...], value: str) -> None:
    # An unreachable server: were the value accepted, the command would stop at exit 3
    # instead of running a daemon forever.
    result = invoke("--redis-url", "redis://127.0.0.1:1/0", *args, value)
    assert result.exit_code == 2, result.output
    assert "is not a finite number" in result.stderr or "not in the range" in result.stderr


def test_finite_float_keeps_its_range_and_accepts_finite_numbers() -> None:
    kind = FiniteFloat(0.1)
    assert kind.convert("2.5", None, None) == 2.5
    with pytest.raises(Exception, match="not in the range"):
        kind.convert("0.01", None, None)
    with pytest.raises(Exception, match="not a finite number"):
        kind.convert("nan", None, None)


def test_ctrl_c_while_the_cli_module_imports_exits_130_without_a_traceback() -> None:
    # Deliver SIGINT in the middle of a command's imports (the commands' module imports
    # jobqueue.cli.format), as the command starts.
    probe = (
        "import os, signal, sys, importlib.abc\n"
        "import jobqueue\n"
        "class Interrupt(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name == 'jobqueue.cli.format':\n"
        "            os.kill(os.getpid(), signal.SIGINT)\n"
        "        return None\n"
        "sys.meta_path.insert(0, Interrupt())\n"
        "from jobqueue.cli import main\n"
        "main(['jitter', '--jobs', '10'])\n"
        "print('ran')\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (130, "", "")


def test_ctrl_c_in_a_command_prints_aborted_and_exits_130(
    jq: JobQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(*args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("jobqueue.cli.queues.queries.stats", interrupted)
    result = invoke("queues", jq=jq)
    assert result.exit_code == 130
    assert result.stderr.strip() == "Aborted!"


# -- 3. enqueue --app checks the task and applies its options -------------------------------


@pytest.fixture
def app(jq: JobQueue, monkeypatch: pytest.MonkeyPatch) -> str:
    """An importable app module whose JobQueue is the test's (fake or real backend)."""
    module = types.ModuleType("nu_cli_app")
    module.jq = jq  # type: ignore[attr-defined]

    @jq.task(queue="mail", max_attempts=5, timeout=60)
    def send_invoice(customer_id: int) -> str:
        return f"invoiced {customer_id}"

    monkeypatch.setitem(sys.modules, "nu_cli_app", module)
    return "nu_cli_app:jq"


def test_enqueue_with_app_refuses_a_task_the_app_does_not_have(
    jq: JobQueue, app: str, redis_client: Any
) -> None:
    result = invoke("enqueue", "--app", app, "no_such_task", jq=jq)
    assert result.exit_code == 1
    assert one_line_error(result) == (
        "error: task 'no_such_task' is not registered in nu_cli_app:jq"
    )
    assert run_keys(redis_client) == []


def test_enqueue_with_app_applies_the_tasks_declared_options(jq: JobQueue, app: str) -> None:
    result = invoke("enqueue", "--app", app, "send_invoice", "--args", "[7]", "--run-id", "i1",
                    jq=jq)
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
    run = jq.get_run("i1")
    assert (run.queue, run.max_attempts) == ("mail", 5)


def test_enqueue_with_app_refuses_max_attempts_the_task_already_declares(
    jq: JobQueue, app: str, redis_client: Any
) -> None:
    result = invoke("enqueue", "--app", app, "send_invoice", "--max-attempts", "9", jq=jq)
    assert result.exit_code == 2
    assert "--max-attempts is for tasks not in --app" in result.stderr
    assert run_keys(redis_client) == []


def test_enqueue_without_app_notes_that_the_task_is_not_checked(jq: JobQueue) -> None:
    result = invoke("enqueue", "typo_task", "--run-id", "t1", jq=jq)
    assert result.exit_code == 0
    assert result.stderr.startswith("note: task 'typo_task' is not checked (no --app)")
    assert len(result.stderr.strip().splitlines()) == 1
    assert jq.get_run("t1").task == "typo_task"


# -- 4. a worker's queue names are validated like enqueue's ---------------------------------


@pytest.mark.parametrize("name", ["", "a{b}"])
def test_worker_refuses_an_invalid_queue_name_like_enqueue_does(
    jq: JobQueue, redis_client: Any, name: str
) -> None:
    # An app that does not import: were the name accepted, no worker would start anyway.
    by_worker = invoke("worker", "--app", "nu_unused:jq", "--queue", name, jq=jq)
    by_enqueue = invoke("enqueue", "ping", "--queue", name, jq=jq)
    assert by_worker.exit_code == by_enqueue.exit_code == 2
    assert one_line_error(by_worker) == one_line_error(by_enqueue)
    assert redis_client.hgetall(QUEUES_KEY) == {}


@pytest.mark.parametrize("name", ["", "a{b}", "x" * 65])
def test_register_queue_refuses_an_invalid_name_and_records_nothing(
    jq: JobQueue, redis_client: Any, name: str
) -> None:
    with pytest.raises(ConfigError, match="invalid queue name"):
        jq.register_queue(name)
    assert redis_client.hgetall(QUEUES_KEY) == {}


# -- 5. an interrupted bulk enqueue says how far it got -------------------------------------


def test_interrupted_enqueue_from_file_says_how_far_it_got(
    jq: JobQueue, redis_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli_mod, "ENQUEUE_CHUNK", 2)
    calls = []
    real_enqueue_many = jq.enqueue_many

    def enqueue_many(requests: list[Request]) -> Any:
        calls.append(len(requests))
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real_enqueue_many(requests)

    monkeypatch.setattr(jq, "enqueue_many", enqueue_many)
    lines = "".join(f'{{"run_id": "f-{i}"}}\n' for i in range(10))
    result = invoke("enqueue", "report", "--from-file", "-", jq=jq, input=lines)
    assert result.exit_code == 130
    assert "interrupted: 4 of 10 created; a re-run skips the lines whose run_id exists, " \
           "but creates lines without run_id again" in result.stderr
    assert "Traceback" not in result.stderr
    assert len(run_keys(redis_client)) == 4


# -- 6. a string is not a sequence of arguments ---------------------------------------------


@pytest.mark.parametrize("args", ["abc", b"abc"], ids=["str", "bytes"])
def test_a_string_as_the_args_sequence_is_refused(
    jq: JobQueue, redis_client: Any, args: Any
) -> None:
    jq.task(name="echo")(lambda *a: a)
    with pytest.raises(PayloadError, match="must be a list or tuple of arguments"):
        jq.enqueue_many([Request("echo", args)])
    with pytest.raises(PayloadError, match="must be a list or tuple of arguments"):
        jq.schedule("echoes", "echo", every=60, args=args)
    with pytest.raises(PayloadError, match="must be a list or tuple of arguments"):
        jq.declare_schedule("echoes", "echo", every=60, args=args)
    assert redis_client.keys("jq:*") == []


# -- 7. due times past year 9000 are typing mistakes ----------------------------------------


@pytest.mark.parametrize(
    "when",
    [{"delay": 1e20}, {"at": datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)},
     {"at": datetime(9000, 1, 1, tzinfo=UTC)}],
    ids=["delay-1e20", "at-9999", "at-9000"],
)
def test_a_due_time_beyond_year_9000_is_refused(
    jq: JobQueue, redis_client: Any, when: dict[str, Any]
) -> None:
    jq.task(name="ping")(lambda: None)
    with pytest.raises(ConfigError, match="beyond year 9000"):
        jq.enqueue(jq.resolve_task("ping").with_options(**when))
    with pytest.raises(ConfigError, match="beyond year 9000"):
        jq.enqueue_many([Request("ping", **when)])
    assert run_keys(redis_client) == []


def test_a_due_time_before_year_9000_is_accepted(jq: JobQueue) -> None:
    jq.task(name="ping")(lambda: None)
    late = datetime(8999, 12, 31, 23, 59, 59, tzinfo=UTC)
    assert jq.enqueue(jq.resolve_task("ping").with_options(at=late)).created


@pytest.mark.parametrize("option", [("--delay", "1e20"), ("--at", "9999-12-31T23:59:59Z")])
def test_cli_refuses_a_due_time_beyond_year_9000(
    jq: JobQueue, redis_client: Any, option: tuple[str, str]
) -> None:
    result = invoke("enqueue", "ping", *option, jq=jq)
    assert result.exit_code == 2
    assert "beyond year 9000" in result.stderr
    assert "Traceback" not in result.stderr
    assert run_keys(redis_client) == []


# -- the embedded default itself -------------------------------------------------------------


def test_resolve_url_refuses_empty_urls_instead_of_starting_a_server(
    no_url: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ConfigError, match="empty Redis URL"):
        resolve_url("")
    monkeypatch.setenv("JOBQUEUE_REDIS_URL", " ")
    with pytest.raises(ConfigError, match="set but empty"):
        resolve_url(None)
    assert no_url == []
