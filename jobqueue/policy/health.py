"""What ``jobqueue check`` verifies: the Redis settings that jobqueue's guarantees rest on
(docs/guarantees.md), on a single server or on every master and replica of a cluster.

The checks are pure functions of what was read from the nodes (a ``Reading``) and return
``Check`` results, one printed line each; the reader that fills a ``Reading`` (INFO, CONFIG GET,
TIME and SCRIPT LOAD on one server, or on every node ``CLUSTER NODES`` lists) is the client's,
``jobqueue.ops.health``.

Nodes that share a verdict share a line ("... on all 6 nodes"); a node that differs gets its
own. A ``warn`` means a setting is not as the guarantees need it, or could not be read.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

OK, WARN = "ok", "warn"

# The first servers that parse the '#!lua' line jobqueue's scripts start with (Valkey forked
# from Redis 7.2).
MIN_REDIS = (7, 0)
MIN_VALKEY = (7, 2)
# The time budgeted for a failover: the node timeout to detect the failure, and about as long
# again to elect and promote a replica.
FAILOVER_NODE_TIMEOUTS = 2
MAX_NODE_SKEW_MS = 100.0
# The host's clock decides nothing (every time that decides is a server's): only a gross
# error is worth a warning.
MAX_HOST_SKEW_MS = 1000.0
# Seconds since a replica last acknowledged its master (replicas acknowledge every second);
# also the default of Redis's own measure of a replica in sync, min-replicas-max-lag.
MAX_REPLICA_LAG_S = 10.0
# TIME is read this many times per node; the sample with the shortest round trip is kept.
TIME_SAMPLES = 3


@dataclass(frozen=True)
class Check:
    """One line of ``jobqueue check``: which check, ok or warn, what it found and what that
    means or what to change, and the addresses of the nodes the line is about."""

    name: str
    status: str
    detail: str
    nodes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.status == OK

    def line(self) -> str:
        return f"{'ok  ' if self.ok else 'WARN'}  {self.detail}"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "detail": self.detail,
                "nodes": list(self.nodes)}  # fmt: skip


def ok(name: str, detail: str, nodes: Iterable[str] = ()) -> Check:
    return Check(name, OK, detail, tuple(nodes))


def warn(name: str, detail: str, nodes: Iterable[str] = ()) -> Check:
    return Check(name, WARN, detail, tuple(nodes))


@dataclass(frozen=True)
class ReplicaLink:
    """A replica as its master's INFO replication lists it."""

    address: str
    state: str  # "online" once in sync; wait_bgsave, send_bulk, ... while syncing
    offset: int  # the replication offset it acknowledged
    lag_s: int  # seconds since its last acknowledgement


@dataclass(frozen=True)
class NodeReading:
    """What was read from one node. A field left ``None`` was not read (``refused`` says why);
    ``error`` set: the node could not be reached, and nothing else was read."""

    address: str
    role: str = "master"  # or "replica"
    master: str | None = None  # a replica's master
    slots: int = 0  # cluster: how many slots this master serves
    flags: tuple[str, ...] = ()  # cluster: what CLUSTER NODES flags (fail, fail?, ...)
    server: str = "redis"  # or "valkey"
    version: str | None = None
    cluster_enabled: bool = False
    maxmemory_policy: str | None = None
    appendonly: bool | None = None
    appendfsync: str | None = None
    save: str | None = None  # CONFIG GET save: "" when no RDB snapshot is configured
    last_save_s: int | None = None  # rdb_last_save_time (unix seconds)
    node_timeout_ms: int | None = None
    repl_offset: int | None = None  # master_repl_offset
    replicas: tuple[ReplicaLink, ...] = ()
    master_link_up: bool | None = None  # a replica's link to its master
    link_down_s: int | None = None  # master_link_down_since_seconds
    clock_s: float | None = None  # the node's TIME
    clock_offset_ms: float | None = None  # its clock minus the host's, mid round trip
    rtt_ms: float | None = None  # the round trip of that TIME
    refused: tuple[str, ...] = ()
    error: str | None = None


@dataclass(frozen=True)
class Reading:
    cluster: bool
    nodes: tuple[NodeReading, ...]
    scripts_error: str | None = None  # None: every script loaded


@dataclass(frozen=True)
class Limits:
    lease_s: float  # the shortest lease in use: a worker's --lease, a task's lease=
    max_node_skew_ms: float = MAX_NODE_SKEW_MS
    max_host_skew_ms: float = MAX_HOST_SKEW_MS
    max_replica_lag_s: float = MAX_REPLICA_LAG_S


# -- the checks ----------------------------------------------------------------------------


