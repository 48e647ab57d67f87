"""``jobqueue check``'s reader: fills a ``Reading`` from one server, or from every node that
``CLUSTER NODES`` lists, with INFO, CONFIG GET, TIME and SCRIPT LOAD; the checks themselves are
pure (``jobqueue.policy.health``). Sync only, not steps: it reaches nodes no key routes to
(replicas, nodes redis-py does not know, on connections of its own) and times TIME by the
host's clock."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import redis
import redis.cluster

from jobqueue.client.sync import JobQueue
from jobqueue.errors import OperationRefused
from jobqueue.policy.health import (
    TIME_SAMPLES,
    Check,
    Limits,
    NodeReading,
    Reading,
    as_int,
    as_text,
    evaluate,
    replica_links,
)


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
        version=as_text(info.get("valkey_version") or info.get("redis_version")),
        cluster_enabled=str(info.get("cluster_enabled")) == "1",
        maxmemory_policy=policy,
        appendonly=None if aof is None else str(aof) == "1",
        appendfsync=fsync,
        save=save,
        last_save_s=as_int(info.get("rdb_last_save_time")),
        node_timeout_ms=as_int(timeout),
        repl_offset=as_int(info.get("master_repl_offset")),
        replicas=tuple(replica_links(info)),
        master_link_up=None if link is None else link == "up",
        link_down_s=as_int(info.get("master_link_down_since_seconds")),
        clock_s=clock_s,
        clock_offset_ms=offset_ms,
        rtt_ms=rtt_ms,
        refused=tuple(refused),
        **topology,
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


def run(jq: JobQueue, limits: Limits) -> list[Check]:
    return evaluate(read(jq), limits)
