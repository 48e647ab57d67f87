"""The ops CLI pointed at the cluster with --redis-url redis+cluster://...: every read command
answers from all partitions on all masters."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner

from jobqueue import JobQueue, Request
from jobqueue.cli import main
from jobqueue.client.relay import tidy_flows_steps
from jobqueue.store.runs import CLAIM, FAIL

LEASE_MS = 60_000
RETENTION_MS = 3_600_000


@pytest.fixture
def populated(cluster_url: str) -> dict[str, Any]:
    """60 runs over 16 partitions: one running per partition, one dead, the rest pending."""
    jq = JobQueue.from_url(cluster_url, partitions={"default": 16})
    jq.declare_task("t")
    jq.enqueue_many(Request("t", (i,), run_id=f"r-{i}") for i in range(60))
    running = []
    for keys in jq.all_partition_keys("default"):
        claimed = CLAIM.parse(
            jq.scripts.run(CLAIM.call(keys, 1, "w-1", LEASE_MS, RETENTION_MS))
        ).runs
        running += [(keys, c) for c in claimed]
    keys, dead = running.pop()
    jq.scripts.run(FAIL.call(keys, dead.run_id, dead.fence, "boom", None, RETENTION_MS))
    jq.close()
    return {"url": cluster_url, "running": sorted(c.run_id for _, c in running),
            "dead": dead.run_id}


def cli_json(url: str, *args: str) -> Any:
    result = CliRunner().invoke(main, ["--redis-url", url, *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_cli_leases_lists_the_leases_of_every_master(populated: dict[str, Any]) -> None:
    leases = cli_json(populated["url"], "leases")
    assert sorted(row["run_id"] for row in leases) == populated["running"]
    assert len({row["partition"] for row in leases}) == len(populated["running"])


def test_cli_runs_by_state_across_partitions(populated: dict[str, Any]) -> None:
    url = populated["url"]
    assert len(cli_json(url, "runs", "--state", "pending", "--limit", "100")) == 60 - 16
    running = cli_json(url, "runs", "--state", "running")
    assert sorted(r["run_id"] for r in running) == populated["running"]


def test_cli_queues_counts_every_partition(populated: dict[str, Any]) -> None:
    rows = cli_json(populated["url"], "queues")
    assert sorted(r["partition"] for r in rows) == list(range(16))
    assert sum(r["due_now"] for r in rows) == 60 - 16
    assert sum(r["running"] for r in rows) == 15
    assert sum(r["dead"] for r in rows) == 1
    stats = cli_json(populated["url"], "stats")  # the same command by another name
    assert [(r["partition"], r["due_now"]) for r in stats] == [
        (r["partition"], r["due_now"]) for r in rows]


def test_cli_show_finds_a_run_without_being_told_its_queue(populated: dict[str, Any]) -> None:
    shown = cli_json(populated["url"], "show", populated["dead"])
    assert shown["run_id"] == populated["dead"] and shown["state"] == "dead"


def test_cli_dead_list_reads_the_dead_index(populated: dict[str, Any]) -> None:
    dead = cli_json(populated["url"], "dead", "list")
    assert [row["run_id"] for row in dead] == [populated["dead"]]


def test_cli_queues_shows_each_masters_share_of_an_evenly_placed_queue(cluster_url: str) -> None:
    """A new queue of 12 partitions on 3 masters: 4 on each (its tags are spread; the plain
    tags {reports#p} would land 7/3/2), shown per master under the partition table; --json
    rows name the slot and master of each."""
    jq = JobQueue.from_url(cluster_url, partitions={"reports": 12})
    jq.declare_task("t", queue="reports")
    jq.enqueue_many(Request("t", (i,), run_id=f"e-{i}") for i in range(120))
    jq.close()
    rows = cli_json(cluster_url, "queues", "--queue", "reports")
    per_master: dict[str, int] = {}
    for row in rows:
        per_master[row["node"]] = per_master.get(row["node"], 0) + 1
    assert sorted(per_master.values()) == [4, 4, 4]
    result = CliRunner().invoke(main, ["--redis-url", cluster_url, "queues", "--queue", "reports"])
    assert result.exit_code == 0, result.output
    table = result.stdout.split("\n\n")[-1].splitlines()
    assert table[0].split() == ["MASTER", "PARTITIONS", "DUE", "NOW", "LATER", "RUNNING", "SHARE"]
    assert sorted(line.split()[1] for line in table[1:]) == ["4", "4", "4"]
    assert all(line.split()[-1] == "1.00" for line in table[1:])


def test_cli_flows_counts_a_flow_over_every_master_and_the_tidy_forgets_it_expired(
    cluster_url: str,
) -> None:
    jq = JobQueue.from_url(cluster_url, partitions={"default": 16})
    t = jq.declare_task("t")
    flow = jq.chord([t.s(i) for i in range(40)], t.s(), flow_id="spread")
    (row,) = cli_json(cluster_url, "flows")
    assert (row["flow_id"], row["progress"], row["runs"]) == ("spread", "0/41", 41)
    detail = cli_json(cluster_url, "flows", "spread")
    assert len(detail["edges"]) == 40
    for run in flow.runs:  # every record expired
        jq.redis.delete(jq.keys_for("default", run.run_id).run(run.run_id))
    assert cli_json(cluster_url, "flows")[0]["states"]["expired"] == 41
    jq.run_steps(tidy_flows_steps(jq, jq.all_partition_keys("default")))
    assert cli_json(cluster_url, "flows") == []
    jq.close()
