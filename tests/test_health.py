"""The rules of ``jobqueue check``, as pure functions of what was read from each node: for each
rule, a reading it passes and one it warns about (jobqueue/policy/health.py)."""

from __future__ import annotations

from dataclasses import replace

from jobqueue.policy import health
from jobqueue.policy.health import Check, Limits, NodeReading, Reading, ReplicaLink

LIMITS = Limits(lease_s=30.0)

# A node as the guarantees need it; each test changes what it is about.
GOOD = NodeReading(
    "10.0.0.1:7000", role="master", slots=5461, server="redis", version="7.0.15",
    cluster_enabled=True, maxmemory_policy="noeviction", appendonly=True,
    appendfsync="everysec", save="", node_timeout_ms=1000, repl_offset=1000,
    clock_s=1_800_000_000.0, clock_offset_ms=0.2, rtt_ms=0.1,
)  # fmt: skip


def replica_of(master: NodeReading, address: str, **changes: object) -> NodeReading:
    fields: dict[str, object] = {"master_link_up": True, **changes}
    return replace(master, address=address, role="replica", master=master.address, slots=0,
                   replicas=(), **fields)  # fmt: skip


def linked(master: NodeReading, *links: ReplicaLink) -> NodeReading:
    return replace(master, replicas=links)


def online(address: str, *, offset: int = 1000, lag_s: int = 0) -> ReplicaLink:
    return ReplicaLink(address, "online", offset, lag_s)


def single(node: NodeReading = GOOD) -> Reading:
    return Reading(cluster=False, nodes=(replace(node, cluster_enabled=False, slots=0),))


def cluster(*nodes: NodeReading) -> Reading:
    return Reading(cluster=True, nodes=nodes)


def healthy_cluster() -> Reading:
    """Three masters, each with one replica in sync."""
    out: list[NodeReading] = []
    for i in range(3):
        master = replace(GOOD, address=f"10.0.0.{i + 1}:7000")
        out.append(linked(master, online(f"10.0.1.{i + 1}:7000")))
        out.append(replica_of(master, f"10.0.1.{i + 1}:7000"))
    return cluster(*out)


def only(checks: list[Check]) -> Check:
    assert len(checks) == 1, checks
    return checks[0]


def warnings(checks: list[Check]) -> list[Check]:
    return [c for c in checks if not c.ok]


# -- the whole -----------------------------------------------------------------------------


def test_a_healthy_cluster_passes_every_check() -> None:
    checks = health.evaluate(healthy_cluster(), LIMITS)
    assert warnings(checks) == []
    assert {c.name for c in checks} == {
        "connection", "node", "version", "maxmemory-policy", "persistence", "replication",
        "cluster-node-timeout", "host-clock", "node-clocks", "scripts"}  # fmt: skip


def test_a_single_server_gets_no_cluster_lines() -> None:
    names = {c.name for c in health.evaluate(single(), LIMITS)}
    assert not names & {"node", "cluster-node-timeout", "node-clocks"}


def test_nodes_that_agree_share_one_line_on_all_nodes() -> None:
    line = only(health.eviction(healthy_cluster()))
    assert line.detail == "maxmemory-policy noeviction on all 6 nodes"
    assert len(line.nodes) == 6


def test_a_node_that_differs_gets_its_own_line_naming_it() -> None:
    nodes = list(healthy_cluster().nodes)
    nodes[2] = replace(nodes[2], maxmemory_policy="allkeys-lru")
    (bad,) = warnings(health.eviction(cluster(*nodes)))
    assert bad.nodes == ("10.0.0.2:7000",)
    assert bad.detail.startswith("maxmemory-policy allkeys-lru on 10.0.0.2:7000: ")


def test_a_check_line_and_its_json_object() -> None:
    line = health.warn("persistence", "persistence: ...", ["10.0.0.1:7000"])
    assert line.line() == "WARN  persistence: ..."
    assert health.ok("scripts", "scripts loaded").line() == "ok    scripts loaded"
    assert line.to_dict() == {"name": "persistence", "status": "warn",
                              "detail": "persistence: ...", "nodes": ["10.0.0.1:7000"]}


# -- connection and nodes ------------------------------------------------------------------


