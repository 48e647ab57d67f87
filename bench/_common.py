"""Shared helpers for the benchmarks in bench/ (core.py, and later worker.py, scheduler.py).

What lives here:

* the command line every benchmark shares (``--url``, ``--n``, ``--quick``,
  ``--repeat``, ``--tcp``, ``--flush``);
* ``bench_server``: a private embedded server, or a given URL that must be empty (the
  benchmarks FLUSHALL between phases, so a server holding data is refused unless --flush);
* ``describe_environment``: Python, redis-py, hiredis and server versions, printed with the
  figures so that a number is never quoted without what produced it;
* ``RedisBenchmark`` and ``run_baselines``: ``redis-benchmark`` (or ``valkey-benchmark``)
  EVALSHA throughput on the same server in the same run, the yardstick our figures are
  divided by; a missing binary is reported, never fatal;
* timing, number formatting, PASS/MISS against a target and an aligned text table.

The modules are run as scripts (``python bench/core.py``), so they import this one as
``_common`` (the script's directory is first on sys.path); no package is needed.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any, TypeVar

import redis
import redis.connection
import redis.utils

from jobqueue.store.connection import check, redact, sync_client
from jobqueue.store.embedded import EmbeddedServer

T = TypeVar("T")

BENCHMARK_BINARIES = ("redis-benchmark", "valkey-benchmark")
BASELINE_REQUESTS = 100_000
QUICK_BASELINE_REQUESTS = 20_000
BASELINE_TIMEOUT_S = 300.0

# The trivial script: the cost of one EVALSHA round trip and nothing else.
TRIVIAL_SCRIPT = "return 1"

# One run's worth of create_run's writes: the 12-field record HSET and the due ZADD, with the
# key prefix passed in ARGV as jobqueue's scripts do. Called as
# ``EVALSHA <sha> 1 <due key> <prefix> <run id>``; redis-benchmark's -r option turns
# __rand_int__ into a fresh id per call, so every call writes a new record like enqueue does.
WRITE_SCRIPT = """\
local key = ARGV[1] .. ARGV[2]
redis.call('HSET', key, 'state', 'pending', 'queue', 'default', 'task', 'bench_noop',
  'payload', '{"args":[0],"kwargs":{}}', 'due', 0, 'attempt', 0, 'max_attempts', 3,
  'fence', 0, 'lease_ms', 0, 'timeout_ms', 0, 'job', '', 'created', 0)
