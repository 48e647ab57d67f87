"""``jobqueue check`` on the session cluster (3 masters with a replica each, AOF everysec,
cluster-node-timeout 1000 ms): every master and replica is listed and checked, each master's
replica and its lag are shown, the node timeout is compared with the lease, and the clocks of
all nodes with each other."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner
from cluster_launcher import Cluster
from helpers import wait_for

from jobqueue.cli import main


def wait_replicas_online(cluster: Cluster, timeout: float = 30.0) -> None:
    """Every master lists a replica in state online. A replica that just (re)joined is listed
    first as wait_bgsave or send_bulk, and check rightly warns that it cannot take over yet."""
    deadline = time.monotonic() + timeout
    for node in cluster.master_nodes():
        with node.client() as c:
            wait_for(
                lambda c=c: (c.info("replication").get("slave0") or {}).get("state") == "online",
                deadline - time.monotonic(), f"the replica of {node.address} in sync", 0.1,
            )


@pytest.fixture
def url(cluster: Cluster, cluster_url: str) -> str:
    wait_replicas_online(cluster)
    return cluster_url


def check(url: str, *args: str) -> tuple[int, list[dict[str, Any]]]:
    result = CliRunner().invoke(main, ["--redis-url", url, "check", "--json", *args])
    assert result.stderr == "", result.stderr
    return result.exit_code, json.loads(result.stdout)


def named(checks: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [c for c in checks if c["name"] == name]


def test_every_line_is_ok_on_the_healthy_cluster_and_check_exits_0(url: str) -> None:
    result = CliRunner().invoke(main, ["--redis-url", url, "check"])
    assert result.exit_code == 0, result.stdout
    assert all(line.startswith("ok    ") for line in result.stdout.splitlines()), result.stdout
    assert "ok    connected; cluster of 3 master(s) and 3 replica(s)" in result.stdout


def test_every_master_and_replica_is_listed(url: str, cluster: Cluster) -> None:
    _, checks = check(url)
    listed = {c["nodes"][0]: c["detail"] for c in named(checks, "node")}
    topology = cluster.topology()
    assert len(topology) == 6
    assert set(listed) == {f"127.0.0.1:{row['port']}" for row in topology}
    port_of = {row["id"]: row["port"] for row in topology}
    for row in topology:
        address = f"127.0.0.1:{row['port']}"
        if row["role"] == "master":
            assert listed[address].startswith(f"node {address} (master, 546"), listed[address]
        else:
            master = f"127.0.0.1:{port_of[row['master_id']]}"
            assert listed[address].startswith(f"node {address} (replica of {master})")


def test_settings_are_read_on_all_six_nodes(url: str) -> None:
    _, checks = check(url)
    for name in ("version", "maxmemory-policy", "persistence", "cluster-node-timeout"):
        (line,) = named(checks, name)
        assert line["status"] == "ok" and " on all 6 nodes" in line["detail"], line
        assert len(line["nodes"]) == 6
    (aof,) = named(checks, "persistence")
    assert aof["detail"].startswith("persistence: appendonly yes, appendfsync everysec on all 6")


def test_each_master_shows_its_replica_and_the_lag(url: str, cluster: Cluster) -> None:
    _, checks = check(url)
    lines = named(checks, "replication")
    topology = cluster.topology()
    masters = [row for row in topology if row["role"] == "master" and row["slots"]]
    assert len(lines) == len(masters) == 3
    for row in masters:
        (replica,) = [r for r in topology if r["master_id"] == row["id"]]
        (line,) = [c for c in lines if c["nodes"][0] == f"127.0.0.1:{row['port']}"]
        assert line["status"] == "ok"
        assert line["detail"].startswith(f"replicas of 127.0.0.1:{row['port']}: "
                                         f"127.0.0.1:{replica['port']} (online, lag ")


def test_the_node_timeout_is_compared_with_the_default_lease(url: str) -> None:
    _, checks = check(url)
    (line,) = named(checks, "cluster-node-timeout")
    assert line["detail"] == (
        "cluster-node-timeout 1000 ms on all 6 nodes: a failover is budgeted at 2 s (2 x node "
        "timeout: detection, then election), less than the 30 s lease")  # fmt: skip


def test_a_lease_no_longer_than_a_failover_warns_and_exits_1(url: str) -> None:
    code, checks = check(url, "--lease", "2")
    assert code == 1
    (line,) = named(checks, "cluster-node-timeout")
    assert line["status"] == "warn"
    assert "not less than the 2 s lease" in line["detail"]
    assert "set cluster-node-timeout below 1000 ms (lease / 2)" in line["detail"]


def test_the_clocks_of_all_nodes_are_compared_with_each_other(url: str) -> None:
    _, checks = check(url)
    (between,) = named(checks, "node-clocks")
    assert between["status"] == "ok" and "within 100 ms" in between["detail"]
    (host,) = named(checks, "host-clock")
    assert host["detail"].startswith("clock skew host vs nodes ")


def test_one_master_with_an_evicting_policy_is_named_and_check_exits_1(
    url: str, cluster: Cluster
) -> None:
    victim = cluster.master_nodes()[0]
    with victim.client() as c:
        c.config_set("maxmemory-policy", "allkeys-lru")
        try:
            code, checks = check(url)
        finally:
            c.config_set("maxmemory-policy", "noeviction")
    assert code == 1
    (bad,) = [c for c in named(checks, "maxmemory-policy") if c["status"] == "warn"]
    assert bad["nodes"] == [victim.address]
    assert bad["detail"].startswith(f"maxmemory-policy allkeys-lru on {victim.address}: ")


@pytest.fixture
def stopped_replica(url: str, cluster: Cluster) -> Iterator[tuple[str, str]]:
    """A replica killed, then started again (it rejoins from its nodes.conf and AOF)."""
    topology = cluster.topology()
    port_of = {row["id"]: row["port"] for row in topology}
    row = next(r for r in topology if r["role"] == "replica")
    replica = cluster.node(row["port"])
    replica.kill()
    try:
        yield replica.address, f"127.0.0.1:{port_of[row['master_id']]}"
    finally:
        replica.start()
        cluster.wait_healthy(timeout=30)
        wait_replicas_online(cluster)


def test_a_stopped_replica_is_reported_and_its_master_cannot_fail_over(
    stopped_replica: tuple[str, str], url: str
) -> None:
    replica, master = stopped_replica
    code, checks = check(url)
    assert code == 1
    (down,) = [c for c in named(checks, "node") if c["status"] == "warn"]
    assert down["nodes"] == [replica] and "unreachable" in down["detail"]
    (orphan,) = [c for c in named(checks, "replication") if c["status"] == "warn"]
    assert orphan["nodes"][0] == master
    assert "no connected replica: this master cannot fail over" in orphan["detail"]