def test_connection_lists_every_master_and_replica() -> None:
    checks = health.connection(healthy_cluster())
    assert checks[0].detail == "connected; cluster of 3 master(s) and 3 replica(s)"
    assert [c.detail for c in checks[1:3]] == [
        "node 10.0.0.1:7000 (master, 5461 slots), redis 7.0.15",
        "node 10.0.1.1:7000 (replica of 10.0.0.1:7000), redis 7.0.15"]  # fmt: skip
    assert warnings(checks) == []


def test_an_unreachable_node_warns() -> None:
    nodes = list(healthy_cluster().nodes)
    nodes[1] = NodeReading("10.0.1.1:7000", role="replica", master="10.0.0.1:7000",
                           flags=("fail",), error="Connection refused")  # fmt: skip
    (bad,) = warnings(health.connection(cluster(*nodes)))
    assert bad.detail == ("node 10.0.1.1:7000 (replica of 10.0.0.1:7000), flagged fail by the "
                          "cluster, unreachable (Connection refused)")  # fmt: skip
    # The other checks say how many nodes they cover.
    assert only(health.eviction(cluster(*nodes))).detail.endswith("on all 5 nodes that answered")


def test_a_node_the_cluster_flags_failing_warns_even_if_it_answers() -> None:
    nodes = list(healthy_cluster().nodes)
    nodes[1] = replace(nodes[1], flags=("fail?",))
    (bad,) = warnings(health.connection(cluster(*nodes)))
    assert "flagged fail? by the cluster" in bad.detail


def test_a_cluster_node_behind_a_plain_url_warns() -> None:
    reading = Reading(cluster=False, nodes=(GOOD,))
    assert "use a redis+cluster:// URL" in only(warnings(health.connection(reading))).detail


# -- version -------------------------------------------------------------------------------


def test_redis_7_0_passes() -> None:
    assert only(health.version(single())).ok


def test_redis_6_2_warns_that_it_runs_the_scripts_without_their_flags() -> None:
    line = only(health.version(single(replace(GOOD, version="6.2.14"))))
    assert not line.ok
    assert "cannot parse the '#!lua' first line" in line.detail


def test_valkey_is_judged_by_its_own_version() -> None:
    # Valkey reports redis_version 7.2.4 and its own valkey_version; the reader keeps the latter.
    assert only(health.version(single(replace(GOOD, server="valkey", version="8.0.1")))).ok
    assert not only(health.version(single(replace(GOOD, server="valkey", version="7.0.0")))).ok


def test_an_unreadable_version_warns() -> None:
    node = replace(GOOD, version=None, refused=("INFO: NOPERM no permission",))
    line = only(health.version(single(node)))
    assert not line.ok and "NOPERM" in line.detail


# -- maxmemory-policy ----------------------------------------------------------------------


def test_noeviction_passes() -> None:
    assert only(health.eviction(single())).detail == "maxmemory-policy noeviction"


def test_any_eviction_policy_warns() -> None:
    line = only(health.eviction(single(replace(GOOD, maxmemory_policy="volatile-lru"))))
    assert not line.ok
    assert line.detail.startswith("maxmemory-policy volatile-lru: runs can be evicted")


def test_a_policy_the_acl_does_not_let_us_read_warns_and_says_why() -> None:
    refused = "CONFIG GET maxmemory-policy: NOPERM User jq has no permissions"
    line = only(health.eviction(single(replace(GOOD, maxmemory_policy=None, refused=(refused,)))))
    assert not line.ok
    assert line.detail == f"maxmemory-policy unknown: not read ({refused})"


# -- persistence ---------------------------------------------------------------------------


def test_aof_everysec_passes_and_says_a_crash_can_lose_about_a_second() -> None:
    line = only(health.persistence(single()))
    assert line.ok
    assert "can lose about the last second of acknowledged writes" in line.detail


def test_aof_always_passes() -> None:
    line = only(health.persistence(single(replace(GOOD, appendfsync="always"))))
    assert line.ok and "appendfsync always" in line.detail


def test_aof_with_appendfsync_no_warns() -> None:
    line = only(health.persistence(single(replace(GOOD, appendfsync="no"))))
    assert not line.ok
    assert "set appendfsync everysec" in line.detail