redis.call('ZADD', KEYS[1], 0, ARGV[2])
return 1
"""
WRITE_KEY_PREFIX = "jqbench:run:"
WRITE_DUE_KEY = "jqbench:due"


class BenchError(Exception):
    """A benchmark could not run or produced an inconsistent result."""


# -- command line -----------------------------------------------------------------------------


def add_common_args(parser: argparse.ArgumentParser, *, default_n: int, quick_n: int) -> None:
    parser.add_argument(
        "--url",
        help="Redis URL to measure on (redis://, rediss://, unix://); default: a private "
        "embedded server on a unix socket",
    )
    parser.add_argument(
        "--n", type=int, default=None, help=f"runs per phase (default {default_n:,})"
    )
    parser.add_argument(
        "--quick", action="store_true", help=f"smoke run: N = {quick_n:,} unless --n is given"
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="measure each phase this many times and keep the fastest (default 1)",
    )
    parser.add_argument(
        "--tcp",
        action="store_true",
        help="the private embedded server listens on 127.0.0.1 (TCP loopback, as most users "
        "run) instead of a unix socket",
    )
    parser.add_argument(
        "--flush",
        action="store_true",
        help="allow a --url server that already holds keys (it is FLUSHALLed: all data lost)",
    )
    parser.set_defaults(_default_n=default_n, _quick_n=quick_n)


def runs_from_args(args: argparse.Namespace) -> int:
    n: int = args.n if args.n is not None else (args._quick_n if args.quick else args._default_n)
    if n < 1:
        raise SystemExit("--n must be at least 1")
    if args.repeat < 1:
        raise SystemExit("--repeat must be at least 1")
    return n


# -- the server -------------------------------------------------------------------------------


@dataclass
class BenchServer:
    """The server under measurement and a plain client for setup, checks and cleanup."""

    url: str
    client: Any
    embedded: EmbeddedServer | None

    def flush(self) -> None:
        """FLUSHALL: every database is emptied (the script cache is kept)."""
        self.client.flushall()


def free_tcp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def keyspace_size(client: Any) -> int:
    """Keys in all databases (DBSIZE sees only the selected one; FLUSHALL clears them all)."""
    info = client.info("keyspace")
    return sum(int(db.get("keys", 0)) for db in info.values() if isinstance(db, dict))


@contextmanager
def bench_server(
    url: str | None, *, allow_flush: bool, tcp: bool = False
) -> Iterator[BenchServer]:
    """A private embedded server (no URL; on TCP loopback with ``tcp``), or the given one if
    it is empty or --flush allows wiping it. The server is left flushed, and an embedded one
    stopped, on the way out."""
    if url and "+cluster" in url.split("://", 1)[0]:
        raise BenchError("the benchmarks measure one server; cluster URLs are not supported")
    if url and tcp:
        raise BenchError("--tcp starts a private server: give either --tcp or --url")
    embedded = None
    resolved = url or ""
    if not url:
        port = free_tcp_port() if tcp else 0
        # Later options win: the socket stays (setup), the port is opened on loopback only.
        extra = ("--port", str(port), "--bind", "127.0.0.1") if tcp else ()
        embedded = EmbeddedServer(extra_args=extra).start()
        resolved = f"redis://127.0.0.1:{port}/0" if tcp else embedded.url
    client: Any = None
    server: BenchServer | None = None
    try:
        client = sync_client(resolved)
        check(client, resolved)
        existing = keyspace_size(client)
        if existing and not allow_flush:
            raise BenchError(
                f"{redact(resolved)} holds {existing:,} key{'' if existing == 1 else 's'}; "
                "the benchmark FLUSHALLs the server, so it refuses to run there unless "
                "--flush is given"
            )
        server = BenchServer(resolved, client, embedded)
        server.flush()
        yield server
    finally:
        if server is not None and embedded is None:
            with suppress(redis.exceptions.RedisError):
                server.flush()  # leave no benchmark data behind on a given server
        if client is not None:
            client.close()
        if embedded is not None:
            embedded.stop()


# -- the environment --------------------------------------------------------------------------


@dataclass(frozen=True)
class Environment:
    python: str
    redis_py: str
    hiredis: bool
    parser: str
    server_name: str
    server_version: str
    server_where: str
    cpus: int
    load: tuple[float, float, float] | None  # the host's load averages when measured

    def lines(self) -> list[str]:
        hiredis = "yes" if self.hiredis else "NO (pure-Python parser: figures are pessimistic)"
        return [
            f"python {self.python} ({platform.python_implementation()}), "
            f"redis-py {self.redis_py}, hiredis {hiredis}",
            f"redis.utils.HIREDIS_AVAILABLE={self.hiredis}, parser {self.parser}",
            f"server {self.server_name} {self.server_version} at {self.server_where}",
            f"{self.cpus} CPUs on this host, shared by client, server and redis-benchmark; "
            + (
                "load average {:.2f} {:.2f} {:.2f}".format(*self.load)
                if self.load
                else "load average unknown"
            ),
        ]


def describe_environment(server: BenchServer) -> Environment:
    info = server.client.info("server")
    if "valkey_version" in info:
        name, version = "valkey", str(info["valkey_version"])
    else:
        name, version = str(info.get("server_name") or "redis"), str(info["redis_version"])
    where = redact(server.url)
    if server.embedded is not None:
        where = f"{where} (embedded: {server.embedded.binary})"
    return Environment(
        python=platform.python_version(),
        redis_py=redis.__version__,
        hiredis=bool(redis.utils.HIREDIS_AVAILABLE),
        parser=redis.connection.DefaultParser.__name__,
        server_name=name,
        server_version=version,
        server_where=where,
        cpus=os.cpu_count() or 1,
        load=os.getloadavg() if hasattr(os, "getloadavg") else None,
    )


# -- redis-benchmark --------------------------------------------------------------------------


def find_benchmark_binary() -> str | None:
    for name in BENCHMARK_BINARIES:
        found = shutil.which(name)
        if found:
            return found
    return None


def benchmark_connection_args(url: str) -> list[str]:
    """The redis-benchmark options that reach the server of a redis-py URL."""
    kwargs = redis.connection.parse_url(url)
    args: list[str] = []
    if kwargs.get("path"):
        args += ["-s", str(kwargs["path"])]
    else:
        host, port = kwargs.get("host") or "127.0.0.1", kwargs.get("port") or 6379
        args += ["-h", str(host), "-p", str(port)]
    if kwargs.get("password"):
        args += ["-a", str(kwargs["password"])]
        if kwargs.get("username"):
            args += ["--user", str(kwargs["username"])]
    if kwargs.get("db"):
        args += ["--dbnum", str(kwargs["db"])]
    connection_class = kwargs.get("connection_class")
    if isinstance(connection_class, type) and issubclass(
        connection_class, redis.connection.SSLConnection
    ):
        args.append("--tls")
    return args


_RPS = re.compile(r"([0-9]+(?:\.[0-9]+)?) requests per second")


@dataclass(frozen=True)
class Baseline:
    """One redis-benchmark figure (or why there is none)."""

    label: str
    clients: int
    pipeline: int
    ops_per_s: float | None
    error: str | None = None

    @property
    def options(self) -> str:
        return f"-c {self.clients} -P {self.pipeline}"


class RedisBenchmark:
    """Runs redis-benchmark against the server of ``url`` and parses its -q output."""

    def __init__(self, binary: str, url: str, requests: int) -> None:
        self.binary = binary
        self.connection = benchmark_connection_args(url)
        self.requests = requests

    def version(self) -> str:
        try:
            out = subprocess.run(
                [self.binary, "--version"], capture_output=True, text=True, timeout=10
            ).stdout
        except (OSError, subprocess.SubprocessError):
            return "unknown version"
        return out.strip() or "unknown version"

    def run(
        self,
        label: str,
        command: Sequence[str],
        *,
        clients: int,
        pipeline: int,
        random_range: int | None = None,
    ) -> Baseline:
        argv = [
            self.binary,
            *self.connection,
            "-n",
            str(self.requests),
            "-c",
            str(clients),
            "-P",
            str(pipeline),
            "-q",
        ]
        if random_range is not None:
            argv += ["-r", str(random_range)]
        argv += list(command)
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=BASELINE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return Baseline(label, clients, pipeline, None, f"timed out ({BASELINE_TIMEOUT_S} s)")
        except OSError as exc:
            return Baseline(label, clients, pipeline, None, f"could not run: {exc}")
        # -q still draws a progress line ending in \r; the last "requests per second" wins.
        found = _RPS.findall(proc.stdout)
        if proc.returncode != 0 or not found:
            detail = (proc.stderr or proc.stdout).strip().splitlines()
            reason = detail[-1] if detail else f"exit status {proc.returncode}"
            return Baseline(label, clients, pipeline, None, reason[:120])
        return Baseline(label, clients, pipeline, float(found[-1]))


@dataclass(frozen=True)
class Baselines:
    """The standard set: the trivial script one round trip at a time, and the write script
    one at a time (-c 1 -P 1), with 50 clients (-c 50) and pipelined (-c 1 -P 16)."""

    tool: str | None  # the binary and its version, or None when there is none
    requests: int
    trivial_serial: Baseline | None = None
    write_serial: Baseline | None = None
    write_concurrent: Baseline | None = None
    write_pipelined: Baseline | None = None

    def all(self) -> list[Baseline]:
        return [
            b
            for b in (
                self.trivial_serial,
                self.write_serial,
                self.write_concurrent,
                self.write_pipelined,
            )
            if b is not None
        ]


def run_baselines(server: BenchServer, requests: int) -> Baselines:
    """Measure the standard baselines on ``server`` (leaves it flushed)."""
    binary = find_benchmark_binary()
    if binary is None:
        return Baselines(tool=None, requests=requests)
    bench = RedisBenchmark(binary, server.url, requests)
    trivial = server.client.script_load(TRIVIAL_SCRIPT)
    write = server.client.script_load(WRITE_SCRIPT)
    write_cmd = ["EVALSHA", write, "1", WRITE_DUE_KEY, WRITE_KEY_PREFIX, "__rand_int__"]
    write_label = "HSET(12 fields)+ZADD script"
    rand = 1_000_000_000
    try:
        return Baselines(
            tool=f"{binary} ({bench.version()})",
            requests=requests,
            trivial_serial=bench.run(
                "'return 1' script", ["EVALSHA", trivial, "0"], clients=1, pipeline=1
            ),
            write_serial=bench.run(
                write_label, write_cmd, clients=1, pipeline=1, random_range=rand
            ),
            write_concurrent=bench.run(
                write_label, write_cmd, clients=50, pipeline=1, random_range=rand
            ),
            write_pipelined=bench.run(
                write_label, write_cmd, clients=1, pipeline=16, random_range=rand
            ),
        )
    finally:
        server.flush()


def python_evalsha_rate(server: BenchServer, n: int, warmup: int) -> float:
    """The same write script through redis-py, one EVALSHA per call: the floor a Python
    client pays per round trip, between redis-benchmark's figure and ours."""
    client = server.client
    sha = client.script_load(WRITE_SCRIPT)
    for i in range(warmup):
        client.evalsha(sha, 1, WRITE_DUE_KEY, WRITE_KEY_PREFIX, f"w{i}")
    start = time.perf_counter()
    for i in range(n):
        client.evalsha(sha, 1, WRITE_DUE_KEY, WRITE_KEY_PREFIX, str(i))
    elapsed = time.perf_counter() - start
    server.flush()
    return n / elapsed


