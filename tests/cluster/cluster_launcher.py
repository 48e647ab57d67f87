"""A throwaway Redis Cluster on loopback: N masters (+ one replica each), free TCP ports, a
private temp dir, built with plain CLUSTER commands from redis-py (no redis-cli needed, so it
works with any cluster-capable server binary). Used by the cluster tests and bench/cluster.py.

Every node dies with the process that started it (PR_SET_PDEATHSIG), and ``stop()`` kills
them all, so nothing is left running even when a test run is interrupted.
"""

from __future__ import annotations

import contextlib
import ctypes
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

SLOTS = 16384
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(count: int) -> list[int]:
    """Ports p that are free together with their cluster bus port p + 10000."""
    ports: list[int] = []
    while len(ports) < count:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + 10000 < 65536 and port not in ports and _port_is_free(port + 10000):
            ports.append(port)
    return ports


def in_slots(slot: int, entries: list[Any]) -> bool:
    """Whether slot is in CLUSTER NODES slot entries: ranges ['0', '5460'], single slots
    ['42'], and migration markers ('[42->-id]', skipped)."""
    for entry in entries:
        bounds = [int(x) for x in entry if str(x).lstrip("-").isdigit()]
        if bounds and bounds[0] <= slot <= bounds[-1]:
            return True
    return False


@dataclass
class Node:
    port: int
    directory: Path
    args: list[str]
    process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def client(self, **kwargs: Any) -> redis.Redis:
        return redis.Redis(
            host="127.0.0.1", port=self.port, decode_responses=True, socket_timeout=5, **kwargs
        )

    def start(self) -> None:
        if self.alive:
            raise RuntimeError(f"cluster node {self.port} is already running")
        log = (self.directory / "server.log").open("ab")
        self.process = subprocess.Popen(
            self.args,
            cwd=self.directory,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,
        )
        log.close()

    def kill(self) -> None:
        """SIGKILL: what a crashed machine looks like (no shutdown save, no goodbye)."""
        proc, self.process = self.process, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def wait_ready(self, deadline: float) -> None:
        while True:
            if self.process is not None and self.process.poll() is not None:
                log = (self.directory / "server.log").read_text(errors="replace")
                raise RuntimeError(f"cluster node {self.port} exited at start:\n{log[-2000:]}")
            try:
                with self.client() as c:
                    c.ping()
                return
            except redis.exceptions.RedisError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"cluster node {self.port} did not answer") from None
                time.sleep(0.02)