def test_rdb_only_warns_that_a_crash_loses_everything_since_the_last_snapshot() -> None:
    node = replace(GOOD, appendonly=False, save="3600 1 300 100",
                   last_save_s=1_800_000_000 - 120)  # fmt: skip
    line = only(health.persistence(single(node)))
    assert not line.ok
    assert line.detail == (
        "persistence: appendonly no, RDB snapshots only (save '3600 1 300 100'): a crash loses "
        "every write since the last snapshot (the last, 120 s ago); set appendonly yes "
        "(appendfsync everysec or always)")  # fmt: skip


def test_aof_off_with_snapshots_not_readable_warns_without_claiming_there_are_none() -> None:
    refused = "CONFIG GET save: NOPERM no permission"
    node = replace(GOOD, appendonly=False, save=None, refused=(refused,))
    line = only(health.persistence(single(node)))
    assert not line.ok
    assert line.detail.startswith("persistence: appendonly no: a crash loses every write since "
                                  "the last RDB snapshot, if any")  # fmt: skip
    assert refused in line.detail


def test_no_persistence_at_all_warns() -> None:
    line = only(health.persistence(single(replace(GOOD, appendonly=False, save=""))))
    assert not line.ok
    assert line.detail.startswith("persistence: appendonly no and no RDB snapshots: a restart")


# -- replicas ------------------------------------------------------------------------------


def test_a_master_with_a_replica_in_sync_passes_and_shows_its_lag() -> None:
    master = linked(GOOD, online("10.0.1.1:7000", offset=900))
    line = only(health.replication(cluster(master, replica_of(master, "10.0.1.1:7000")), LIMITS))
    assert line.ok
    assert line.detail == (
        "replicas of 10.0.0.1:7000: 10.0.1.1:7000 (online, lag 0 s, 100 bytes behind)")
    assert line.nodes == ("10.0.0.1:7000", "10.0.1.1:7000")


def test_a_cluster_master_without_a_connected_replica_warns_that_it_cannot_fail_over() -> None:
    line = only(health.replication(cluster(GOOD), LIMITS))
    assert not line.ok
    assert "no connected replica: this master cannot fail over" in line.detail


def test_a_replica_still_syncing_does_not_count_as_connected() -> None:
    master = linked(GOOD, ReplicaLink("10.0.1.1:7000", "wait_bgsave", 0, 0))
    line = only(health.replication(cluster(master), LIMITS))
    assert not line.ok
    assert "10.0.1.1:7000 is not in sync yet (wait_bgsave)" in line.detail
    assert "no connected replica" in line.detail


def test_a_replica_lagging_more_than_the_limit_warns() -> None:
    master = linked(GOOD, online("10.0.1.1:7000", lag_s=11))
    line = only(health.replication(cluster(master), LIMITS))
    assert not line.ok
    assert "10.0.1.1:7000 last acknowledged 11 s ago, more than 10 s" in line.detail


def test_a_replica_lagging_up_to_the_limit_passes() -> None:
    master = linked(GOOD, online("10.0.1.1:7000", lag_s=10))
    assert only(health.replication(cluster(master), LIMITS)).ok


def test_a_master_without_slots_needs_no_replica() -> None:
    line = only(health.replication(cluster(replace(GOOD, slots=0)), LIMITS))
    assert line.ok and line.detail.endswith("none (a master without slots)")


def test_a_replica_no_master_lists_warns_when_its_link_is_down() -> None:
    master = linked(GOOD, online("10.0.1.1:7000"))
    lost = replica_of(GOOD, "10.0.1.2:7000", master_link_up=False, link_down_s=42)
    checks = health.replication(cluster(master, lost), LIMITS)
    (bad,) = warnings(checks)
    assert bad.detail == ("replica 10.0.1.2:7000: its link to its master 10.0.0.1:7000 is down "
                          "for 42 s, so it receives no writes")  # fmt: skip


def test_a_single_server_needs_no_replica() -> None:
    line = only(health.replication(single(), LIMITS))
    assert line.ok and line.detail == "replicas: none (not required of a single server)"


def test_a_single_server_that_is_a_replica_warns_that_it_refuses_writes() -> None:
    node = replace(GOOD, role="replica", master="10.0.0.9:6379")
    line = only(health.replication(single(node), LIMITS))
    assert not line.ok
    assert line.detail.startswith("this server is a replica of 10.0.0.9:6379: it refuses writes")