# -- timing -----------------------------------------------------------------------------------


def server_cpu_seconds(client: Any) -> float:
    """CPU the server process has used (user + system), from INFO cpu."""
    info = client.info("cpu")
    return float(info.get("used_cpu_user", 0.0)) + float(info.get("used_cpu_sys", 0.0))


@dataclass(frozen=True)
class Sample:
    """One timed piece of work: wall seconds (perf_counter), and the CPU seconds this process
    and the server spent meanwhile. CPU near wall time on one side says who is the limit;
    client + server near wall time says the two take turns (one round trip at a time)."""

    seconds: float
    client_cpu: float
    server_cpu: float


def sampled(server: BenchServer, fn: Callable[[], T]) -> tuple[T, Sample]:
    """``fn()`` and its Sample; the server's CPU is read outside the timed interval."""
    server_before = server_cpu_seconds(server.client)
    cpu_before = time.process_time()
    start = time.perf_counter()
    result = fn()
    seconds = time.perf_counter() - start
    client_cpu = time.process_time() - cpu_before
    server_cpu = server_cpu_seconds(server.client) - server_before
    return result, Sample(seconds, client_cpu, server_cpu)


def fastest(repeat: int, phase: Callable[[], Sample]) -> Sample:
    """Run a phase ``repeat`` times and keep the fastest sample."""
    return min((phase() for _ in range(repeat)), key=lambda s: s.seconds)