def evaluate(reading: Reading, limits: Limits) -> list[Check]:
    """Every check, in the order ``jobqueue check`` prints them."""
    return [
        *connection(reading),
        *version(reading),
        *eviction(reading),
        *persistence(reading),
        *replication(reading, limits),
        *(node_timeout(reading, limits) if reading.cluster else []),
        *host_clock(reading, limits),
        *node_clocks(reading, limits),
        *scripts(reading),
    ]


# status, what was found, what it means or what to change ("" when there is nothing to add)
Verdict = tuple[str, str, str]


def _live(reading: Reading) -> list[NodeReading]:
    return [n for n in reading.nodes if n.error is None]


def _per_node(
    name: str, reading: Reading, verdict: Callable[[NodeReading], Verdict]
) -> list[Check]:
    """One line per distinct verdict over the nodes that answered, naming its nodes on a
    cluster: "maxmemory-policy noeviction on all 6 nodes", "... allkeys-lru on 10.0.0.2:7000"."""
    live = _live(reading)
    groups: dict[Verdict, list[str]] = {}
    for node in live:
        groups.setdefault(verdict(node), []).append(node.address)
    out = []
    for (status, found, meaning), addresses in groups.items():
        where = ""
        if reading.cluster:
            every = len(addresses) == len(live) > 1
            answered = "" if len(live) == len(reading.nodes) else " that answered"
            where = (f" on all {len(live)} nodes{answered}" if every
                     else " on " + ", ".join(addresses))  # fmt: skip
        out.append(Check(name, status, found + where + (f": {meaning}" if meaning else ""),
                         tuple(addresses)))  # fmt: skip
    return out


def _unknown(node: NodeReading, what: str, *commands: str) -> Verdict:
    """Not read: says which of ``commands`` the server refused, and why."""
    why = [r for r in node.refused if r.startswith(commands)] or ["the server did not report it"]
    return WARN, f"{what} unknown", f"not read ({'; '.join(why)})"


def _server(node: NodeReading) -> str:
    return f"{node.server} {node.version}" if node.version else "of unknown version"


def connection(reading: Reading) -> list[Check]:
    """Connected. On a cluster, every node CLUSTER NODES lists: each must answer and not be
    flagged failing by the cluster."""
    if not reading.cluster:
        (node,) = reading.nodes
        if node.cluster_enabled:
            return [warn("connection", f"connected; server {_server(node)} is a cluster node: "
                         "use a redis+cluster:// URL (a plain connection cannot follow its "
                         "slots)", [node.address])]  # fmt: skip
        return [ok("connection", f"connected; server {_server(node)}", [node.address])]
    masters = sum(1 for n in reading.nodes if n.role == "master")
    out = [ok("connection", f"connected; cluster of {masters} master(s) and "
              f"{len(reading.nodes) - masters} replica(s)")]  # fmt: skip
    for node in reading.nodes:
        role = (f"master, {node.slots} slots" if node.role == "master"
                else f"replica of {node.master or '?'}")  # fmt: skip
        failing = [f for f in node.flags if f in ("fail", "fail?", "noaddr", "handshake")]
        here = f"node {node.address} ({role})"
        if failing:
            here += f", flagged {','.join(failing)} by the cluster"
        if node.error is not None:
            out.append(warn("node", f"{here}, unreachable ({node.error})", [node.address]))
        elif failing:
            out.append(warn("node", here, [node.address]))
        else:
            out.append(ok("node", f"{here}, {_server(node)}", [node.address]))
    return out


def version_verdict(node: NodeReading) -> Verdict:
    found = re.match(r"(\d+)\.(\d+)", node.version or "")
    if found is None:
        return _unknown(node, "server version", "INFO")
    need = MIN_VALKEY if node.server == "valkey" else MIN_REDIS
    if (int(found.group(1)), int(found.group(2))) >= need:
        return OK, f"server version {_server(node)}", ""
    return (WARN, f"server version {_server(node)}",
            "older than Redis 7.0 / Valkey 7.2, it cannot parse the '#!lua' first line of "
            "jobqueue's scripts and runs a plain form without their flags (with them, a "
            "writing script is refused whole under maxmemory before it runs); upgrade")


def version(reading: Reading) -> list[Check]:
    return _per_node("version", reading, version_verdict)


def eviction_verdict(node: NodeReading) -> Verdict:
    policy = node.maxmemory_policy
    if policy is None:
        return _unknown(node, "maxmemory-policy", "CONFIG GET maxmemory-policy")
    if policy == "noeviction":
        return OK, "maxmemory-policy noeviction", ""
    return (WARN, f"maxmemory-policy {policy}",
            "runs can be evicted (a run lost, or left in no state); set noeviction")


def eviction(reading: Reading) -> list[Check]:
    return _per_node("maxmemory-policy", reading, eviction_verdict)


