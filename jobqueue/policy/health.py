"""What ``jobqueue check`` verifies: the Redis settings that jobqueue's guarantees rest on
(docs/guarantees.md), on a single server or on every master and replica of a cluster.

Two halves. The checks are pure functions of what was read from the nodes (a ``Reading``) and
return ``Check`` results, one printed line each. The reader (``read``) fills a ``Reading`` from
one server, or from every node that ``CLUSTER NODES`` lists, with INFO, CONFIG GET, TIME and
SCRIPT LOAD.

Nodes that share a verdict share a line ("... on all 6 nodes"); a node that differs gets its
own. A ``warn`` means a setting is not as the guarantees need it, or could not be read.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import redis
import redis.cluster

from jobqueue.client.sync import JobQueue
from jobqueue.errors import OperationRefused

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


# -- the reader ----------------------------------------------------------------------------


def read(jq: JobQueue) -> Reading:
    """Read the server, or every node of a cluster, then load the scripts (as the daemons do
    at start). A lost connection to a single server raises (the CLI's exit 3); on a cluster,
    a node that does not answer is part of the reading."""
    client = jq.redis
    cluster = isinstance(client, redis.cluster.RedisCluster)
    nodes = tuple(read_cluster(client)) if cluster else (read_node(client, _address(client)),)
    scripts_error = None
    try:
        jq.scripts.load()
    except redis.exceptions.ResponseError as exc:
        scripts_error = str(exc)
    except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException) as exc:
        if not cluster:
            raise
        scripts_error = str(exc)
    return Reading(cluster, nodes, scripts_error)


def _address(client: Any) -> str:
    """host:port, or the unix socket's path (the URL's credentials never appear)."""
    kwargs = client.connection_pool.connection_kwargs
    if kwargs.get("path"):
        return str(kwargs["path"])
    return f"{kwargs.get('host', '?')}:{kwargs.get('port', '?')}"


def read_cluster(client: Any) -> list[NodeReading]:
    """Every node CLUSTER NODES lists (redis-py's own list, from CLUSTER SLOTS, leaves out
    replicas still syncing or failing), masters in slot order, each followed by its
    replicas."""
    try:
        rows: dict[str, dict[str, Any]] = client.cluster_nodes()
    except redis.exceptions.ResponseError as exc:
        raise OperationRefused(
            f"check cannot list the cluster's nodes: CLUSTER NODES refused ({exc}); allow "
            "+cluster|nodes for the user check runs as"
        ) from None
    address_of = {row["node_id"]: address for address, row in rows.items()}

    def first_slot(address: str) -> int:
        return min((int(r[0]) for r in rows[address]["slots"]), default=1 << 20)

    masters = [a for a, row in rows.items() if "master" in row["flags"].split(",")]
    ordered = []
    for master in sorted(masters, key=lambda a: (first_slot(a), a)):
        ordered.append(master)
        ordered += sorted(a for a, row in rows.items()
                          if a not in masters and address_of.get(row["master_id"]) == master)
    ordered += sorted(a for a in rows if a not in ordered)
    return [_read_cluster_node(client, a, rows[a], address_of) for a in ordered]


def _read_cluster_node(
    client: Any, address: str, row: dict[str, Any], address_of: dict[str, str]
) -> NodeReading:
    flags = row["flags"].split(",")
    is_master = "master" in flags
    topology: dict[str, Any] = {
        "role": "master" if is_master else "replica",
        "master": None if is_master else address_of.get(row["master_id"], row["master_id"]),
        "slots": sum(int(r[-1]) - int(r[0]) + 1 for r in row["slots"]) if is_master else 0,
        "flags": tuple(f for f in flags if f not in ("myself", "master", "slave")),
    }
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or int(port) == 0:
        return NodeReading(address, error="the cluster knows no address for it", **topology)
    node = client.get_node(host=host, port=int(port))
    owned = node is None  # unknown to redis-py: a connection of our own, closed below
    if node is None:
        node = redis.cluster.ClusterNode(host, int(port))
    try:
        conn = client.get_redis_connection(node)
        try:
            return read_node(conn, address, cluster=True, **topology)
        finally:
            if owned:
                conn.close()
    except (redis.exceptions.RedisError, OSError) as exc:
        return NodeReading(address, error=str(exc) or type(exc).__name__, **topology)


def read_node(conn: Any, address: str, *, cluster: bool = False, **topology: Any) -> NodeReading:
    """INFO, CONFIG GET and TIME of one node. A refused command (an ACL without +info or
    +config|get) leaves its fields unknown and says why; a lost connection raises.
    ``topology``: role, master, slots and flags as CLUSTER NODES tells them."""
    refused: list[str] = []

    def ask(what: str, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except redis.exceptions.ResponseError as exc:
            refused.append(f"{what}: {exc}")
            return None

    def config(name: str) -> str | None:
        found = ask(f"CONFIG GET {name}", lambda: conn.config_get(name)) or {}
        return None if name not in found else str(found[name])

    info: dict[str, Any] = ask("INFO", conn.info) or {}
    policy, fsync, save = config("maxmemory-policy"), config("appendfsync"), config("save")
    timeout = config("cluster-node-timeout") if cluster else None
    clock_s, offset_ms, rtt_ms = ask("TIME", lambda: _clock(conn)) or (None, None, None)
    if info.get("role", "master") == "master":
        topology = {"role": "master", **topology}
    else:
        master = f"{info.get('master_host', '?')}:{info.get('master_port', '?')}"
        topology = {"role": "replica", "master": master, **topology}
    aof, link = info.get("aof_enabled"), info.get("master_link_status")
    return NodeReading(
        address,
        server="valkey" if info.get("server_name") == "valkey" else "redis",
        version=_text(info.get("valkey_version") or info.get("redis_version")),
        cluster_enabled=str(info.get("cluster_enabled")) == "1",
        maxmemory_policy=policy,
        appendonly=None if aof is None else str(aof) == "1",
        appendfsync=fsync,
        save=save,
        last_save_s=_int(info.get("rdb_last_save_time")),
        node_timeout_ms=_int(timeout),
        repl_offset=_int(info.get("master_repl_offset")),
        replicas=tuple(replica_links(info)),
        master_link_up=None if link is None else link == "up",
        link_down_s=_int(info.get("master_link_down_since_seconds")),
        clock_s=clock_s,
        clock_offset_ms=offset_ms,
        rtt_ms=rtt_ms,
        refused=tuple(refused),
        **topology,
    )


def replica_links(info: dict[str, Any]) -> Iterable[ReplicaLink]:
    """The slaveN entries of INFO replication (redis-py parses each into a dict)."""
    for key in sorted(info, key=lambda k: (len(k), k)):
        value = info[key]
        if re.fullmatch(r"slave\d+", key) and isinstance(value, dict):
            yield ReplicaLink(
                address=f"{value.get('ip', '?')}:{value.get('port', '?')}",
                state=str(value.get("state", "?")),
                offset=_int(value.get("offset")) or 0,
                lag_s=_int(value.get("lag")) or 0,
            )


def _clock(conn: Any) -> tuple[float, float, float]:
    """The node's clock (s), its offset from the host's (ms) and the round trip (ms), from
    the fastest of a few TIME calls: the node read its clock somewhere within the round trip,
    so the offset is measured to +- half of it. The host's clock is read for this comparison
    only; nothing jobqueue decides uses it."""
    samples = []
    for _ in range(TIME_SAMPLES):
        host_s = time.time()
        start = time.perf_counter()
        seconds, micros = conn.time()
        rtt_s = time.perf_counter() - start
        node_s = int(seconds) + int(micros) / 1e6
        samples.append((node_s, (node_s - (host_s + rtt_s / 2)) * 1000, rtt_s * 1000))
    return min(samples, key=lambda s: s[2])


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def run(jq: JobQueue, limits: Limits, create_rate: float | None = None) -> list[Check]:
    """Every check; then, where recurring jobs or schedulers exist, the schedulers' (every
    partition owned, the largest herd creatable in time: ``jobqueue.scheduler.checks``)."""
    from jobqueue.scheduler.checks import checks as scheduler_checks

    return evaluate(read(jq), limits) + scheduler_checks(jq, create_rate)