@dataclass(frozen=True)
class Measurement:
    name: str
    runs: int
    sample: Sample
    target: float | None = None  # runs/s the issue asks for
    baseline: Baseline | None = None  # the redis-benchmark figure it is compared with

    @property
    def seconds(self) -> float:
        return self.sample.seconds

    @property
    def rate(self) -> float:
        return self.runs / self.seconds if self.seconds > 0 else float("inf")

    @property
    def verdict(self) -> str:
        if self.target is None:
            return ""
        return "PASS" if self.rate >= self.target else "MISS"

    @property
    def ratio(self) -> float | None:
        if self.baseline is None or not self.baseline.ops_per_s:
            return None
        return self.rate / self.baseline.ops_per_s

    def per_run_us(self, cpu_seconds: float) -> float:
        return cpu_seconds / self.runs * 1e6


def warmup_size(n: int) -> int:
    """Warm-up work before a measurement: a tenth of it, between 100 and 1,000."""
    return max(100, min(1_000, n // 10))


# -- output -----------------------------------------------------------------------------------


def fmt_int(value: float) -> str:
    return f"{value:,.0f}"


def fmt_ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def format_table(
    headers: Sequence[str], rows: Sequence[Sequence[str]], align: str | None = None
) -> str:
    """An aligned text table; ``align`` has one 'l' or 'r' per column (default: first column
    left, the rest right)."""
    columns = len(headers)
    align = align or "l" + "r" * (columns - 1)
    if len(align) != columns or any(len(r) != columns for r in rows):
        raise ValueError("every row and the alignment need one entry per column")
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows, strict=True)]

    def line(cells: Sequence[str]) -> str:
        parts = [
            str(c).ljust(w) if a == "l" else str(c).rjust(w)
            for c, w, a in zip(cells, widths, align, strict=True)
        ]
        return "  ".join(parts).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), rule, *(line(r) for r in rows)])