def persistence_verdict(node: NodeReading) -> Verdict:
    if node.appendonly is None:
        return _unknown(node, "persistence", "INFO")
    if node.appendonly:
        fsync = node.appendfsync
        found = f"persistence: appendonly yes, appendfsync {fsync}"
        if fsync == "always":
            return OK, found, "every write is on disk before it is acknowledged"
        if fsync == "everysec":
            return (OK, found,
                    "a crash of the server or its machine can lose about the last second of "
                    "acknowledged writes (up to 2 s when the disk is slow); appendfsync always "
                    "closes that, at one fsync per write")
        if fsync is None:
            return _unknown(node, "persistence: appendonly yes, appendfsync",
                            "CONFIG GET appendfsync")  # fmt: skip
        return (WARN, found,
                "the kernel decides when writes reach the disk (Linux: typically within 30 s) "
                "and a machine crash loses what it had not written; set appendfsync everysec "
                "(or always)")
    if node.save is None:
        _, _, not_read = _unknown(node, "", "CONFIG GET save")
        return (WARN, "persistence: appendonly no",
                "a crash loses every write since the last RDB snapshot, if any (snapshots "
                f"{not_read}); set appendonly yes (appendfsync everysec or always)")
    if node.save:
        ago = ""
        if node.last_save_s is not None and node.clock_s is not None:
            ago = f" (the last, {max(0, round(node.clock_s - node.last_save_s))} s ago)"
        return (WARN, f"persistence: appendonly no, RDB snapshots only (save '{node.save}')",
                f"a crash loses every write since the last snapshot{ago}; set appendonly yes "
                "(appendfsync everysec or always)")
    return (WARN, "persistence: appendonly no and no RDB snapshots",
            "a restart loses every run; set appendonly yes (appendfsync everysec or always)")


def persistence(reading: Reading) -> list[Check]:
    return _per_node("persistence", reading, persistence_verdict)


def replication(reading: Reading, limits: Limits) -> list[Check]:
    """The replicas of every master, with their lag. On a cluster every master that serves
    slots needs a connected replica (without one it cannot fail over), and a replica whose
    link to its master is down cannot take over. A single server needs no replica, but must
    not be one (a replica refuses writes). A replica that no master lists is reported on its own
    when its link to its master is down."""
    out = []
    listed = {link.address for n in _live(reading) for link in n.replicas}
    for node in _live(reading):
        if node.role == "master":
            out.append(replicas_of(node, reading.cluster, limits))
        elif not reading.cluster:
            out.append(warn("replication", f"this server is a replica of {node.master or '?'}: "
                            "it refuses writes; point the URL at its master", [node.address]))
        elif node.master_link_up is False and node.address not in listed:
            down = node.link_down_s
            since = f" for {down} s" if down is not None and down >= 0 else ""
            out.append(warn("replication", f"replica {node.address}: its link to its master "
                            f"{node.master or '?'} is down{since}, so it receives no writes",
                            [node.address]))  # fmt: skip
    return out


def replicas_of(node: NodeReading, cluster: bool, limits: Limits) -> Check:
    whose = f"replicas of {node.address}" if cluster else "replicas"
    if node.repl_offset is None:
        _, found, meaning = _unknown(node, whose, "INFO")
        return warn("replication", f"{found}: {meaning}", [node.address])
    shown, problems = [], []
    for link in node.replicas:
        behind = max(0, node.repl_offset - link.offset)
        shown.append(f"{link.address} ({link.state}, lag {link.lag_s} s, {behind} bytes behind)")
        if link.state != "online":
            problems.append(f"{link.address} is not in sync yet ({link.state}), so it cannot "
                            "take over")  # fmt: skip
        elif link.lag_s > limits.max_replica_lag_s:
            problems.append(f"{link.address} last acknowledged {link.lag_s} s ago, more than "
                            f"{limits.max_replica_lag_s:g} s: a failover to it now loses the "
                            "writes it has not received")  # fmt: skip
    if cluster and node.slots and not any(x.state == "online" for x in node.replicas):
        problems.append("no connected replica: this master cannot fail over (if it dies, its "
                        "slots are down until it is back); give it a replica")  # fmt: skip
    found = f"{whose}: " + (", ".join(shown) if shown else "none")
    nodes = [node.address, *(x.address for x in node.replicas)]
    if problems:
        return warn("replication", f"{found}; " + "; ".join(problems), nodes)
    if not shown:
        found += " (a master without slots)" if cluster else " (not required of a single server)"
    return ok("replication", found, nodes)