# -- cluster-node-timeout against the lease ------------------------------------------------


def test_a_node_timeout_well_below_the_lease_passes() -> None:
    line = only(health.node_timeout(healthy_cluster(), LIMITS))
    assert line.ok
    assert line.detail == (
        "cluster-node-timeout 1000 ms on all 6 nodes: a failover is budgeted at 2 s (2 x node "
        "timeout: detection, then election), less than the 30 s lease")  # fmt: skip


def test_the_default_node_timeout_warns_against_the_default_lease_and_says_what_to_do() -> None:
    nodes = [replace(n, node_timeout_ms=15000) for n in healthy_cluster().nodes]
    line = only(health.node_timeout(cluster(*nodes), LIMITS))
    assert not line.ok
    assert "a failover is budgeted at 30 s (2 x node timeout" in line.detail
    assert "not less than the 30 s lease" in line.detail
    assert ("set cluster-node-timeout below 15000 ms (lease / 2), or give workers a --lease "
            "above 30 s") in line.detail  # fmt: skip


def test_the_node_timeout_is_compared_with_the_lease_given() -> None:
    assert not only(health.node_timeout(healthy_cluster(), Limits(lease_s=2.0))).ok
    assert only(health.node_timeout(healthy_cluster(), Limits(lease_s=2.1))).ok


# -- clocks --------------------------------------------------------------------------------


def test_a_host_clock_within_a_second_of_the_server_passes() -> None:
    line = only(health.host_clock(single(replace(GOOD, clock_offset_ms=-999.0)), LIMITS))
    assert line.ok
    assert line.detail == "clock skew host vs server -999 ms (decisions use the server's)"


def test_a_host_clock_a_second_or_more_off_warns() -> None:
    line = only(health.host_clock(single(replace(GOOD, clock_offset_ms=1500.0)), LIMITS))
    assert not line.ok and "sync the host's clock" in line.detail


def test_node_clocks_within_100_ms_of_each_other_pass() -> None:
    nodes = list(healthy_cluster().nodes)
    nodes[3] = replace(nodes[3], clock_offset_ms=90.0)
    line = only(health.node_clocks(cluster(*nodes), LIMITS))
    assert line.ok
    assert line.detail.startswith("clock skew between nodes 89.8 ms at most (10.0.1.2:7000 ahead")


def test_node_clocks_more_than_100_ms_apart_warn_and_name_the_pair() -> None:
    nodes = list(healthy_cluster().nodes)
    nodes[3] = replace(nodes[3], clock_offset_ms=-150.0)
    line = only(health.node_clocks(cluster(*nodes), LIMITS))
    assert not line.ok
    assert line.nodes == ("10.0.0.1:7000", "10.0.1.2:7000")
    assert "clock skew between nodes 150.2 ms at most (10.0.0.1:7000 ahead of 10.0.1.2:7000" in (
        line.detail)
    assert "fences are at least the server clock in microseconds" in line.detail


def test_one_node_has_no_clock_to_compare_with() -> None:
    assert health.node_clocks(single(), LIMITS) == []


# -- scripts -------------------------------------------------------------------------------


def test_scripts_that_loaded_pass() -> None:
    assert only(health.scripts(single())).detail == "scripts loaded"


def test_scripts_that_did_not_load_warn() -> None:
    reading = replace(single(), scripts_error="NOPERM this user has no permissions")
    assert only(health.scripts(reading)).line() == (
        "WARN  scripts not loaded: NOPERM this user has no permissions")


# -- the reader's parsing ------------------------------------------------------------------


def test_replica_links_are_read_from_the_slave_entries_of_info_replication() -> None:
    info = {"role": "master", "connected_slaves": 2, "master_repl_offset": 500,
            "slave1": {"ip": "10.0.1.2", "port": 7000, "state": "online", "offset": 500, "lag": 1},
            "slave0": {"ip": "10.0.1.1", "port": 7000, "state": "send_bulk", "offset": 0,
                       "lag": 0}}  # fmt: skip
    assert list(health.replica_links(info)) == [
        ReplicaLink("10.0.1.1:7000", "send_bulk", 0, 0),
        ReplicaLink("10.0.1.2:7000", "online", 500, 1)]  # fmt: skip