def baseline_table(baselines: Baselines, extra: Sequence[tuple[str, str, float]] = ()) -> str:
    """The baselines as a table; ``extra`` rows are (what, how, ops/s) measured otherwise."""
    rows = [
        [
            b.label,
            b.options,
            fmt_int(b.ops_per_s) if b.ops_per_s is not None else f"n/a: {b.error}",
        ]
        for b in baselines.all()
    ]
    rows += [[what, how, fmt_int(rate)] for what, how, rate in extra]
    return format_table(["baseline (EVALSHA)", "clients/pipeline", "ops/s"], rows, "llr")


def fmt_share(cpu_seconds: float, wall_seconds: float) -> str:
    return "-" if wall_seconds <= 0 else f"{cpu_seconds / wall_seconds:.0%}"


def measurement_table(measurements: Sequence[Measurement]) -> str:
    """Our figures: rate, target and verdict, where the time went (CPU share of the wall time
    and CPU microseconds per run, client / server), and the ratio to the baseline."""
    rows = []
    for m in measurements:
        base = m.baseline
        if base is None:
            versus = "-"
        elif base.ops_per_s is None:
            versus = f"{base.options} (n/a)"
        else:
            versus = f"{base.options} {fmt_int(base.ops_per_s)}/s"
        s = m.sample
        rows.append(
            [
                m.name,
                fmt_int(m.runs),
                f"{m.seconds:.3f}",
                fmt_int(m.rate),
                "-" if m.target is None else f">= {fmt_int(m.target)}",
                m.verdict or "-",
                f"{fmt_share(s.client_cpu, s.seconds)} / {fmt_share(s.server_cpu, s.seconds)}",
                f"{m.per_run_us(s.client_cpu):.1f} / {m.per_run_us(s.server_cpu):.1f}",
                versus,
                fmt_ratio(m.ratio),
            ]
        )
    headers = [
        "measurement",
        "runs",
        "seconds",
        "runs/s",
        "target",
        "",
        "cpu cli/srv",
        "us/run cli/srv",
        "vs baseline",
        "ratio",
    ]
    return format_table(headers, rows, "lrrrrlrrrr")


def say(text: str = "") -> None:
    print(text, flush=True)


def fail(message: str, status: int = 1) -> int:
    print(f"error: {message}", file=sys.stderr, flush=True)
    return status