def node_timeout_verdict(node: NodeReading, limits: Limits) -> Verdict:
    timeout = node.node_timeout_ms
    if timeout is None:
        return _unknown(node, "cluster-node-timeout", "CONFIG GET cluster-node-timeout")
    failover_s = FAILOVER_NODE_TIMEOUTS * timeout / 1000
    found = f"cluster-node-timeout {timeout} ms"
    budget = (f"a failover is budgeted at {failover_s:g} s ({FAILOVER_NODE_TIMEOUTS} x node "
              "timeout: detection, then election)")  # fmt: skip
    lease = f"the {limits.lease_s:g} s lease"
    if failover_s < limits.lease_s:
        return OK, found, f"{budget}, less than {lease}"
    return (WARN, found,
            f"{budget}, not less than {lease}: the leases on a failed master can expire "
            "before its replica takes over, and their runs be claimed again while their "
            "workers may still be running them; set cluster-node-timeout below "
            f"{limits.lease_s * 1000 / FAILOVER_NODE_TIMEOUTS:.0f} ms (lease / "
            f"{FAILOVER_NODE_TIMEOUTS}), or give workers a --lease above {failover_s:g} s")


def node_timeout(reading: Reading, limits: Limits) -> list[Check]:
    return _per_node("cluster-node-timeout", reading, lambda n: node_timeout_verdict(n, limits))


def _clocked(reading: Reading) -> list[tuple[NodeReading, float]]:
    return [(n, n.clock_offset_ms) for n in _live(reading) if n.clock_offset_ms is not None]


def host_clock(reading: Reading, limits: Limits) -> list[Check]:
    """The host's clock against each node's. Every time that decides is a server's, so this
    only catches a gross error, which makes the host's own timestamps and logs mislead."""
    clocked = _clocked(reading)
    if not clocked:
        return []
    offsets = [offset for _, offset in clocked]
    if reading.cluster:
        found = f"clock skew host vs nodes {_ms(min(offsets), 1)} .. {_ms(max(offsets), 1)} ms"
    else:
        found = f"clock skew host vs server {_ms(offsets[0], 0)} ms"
    far = [n.address for n, offset in clocked if abs(offset) >= limits.max_host_skew_ms]
    if not far:
        return [ok("host-clock", f"{found} (decisions use the server's)")]
    where = " on " + ", ".join(far) if reading.cluster else ""
    return [warn("host-clock", f"{found}, {limits.max_host_skew_ms:g} ms or more{where}: "
                 "decisions use the server's, but the host's timestamps and logs mislead; "
                 "sync the host's clock (NTP)", far)]  # fmt: skip


def node_clocks(reading: Reading, limits: Limits) -> list[Check]:
    """The nodes' clocks against each other (each measured against the host's at the middle of
    a TIME round trip). jobqueue's fences are at least the server clock in microseconds, which
    keeps a replica promoted after it lagged from reissuing a fence its master issued as long
    as its clock trails its master's by less than a failover takes. A replica can move to
    another master (replica migration), so every pair of nodes counts."""
    clocked = _clocked(reading)
    if len(clocked) < 2:
        return []
    ahead, high = max(clocked, key=lambda c: c[1])
    behind, low = min(clocked, key=lambda c: c[1])
    error = ((ahead.rtt_ms or 0.0) + (behind.rtt_ms or 0.0)) / 2
    found = (f"clock skew between nodes {high - low:.1f} ms at most ({ahead.address} ahead of "
             f"{behind.address}, +-{error:.1f} ms)")  # fmt: skip
    pair = [ahead.address, behind.address]
    if high - low <= limits.max_node_skew_ms:
        return [ok("node-clocks", f"{found}, within {limits.max_node_skew_ms:g} ms", pair)]
    return [warn("node-clocks", f"{found}, more than {limits.max_node_skew_ms:g} ms: fences "
                 "are at least the server clock in microseconds, which keeps a promoted replica "
                 "from reissuing its master's fences only while its clock trails its master's "
                 "by less than a failover takes; sync the nodes' clocks (NTP)", pair)]


def _ms(value: float, digits: int) -> str:
    """Signed, without a "-0" for what rounds to zero."""
    return f"{round(value, digits) + 0.0:+.{digits}f}"


def scripts(reading: Reading) -> list[Check]:
    where = " on every master" if reading.cluster else ""
    if reading.scripts_error is None:
        return [ok("scripts", f"scripts loaded{where}")]
    return [warn("scripts", f"scripts not loaded{where}: {reading.scripts_error}")]


def replica_links(info: dict[str, Any]) -> Iterable[ReplicaLink]:
    """The slaveN entries of INFO replication (redis-py parses each into a dict)."""
    for key in sorted(info, key=lambda k: (len(k), k)):
        value = info[key]
        if re.fullmatch(r"slave\d+", key) and isinstance(value, dict):
            yield ReplicaLink(
                address=f"{value.get('ip', '?')}:{value.get('port', '?')}",
                state=str(value.get("state", "?")),
                offset=as_int(value.get("offset")) or 0,
                lag_s=as_int(value.get("lag")) or 0,
            )


def as_int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def as_text(value: Any) -> str | None:
    return None if value is None else str(value)
