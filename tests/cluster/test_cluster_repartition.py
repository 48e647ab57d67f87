"""``jobqueue repartition`` on the real 3-master cluster: runs move between slots on
different masters with single-slot commands only, and keep everything they had."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner
from recorder import record_cluster_commands
from test_repartition import Q, populate, same_ttl, snapshot

from jobqueue.cli import main
from jobqueue.client.sync import JobQueue
from jobqueue.ops import repartition as rp
from jobqueue.store.keys import QUEUES_KEY, queue_partition


def counter_totals(client: Any, partitions: int) -> dict[str, int]:
    out: dict[str, int] = {}
    for p in range(partitions):
        for name, value in client.hgetall(queue_partition(Q, p, partitions, True).stats).items():
            out[name] = out.get(name, 0) + int(value)
    return out


def test_cli_repartition_on_the_cluster_keeps_every_run_with_one_slot_commands(
    cluster_url: str, cluster_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """8 -> 3: runs cross masters, counters of partitions 1-7 are folded (a one-slot MULTI;
    partition 0 keeps its tag, the others are placed anew), and no command names keys of two
    slots."""
    populate(cluster_client, 8)
    before, totals = snapshot(cluster_client, 8), counter_totals(cluster_client, 8)
    log = record_cluster_commands(monkeypatch)
    result = CliRunner().invoke(
        main, ["--redis-url", cluster_url, "repartition", Q, "--partitions", "3", "--yes", "--json"]
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["moved"] > 0 and len(report["stats_folded"]) == 7
    assert not log.split, log.split
    assert {"ZSCAN", "HGETALL", "HSET", "RPUSH", "PEXPIRE", "ZADD", "ZREM", "HINCRBY"} <= (
        log.names()
    )
    after = snapshot(cluster_client, 3)
    assert after.keys() == before.keys()
    for run_id, b in before.items():
        a = after[run_id]
        assert (a["fields"], a["history"], a["score"]) == (b["fields"], b["history"], b["score"])
        assert same_ttl(b["ttl"], a["ttl"]) and same_ttl(b["history_ttl"], a["history_ttl"])
    assert counter_totals(cluster_client, 3) == totals
    jq = JobQueue.from_url(cluster_url, partitions={Q: 3})
    assert all(jq.get_run(run_id).run_id == run_id for run_id in before)
    jq.close()


def test_growing_a_queue_on_the_cluster_spreads_its_runs_over_every_master(
    cluster_url: str, cluster_client: Any
) -> None:
    populate(cluster_client, 1)
    masters_before = {cluster_client.get_node_from_key(queue_partition(Q, 0, 1, True).due).name}
    rp.repartition(JobQueue(cluster_client), Q, 16)
    assert cluster_client.hget(QUEUES_KEY, Q) == "16 spread"
    new = [queue_partition(Q, p, 16, True) for p in range(16)]
    holding = {
        cluster_client.get_node_from_key(k.due).name
        for k in new
        if any(cluster_client.zcard(getattr(k, i)) for i in rp.INDEXES)
    }
    assert len(masters_before) == 1 and len(holding) == 3
