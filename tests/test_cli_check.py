"""``jobqueue check`` against real single servers: exit 0 only when every line is ok, 1 when
any line warns, 3 when Redis is unreachable; ``--json`` prints one object per check.

The suite's server keeps nothing (AOF off, no snapshots), so check warns there; a private
server started with ``--appendonly yes --appendfsync everysec`` is as the guarantees need."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from click.testing import CliRunner

from jobqueue.cli import main
from jobqueue.store.embedded import EmbeddedServer, find_server_binary

AOF_EVERYSEC = ("--appendonly", "yes", "--appendfsync", "everysec")
# The recommended ACL user of docs/operations.md (tests/test_tls_acl.py runs it over TLS),
# with and without the two commands check needs besides.
APP_RULE = ["on", "~jq:*", "resetchannels", "-@all", "+ping", "+evalsha", "+script|load", "+time"]
CHECK_RULE = [*APP_RULE, "+info", "+config|get"]


@pytest.fixture(scope="module")
def aof_server() -> Iterator[EmbeddedServer]:
    server = EmbeddedServer(find_server_binary(), extra_args=AOF_EVERYSEC).start()
    yield server
    server.stop()


@pytest.fixture
def aof(aof_server: EmbeddedServer) -> Iterator[redis.Redis]:
    """A client of the AOF server; whatever a test changes in its config is put back."""
    client = redis.Redis.from_url(aof_server.url, decode_responses=True)
    yield client
    client.config_set("appendfsync", "everysec")
    client.config_set("maxmemory-policy", "noeviction")
    client.close()


def check(url: str, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, ["--redis-url", url, "check", *args])
    return result.exit_code, result.stdout, result.stderr


def check_json(url: str) -> tuple[int, list[dict[str, Any]]]:
    code, out, err = check(url, "--json")
    assert err == ""
    return code, json.loads(out)


@pytest.fixture
def suite_server(real_server: EmbeddedServer) -> EmbeddedServer:
    """The suite's server, emptied: another test's runs left due there would add a line."""
    redis.Redis.from_url(real_server.url).flushall()
    return real_server


def test_the_suite_server_keeps_nothing_so_check_warns_and_exits_1(
    suite_server: EmbeddedServer,
) -> None:
    code, out, _ = check(suite_server.url)
    assert code == 1, out
    assert "WARN  persistence: appendonly no and no RDB snapshots: a restart loses every run" in out
    assert out.endswith("1 warning(s)\n")


def test_a_server_with_aof_everysec_passes_every_line_and_exits_0(
    aof_server: EmbeddedServer,
) -> None:
    code, out, _ = check(aof_server.url)
    assert code == 0, out
    lines = out.splitlines()
    assert all(line.startswith("ok    ") for line in lines), out
    assert lines[0].startswith("ok    connected; server ")
    assert "ok    maxmemory-policy noeviction" in lines
    assert ("ok    persistence: appendonly yes, appendfsync everysec: a crash of the server or its "
            "machine can lose about the last second of acknowledged writes") in out
    assert "ok    replicas: none (not required of a single server)" in lines
    assert re.search(r"^ok    clock skew host vs server [+-]\d+ ms", out, re.M)
    assert lines[-1] == "ok    scripts loaded"


def test_json_prints_one_object_per_check_with_name_status_and_detail(
    aof_server: EmbeddedServer,
) -> None:
    code, checks = check_json(aof_server.url)
    assert code == 0
    assert [c["name"] for c in checks] == ["connection", "version", "maxmemory-policy",
                                           "persistence", "replication", "host-clock", "scripts"]
    assert {c["status"] for c in checks} == {"ok"}
    assert all(set(c) == {"name", "status", "detail", "nodes"} for c in checks)


def test_json_exits_1_when_a_check_warns(suite_server: EmbeddedServer) -> None:
    code, checks = check_json(suite_server.url)
    assert code == 1
    assert [c["name"] for c in checks if c["status"] == "warn"] == ["persistence"]


def test_appendfsync_always_passes(aof: redis.Redis, aof_server: EmbeddedServer) -> None:
    aof.config_set("appendfsync", "always")
    code, out, _ = check(aof_server.url)
    assert code == 0, out
    assert "ok    persistence: appendonly yes, appendfsync always" in out


def test_appendfsync_no_warns_and_exits_1(aof: redis.Redis, aof_server: EmbeddedServer) -> None:
    aof.config_set("appendfsync", "no")
    code, out, _ = check(aof_server.url)
    assert code == 1
    assert "WARN  persistence: appendonly yes, appendfsync no: the kernel decides" in out


def test_an_evicting_policy_warns_and_exits_1(aof: redis.Redis, aof_server: EmbeddedServer) -> None:
    aof.config_set("maxmemory-policy", "allkeys-lfu")
    code, out, _ = check(aof_server.url)
    assert code == 1
    assert "WARN  maxmemory-policy allkeys-lfu: runs can be evicted" in out


def test_rdb_snapshots_without_aof_warn_that_a_crash_loses_everything_since_the_last() -> None:
    server = EmbeddedServer(find_server_binary(), extra_args=("--save", "3600 1")).start()
    try:
        code, out, _ = check(server.url)
    finally:
        server.stop()
    assert code == 1
    assert re.search(r"^WARN  persistence: appendonly no, RDB snapshots only \(save '3600 1'\): "
                     r"a crash loses every write since the last snapshot \(the last, \d+ s ago\)",
                     out, re.M), out  # fmt: skip


def test_an_unreachable_server_exits_3_with_one_line(tmp_path: Any) -> None:
    code, out, err = check(f"unix://{tmp_path}/no-such.sock")
    assert code == 3
    assert out == ""
    assert err.startswith("error: ") and err.count("\n") == 1


def test_as_the_recommended_acl_user_with_info_and_config_get_every_line_is_read(
    aof: redis.Redis, aof_server: EmbeddedServer
) -> None:
    aof.execute_command("ACL", "SETUSER", "jqcheck", "reset", *CHECK_RULE, ">s3cret-check-pw")
    url = aof_server.url.replace("unix://", "unix://jqcheck:s3cret-check-pw@")
    code, out, err = check(url)
    assert code == 0, out
    assert "s3cret-check-pw" not in out + err


def test_without_info_and_config_get_check_says_what_it_could_not_read_and_exits_1(
    aof: redis.Redis, aof_server: EmbeddedServer
) -> None:
    aof.execute_command("ACL", "SETUSER", "jqapp", "reset", *APP_RULE, ">s3cret-app-pw")
    url = aof_server.url.replace("unix://", "unix://jqapp:s3cret-app-pw@")
    code, out, err = check(url)
    assert code == 1
    assert "Traceback" not in out + err and "s3cret-app-pw" not in out + err
    assert re.search(r"^WARN  maxmemory-policy unknown: not read \(.*CONFIG GET "
                     r"maxmemory-policy: .*no permissions", out, re.M), out  # fmt: skip
    assert "WARN  persistence unknown: not read (INFO: " in out
    assert "ok    scripts loaded" in out  # what the ACL allows is still checked


def test_help_states_the_exit_codes() -> None:
    result = CliRunner().invoke(main, ["check", "--help"])
    text = " ".join(result.stdout.split())
    assert ("Exit code: 0 when every line is ok, 1 when any line warns, 3 when Redis is "
            "unreachable.") in text
