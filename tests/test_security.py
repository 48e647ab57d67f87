"""Hostile data in Redis meets a real worker: a pickle payload is never unpickled, and a task
name from Redis resolves only through the worker's registry (nothing is imported by name).

Each attack is first shown to be live (unpickling the bytes, or importing the module, does
fire the sentinel), so a worker that did either would fail these tests."""

from __future__ import annotations

import importlib
import pickle
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from helpers import FAST, make_worker, running, wait_for
from hypothesis import given, settings
from hypothesis import strategies as st

from jobqueue import JobQueue
from jobqueue.models import Run
from jobqueue.store.connection import redact


class Trap:
    """Unpickling this creates the sentinel file (``open(path, 'w')``)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.path), "w"))


def pickle_texts(sentinel: Path) -> dict[str, str]:
    """The trap pickled with every protocol, as text a Redis client would store (protocol 0
    is ASCII; the binary ones go in as latin-1, byte for byte)."""
    out = {}
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        data = pickle.dumps(Trap(sentinel), protocol=protocol)
        out[f"protocol-{protocol}"] = data.decode("latin-1")
    return out


def run_on_worker(redis_client: Any, field: str, values: dict[str, str]) -> dict[str, Run]:
    """Enqueue one run per value, overwrite ``field`` of each with the value, let a real worker
    (with a registered 'echo' task) settle them all, then return the records."""
    jq = JobQueue(redis_client, settings=FAST)

    @jq.task
    def echo(*args: Any, **kwargs: Any) -> Any:
        return [args, kwargs]

    for name, value in values.items():
        echo.with_options(run_id=name).enqueue(1)
        redis_client.hset(jq.keys_for("default", name).run(name), field, value)
    canary = jq.enqueue(echo, "canary").run_id
    with running(make_worker(jq)):
        wait_for(lambda: all(jq.get_run(n).finished for n in [*values, canary]), 15, "runs")
    assert jq.get_run(canary).state == "done"
    return {name: jq.get_run(name) for name in values}


def test_the_trap_is_live(tmp_path: Path) -> None:
    sentinel = tmp_path / "control"
    pickle.loads(pickle_texts(sentinel)["protocol-2"].encode("latin-1"))
    assert sentinel.exists()


def test_a_pickle_payload_in_redis_is_dead_lettered_and_never_unpickled(
    redis_client: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sentinel = tmp_path / "unpickled"
    unpickled: list[Any] = []
    for name in ("loads", "load"):
        monkeypatch.setattr(pickle, name, lambda *a, **k: unpickled.append(a))
    runs = run_on_worker(redis_client, "payload", pickle_texts(sentinel))
    for name, run in runs.items():
        assert run.state == "dead", (name, run.state, run.history)
        assert run.attempt == 1, name  # not retried: the same bytes would fail again
        assert run.error is not None and "JSON" in run.error, (name, run.error)
    assert not sentinel.exists()
    assert unpickled == []


def test_a_pickle_in_a_result_field_is_shown_as_text_never_unpickled(
    redis_client: Any, tmp_path: Path
) -> None:
    sentinel = tmp_path / "unpickled"
    jq = JobQueue(redis_client)
    jq.declare_task("t")
    jq.enqueue(jq.resolve_task("t").with_options(run_id="r"))
    text = pickle_texts(sentinel)["protocol-0"]
    redis_client.hset(jq.keys_for("default", "r").run("r"), "result", text)
    assert jq.get_run("r").result == text
    assert not sentinel.exists()


@pytest.fixture
def importable_trap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Path]:
    """A module on sys.path whose import creates a sentinel file."""
    sentinel = tmp_path / "imported"
    module = "jq_security_trap_module"
    (tmp_path / f"{module}.py").write_text(
        f"open({str(sentinel)!r}, 'w').close()\n\ndef run(*a, **k):\n    return 'pwned'\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return module, sentinel


def test_the_importable_trap_is_live(importable_trap: tuple[str, Path]) -> None:
    module, sentinel = importable_trap
    try:
        importlib.import_module(module)
        assert sentinel.exists()
    finally:
        sys.modules.pop(module, None)


def test_a_task_name_in_redis_outside_the_registry_never_runs_and_imports_nothing(
    redis_client: Any, importable_trap: tuple[str, Path]
) -> None:
    module, sentinel = importable_trap
    names = {
        "dotted": f"{module}.run",
        "colon": f"{module}:run",
        "bare-module": module,
        "builtin": "builtins.eval",
        "os": "os.system",
    }
    before = set(sys.modules)
    runs = run_on_worker(redis_client, "task", names)
    for name, run in runs.items():
        assert run.state == "dead", (name, run.state)  # once FAST's hand-back window is over
        assert run.attempt == 0, name
        assert run.error is not None and "no code for task" in run.error, (name, run.error)
        assert run.error.count("\n") == 0, run.error  # one clear line, not a traceback
    assert not sentinel.exists()
    assert module not in sys.modules
    assert set(sys.modules) - before <= {m for m in sys.modules if m.startswith("jobqueue")}


# -- passwords in URLs -----------------------------------------------------------------------

password_chars = st.characters(blacklist_categories=["Cs", "Cc", "Zs"])


@settings(max_examples=200, deadline=None)
@given(
    secret=st.text(password_chars, min_size=1, max_size=20),
    encode=st.booleans(),
    scheme=st.sampled_from(["redis", "rediss", "redis+cluster", "unix"]),
    user=st.sampled_from(["", "jqapp"]),
)
def test_redact_hides_any_password_spelled_in_a_url(
    secret: str, encode: bool, scheme: str, user: str
) -> None:
    password = "Pw!" + (quote(secret, safe="") if encode else secret)
    where = "/tmp/r.sock" if scheme == "unix" else "127.0.0.1:6380/0"
    for url in (
        f"{scheme}://{user}:{password}@{where}?ssl_ca_certs=/etc/ca.pem",
        f"{scheme}://{where}?db=0&password={quote(password, safe='')}",
    ):
        assert "Pw!" not in redact(url) and "Pw%21" not in redact(url), (url, redact(url))