@dataclass
class Cluster:
    binary: str
    masters: int = 3
    replicas: int = 1
    node_timeout_ms: int = 1000
    appendonly: bool = True
    directory: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="jqc-")))
    nodes: list[Node] = field(default_factory=list)

    @property
    def url(self) -> str:
        """One seed node is enough: redis-py discovers the rest (and every topology change)."""
        seeds = [n for n in self.nodes if n.alive]
        return f"redis+cluster://{seeds[0].address}"

    # -- life cycle ------------------------------------------------------------------------

    def start(self, timeout: float = 30.0) -> Cluster:
        try:
            self._start(time.monotonic() + timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, deadline: float) -> None:
        count = self.masters * (1 + self.replicas)
        for port in free_ports(count):
            d = self.directory / str(port)
            d.mkdir()
            args = [
                self.binary,
                "--port", str(port),
                "--bind", "127.0.0.1",
                "--cluster-enabled", "yes",
                "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", str(self.node_timeout_ms),
                # A replica may always take over, however long it was cut off (tests kill
                # masters on purpose; a production cluster keeps the default).
                "--cluster-replica-validity-factor", "0",
                # jobqueue's recommended setting: a master down takes its own slots' partitions
                # away, not the whole cluster's (docs/operations.md).
                "--cluster-require-full-coverage", "no",
                # A restored node syncs at once (the default waits 5 s for more replicas).
                "--repl-diskless-sync-delay", "0",
                "--appendonly", "yes" if self.appendonly else "no",
                "--save", "",
                "--dir", str(d),
                "--daemonize", "no",
                "--loglevel", "notice",
            ]  # fmt: skip
            self.nodes.append(Node(port, d, args))
        for n in self.nodes:
            n.start()
        for n in self.nodes:
            n.wait_ready(deadline)
        clients = [n.client() for n in self.nodes]
        try:
            ids = [c.execute_command("CLUSTER MYID") for c in clients]
            per = SLOTS // self.masters
            for i, c in enumerate(clients[: self.masters]):
                lo = i * per
                hi = SLOTS - 1 if i == self.masters - 1 else lo + per - 1
                c.execute_command("CLUSTER ADDSLOTSRANGE", lo, hi)
                c.execute_command("CLUSTER SET-CONFIG-EPOCH", i + 1)
            for n in self.nodes[1:]:
                clients[0].execute_command("CLUSTER MEET", "127.0.0.1", n.port)
            self._wait(deadline, "nodes to meet", lambda: all(
                self._known_nodes(c) == len(self.nodes) for c in clients))
            for j, c in enumerate(clients[self.masters :]):
                master_id = ids[j % self.masters]
                self._wait(deadline, "replica to see its master", lambda c=c, m=master_id:
                           self._try(c, "CLUSTER REPLICATE", m))
            self._wait(deadline, "cluster_state:ok", self.healthy)
        finally:
            for c in clients:
                c.close()

    def stop(self) -> None:
        for n in self.nodes:
            n.kill()
        shutil.rmtree(self.directory, ignore_errors=True)

    # -- state -----------------------------------------------------------------------------

    def topology(self) -> list[dict[str, Any]]:
        """CLUSTER NODES as seen by a live node: id, port, role, master id, flags."""
        for n in self.nodes:
            if not n.alive:
                continue
            try:
                with n.client() as c:
                    text = c.execute_command("CLUSTER NODES")
            except redis.exceptions.RedisError:
                continue
            rows = []
            for address, row in dict(text).items():  # redis-py parses CLUSTER NODES
                flags = row["flags"].split(",")
                rows.append({
                    "id": row["node_id"],
                    "port": int(address.split("@")[0].rsplit(":", 1)[1]),
                    "role": "master" if "master" in flags else "replica",
                    "master_id": None if row["master_id"] == "-" else row["master_id"],
                    "failed": "fail" in flags or "fail?" in flags,
                    "connected": bool(row["connected"]),
                    "slots": row["slots"],
                })
            return rows
        raise RuntimeError("no cluster node answers")

    def node(self, port: int) -> Node:
        return next(n for n in self.nodes if n.port == port)

    def master_nodes(self) -> list[Node]:
        """Live masters that serve slots."""
        return [
            self.node(r["port"])
            for r in self.topology()
            if r["role"] == "master" and r["slots"] and not r["failed"]
            and self.node(r["port"]).alive
        ]

    def healthy(self) -> bool:
        """Every live node says cluster_state:ok, and every live master has a live replica
        whose link is up (so a failover test has someone to promote)."""
        try:
            for n in self.nodes:
                if not n.alive:
                    continue
                with n.client() as c:
                    if c.cluster("INFO").get("cluster_state") != "ok":
                        return False
            rows = self.topology()
        except redis.exceptions.RedisError:
            return False
        alive = {n.port for n in self.nodes if n.alive}
        masters = [r for r in rows if r["role"] == "master" and r["slots"] and not r["failed"]]
        if len(masters) != self.masters or any(r["port"] not in alive for r in masters):
            return False
        if self.replicas:
            for m in masters:
                with self.node(m["port"]).client() as c:
                    info = c.info("replication")
                # Online, not merely connected: a replica still in its first sync has no data
                # to take over with.
                replicas = [v for k, v in info.items() if k.startswith("slave") and
                            isinstance(v, dict)]
                if not any(r.get("state") == "online" for r in replicas):
                    return False
        return self._roles_agreed(alive)

    def _roles_agreed(self, alive: set[int]) -> bool:
        """Every live node's CLUSTER NODES lists the live replicas as replicas. A master
        learns from its replication link that a replica is online before the cluster bus's
        gossip changes its role in every node's table, and a client asking such a node saw
        a cluster of 6 masters and no replica (seen under load)."""
        expected = len(alive) - self.masters
        for n in self.nodes:
            if not n.alive:
                continue
            try:
                with n.client() as c:
                    table = dict(c.execute_command("CLUSTER NODES"))
            except redis.exceptions.RedisError:
                return False
            replicas = [
                address for address, row in table.items()
                if "slave" in row["flags"].split(",")
                and int(address.split("@")[0].rsplit(":", 1)[1]) in alive
            ]  # fmt: skip
            if len(replicas) != expected:
                return False
        return True

    def slots_of(self, port: int) -> list[Any]:
        """The slot ranges a node serves (as CLUSTER NODES lists them)."""
        row = next(r for r in self.topology() if r["port"] == port)
        return list(row["slots"])

    def serves(self, port: int, slot: int) -> bool:
        return in_slots(slot, self.slots_of(port))

    def master_of_slot(self, slot: int) -> Node:
        return next(n for n in self.master_nodes() if self.serves(n.port, slot))

    def replica_of(self, master: Node) -> Node:
        rows = self.topology()
        master_id = next(r["id"] for r in rows if r["port"] == master.port)
        return self.node(next(r["port"] for r in rows if r["master_id"] == master_id))

    def node_id(self, node: Node) -> str:
        return str(next(r["id"] for r in self.topology() if r["port"] == node.port))

    def wait_replicated(self, timeout: float = 10.0) -> None:
        """Every master's replica has acknowledged everything the master wrote so far."""
        deadline = time.monotonic() + timeout
        for node in self.master_nodes():
            with node.client() as c:
                while True:
                    info = c.info("replication")
                    if info.get("role") != "master":
                        break  # the topology read was stale: it is a replica now
                    replica = info.get("slave0") or {}
                    if int(replica.get("offset", -1)) >= int(info["master_repl_offset"]):
                        break
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"replica of {node.port} lags: {info}")
                    time.sleep(0.02)

    def restore(self, node: Node, timeout: float = 60.0) -> None:
        """Bring a killed (or stopped) node back: it rejoins as a replica of its heir, and the
        rest of the session has six nodes and a replica for every master again."""
        if node.process is not None and node.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                node.process.send_signal(signal.SIGCONT)
        if not node.alive:
            node.start()
        self.wait_healthy(timeout=timeout)

    def wait_healthy(self, timeout: float = 30.0) -> None:
        self._wait(time.monotonic() + timeout, "a healthy cluster", self.healthy)

    def flush(self) -> None:
        """Empty every master and every node's script cache (each test starts clean, and
        NOSCRIPT recovery is exercised all the time)."""
        for n in self.master_nodes():
            with n.client() as c:
                c.flushall()
        for n in self.nodes:
            if n.alive:
                with n.client() as c:
                    c.script_flush()

    # -- helpers ---------------------------------------------------------------------------

    @staticmethod
    def _known_nodes(c: redis.Redis) -> int:
        nodes = dict(c.execute_command("CLUSTER NODES"))
        return sum(1 for row in nodes.values() if "handshake" not in row["flags"])

    @staticmethod
    def _try(c: redis.Redis, *command: Any) -> bool:
        try:
            c.execute_command(*command)
            return True
        except redis.exceptions.ResponseError:
            return False

    @staticmethod
    def _wait(deadline: float, what: str, ok: Any) -> None:
        while not ok():
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out waiting for {what}")
            time.sleep(0.05)
