"""``jobqueue repartition``: changing a queue's partition count moves every run (record,
history, index entry with its score, TTLs) to its new partition, refuses while anything runs,
and finishes an interrupted move when run again. Both backends."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from click.testing import CliRunner
from helpers import claim, make_worker, running, wait_for

from jobqueue import Dedupe
from jobqueue.cli import State, main
from jobqueue.client.sync import JobQueue
from jobqueue.errors import ConfigError, OperationRefused
from jobqueue.ops import queries
from jobqueue.ops import repartition as rp
from jobqueue.store.keys import (
    QUEUES_KEY,
    WORKERS_KEY,
    PartitionKeys,
    partition_of,
    queue_partition,
    queue_partitions,
)
from jobqueue.store.runs import CLAIM, COMPLETE, FAIL
from jobqueue.store.scripts import ScriptRunner

# What this module checks does not depend on the backend: run on the real server only
# (real_only, tests/conftest.py); the scripts and the client API are tested on fakeredis too.
pytestmark = pytest.mark.real_only

Q = "mail"
LEASE_MS = 60_000
RETENTION_MS = 3_600_000
INDEXES = ("due", "leases", "dead", "done")


def part(p: int, partitions: int) -> PartitionKeys:
    """Partition p of Q with ``partitions`` partitions, as a new queue (or a repartition)
    places it: spread (see jobqueue.store.keys)."""
    return queue_partition(Q, p, partitions, True)


def populate(client: Any, partitions: int) -> JobQueue:
    """Runs of every state in queue Q with ``partitions`` partitions: pending later, pending
    now, dead, done and cancelled (the last two with their retention TTL), and runs of a
    scheduled job (``job@fire``)."""
    jq = JobQueue(client, partitions={Q: partitions})
    jq.declare_task("t", queue=Q, max_attempts=1)
    for i in range(6):
        jq.enqueue(jq.resolve_task("t").with_options(run_id=f"dead-{i}"), i)
        jq.enqueue(jq.resolve_task("t").with_options(run_id=f"done-{i}"), i)
    for keys in jq.all_partition_keys(Q):
        claimed = CLAIM.parse(
            jq.scripts.run(CLAIM.call(keys, 100, "w-1", LEASE_MS, RETENTION_MS))
        ).runs
        for c in claimed:
            if c.run_id.startswith("dead-"):
                jq.scripts.run(FAIL.call(keys, c.run_id, c.fence, "boom", None, RETENTION_MS))
            else:
                jq.scripts.run(COMPLETE.call(keys, [(c.run_id, c.fence, "1")], RETENTION_MS))
    for i in range(8):
        jq.enqueue(jq.resolve_task("t").with_options(run_id=f"later-{i}", delay=3600), i)
        jq.enqueue(jq.resolve_task("t").with_options(run_id=f"now-{i}"), i)
        nightly = f"nightly@2026-01-0{i + 1}T00:00Z"
        jq.enqueue(jq.resolve_task("t").with_options(run_id=nightly, delay=7200), i)
    for i in range(4):
        jq.enqueue(jq.resolve_task("t").with_options(run_id=f"cancelled-{i}", delay=3600), i)
        jq.cancel(f"cancelled-{i}", queue=Q)
    return jq


def snapshot(client: Any, partitions: int) -> dict[str, dict[str, Any]]:
    """Every run of Q as stored: record, history, index and score, TTLs, where it should be."""
    out: dict[str, dict[str, Any]] = {}
    for p in range(partitions):
        keys = part(p, partitions)
        for index in INDEXES:
            for run_id, score in client.zrange(getattr(keys, index), 0, -1, withscores=True):
                assert partition_of(run_id, partitions) == p, f"{run_id} misplaced"
                assert run_id not in out, f"{run_id} indexed twice"
                out[run_id] = {
                    "fields": client.hgetall(keys.run(run_id)),
                    "history": client.lrange(keys.history(run_id), 0, -1),
                    "index": index,
                    "score": score,
                    "ttl": client.pttl(keys.run(run_id)),
                    "history_ttl": client.pttl(keys.history(run_id)),
                }
    return out


def without_ttls(runs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """A snapshot with each TTL reduced to whether there is one (they tick down)."""
    return {
        r: {**v, "ttl": v["ttl"] > 0, "history_ttl": v["history_ttl"] > 0} for r, v in runs.items()
    }


def same_ttl(before: int, after: int) -> bool:
    """No TTL stays none; a TTL is re-applied from its PTTL (it may gain the move's time)."""
    return (before < 0 and after < 0) or (before > 0 and after > 0 and abs(after - before) < 10_000)


def register_worker(
    client: Any, queues: list[str], seen_ago_ms: int = 0, worker_id: str = "w-9"
) -> None:
    """A worker registry entry as a worker writes it (a live one: last seen now)."""
    now = int(time.time() * 1000)
    info = {
        "id": worker_id,
        "host": "h",
        "pid": 1,
        "queues": queues,
        "concurrency": 1,
        "in_flight": 0,
        "started_ms": now,
        "last_seen_ms": now - seen_ago_ms,
        "lease_ms": 30_000,
    }
    client.hset(WORKERS_KEY, worker_id, json.dumps(info))


def cli(client: Any, *args: str, input: str | None = None) -> Any:
    return CliRunner().invoke(main, list(args), obj=State(None, JobQueue(client)), input=input)


@pytest.mark.parametrize(("old", "new"), [(1, 4), (4, 2)])
def test_every_run_keeps_its_record_history_index_score_and_ttls(
    redis_client: Any, old: int, new: int
) -> None:
    populate(redis_client, old)
    before = snapshot(redis_client, old)
    assert {v["fields"]["state"] for v in before.values()} == {
        "pending",
        "dead",
        "done",
        "cancelled",
    }
    assert any(v["history"] for v in before.values())
    rp.repartition(JobQueue(redis_client), Q, new)
    after = snapshot(redis_client, new)  # also asserts every run sits in its new partition
    assert after.keys() == before.keys()
    for run_id, b in before.items():
        a = after[run_id]
        assert (a["fields"], a["history"], a["index"], a["score"]) == (
            b["fields"],
            b["history"],
            b["index"],
            b["score"],
        ), run_id
        assert same_ttl(b["ttl"], a["ttl"]) and same_ttl(b["history_ttl"], a["history_ttl"])


def test_the_new_count_is_recorded_and_a_client_configured_with_it_finds_every_run(
    redis_client: Any,
) -> None:
    populate(redis_client, 1)
    run_ids = set(snapshot(redis_client, 1))
    rp.repartition(JobQueue(redis_client), Q, 4)
    assert redis_client.hget(QUEUES_KEY, Q) == "4 spread"
    jq = JobQueue(redis_client, partitions={Q: 4})
    assert jq.register_queue(Q) == 4
    assert {jq.get_run(run_id).run_id for run_id in run_ids} == run_ids
    assert {jq.get_run(run_id, queue=Q).partition for run_id in run_ids} == {0, 1, 2, 3}


def test_a_client_with_the_old_count_is_refused_afterwards(redis_client: Any) -> None:
    populate(redis_client, 1)
    rp.repartition(JobQueue(redis_client), Q, 4)
    with pytest.raises(ConfigError, match="has 4 partitions in Redis but 1") as refused:
        JobQueue(redis_client, partitions={Q: 1}).register_queue(Q)
    assert f"jobqueue repartition {Q} --partitions 1" in str(refused.value)  # says the way out


def test_a_worker_with_the_new_count_runs_the_moved_pending_runs(redis_client: Any) -> None:
    populate(redis_client, 1)
    rp.repartition(JobQueue(redis_client), Q, 4)
    jq = JobQueue(redis_client, partitions={Q: 4})
    ran: list[int] = []

    @jq.task(name="t", queue=Q)
    def t(i: int) -> None:
        ran.append(i)

    with running(make_worker(jq, queues=[Q])):
        wait_for(lambda: len(ran) == 8, what="the 8 runs due now")
    assert all(jq.get_run(f"now-{i}").state == "done" for i in range(8))
    assert jq.get_run("later-0").state == "pending"


def test_counters_of_removed_partitions_are_added_to_the_remaining_ones(
    redis_client: Any,
) -> None:
    populate(redis_client, 4)

    def totals(partitions: int) -> dict[str, int]:
        out: dict[str, int] = {}
        for p in range(partitions):
            for name, value in redis_client.hgetall(part(p, partitions).stats).items():
                out[name] = out.get(name, 0) + int(value)
        return out

    before = totals(4)
    report = rp.repartition(JobQueue(redis_client), Q, 2)
    assert totals(2) == before and before["created"] == 12 + 24 + 4
    # Partition 0 keeps its tag (the first of every spread layout); the others move.
    assert sorted(report.folded) == [(1, 1), (2, 0), (3, 1)]
    assert not redis_client.exists(*(part(p, 4).stats for p in (1, 2, 3)))


@pytest.mark.parametrize(("old", "new"), [(4, 2), (1, 4)])
def test_every_new_partition_issues_fences_above_any_issued_before_the_move(
    redis_client: Any, old: int, new: int
) -> None:
    populate(redis_client, old)
    for p in range(old):
        redis_client.set(part(p, old).fences, 100 + p)
    rp.repartition(JobQueue(redis_client), Q, new)
    highest = 100 + old - 1
    assert [int(redis_client.get(part(p, new).fences)) for p in range(new)] == [highest] * new
    gone = set(queue_partitions(Q, old, True)) - set(queue_partitions(Q, new, True))
    assert not any(redis_client.exists(k.fences) for k in gone)


@pytest.mark.parametrize(("old", "new"), [(4, 2), (1, 4)])
def test_a_paused_queue_stays_paused_on_every_new_partition(
    redis_client: Any, old: int, new: int
) -> None:
    populate(redis_client, old).pause_queue(Q)
    since = redis_client.get(part(0, old).paused)
    rp.repartition(JobQueue(redis_client), Q, new)
    assert [redis_client.get(part(p, new).paused) for p in range(new)] == [since] * new
    gone = set(queue_partitions(Q, old, True)) - set(queue_partitions(Q, new, True))
    assert not any(redis_client.exists(k.paused) for k in gone)


@pytest.mark.parametrize(("old", "new"), [(4, 2), (1, 4)])
def test_pending_runs_keep_their_priority_in_their_new_partition(
    redis_client: Any, old: int, new: int
) -> None:
    jq = JobQueue(redis_client, partitions={Q: old})
    report = jq.declare_task("report", queue=Q)
    for i in range(8):
        report.with_options(run_id=f"low-{i}").enqueue()
        report.with_options(run_id=f"high-{i}", priority=9).enqueue()
    rp.repartition(JobQueue(redis_client), Q, new)
    runner = ScriptRunner(redis_client)
    for p in range(new):
        claimed = [r.run_id for r in claim(runner, part(p, new), limit=20).runs]
        highs = [r for r in claimed if r.startswith("high")]
        assert claimed[: len(highs)] == highs, claimed
    gone = set(queue_partitions(Q, old, True)) - set(queue_partitions(Q, new, True))
    assert not any(redis_client.exists(k.prio) for k in gone)


@pytest.mark.parametrize(("old", "new"), [(4, 2), (1, 4)])
def test_an_owned_deduplication_key_moves_with_its_run(
    redis_client: Any, old: int, new: int
) -> None:
    jq = JobQueue(redis_client, partitions={Q: old})
    report = jq.declare_task("report", queue=Q)
    held = {f"user:{i}": report.with_options(dedupe=Dedupe(f"user:{i}")).enqueue().run_id
            for i in range(8)}
    rp.repartition(JobQueue(redis_client), Q, new)
    moved = JobQueue(redis_client, partitions={Q: new})
    report = moved.declare_task("report", queue=Q)
    again = {k: report.with_options(dedupe=Dedupe(k)).enqueue() for k in held}
    assert {k: (h.outcome, h.run_id) for k, h in again.items()} == {
        k: ("deduplicated", r) for k, r in held.items()
    }
    gone = set(queue_partitions(Q, old, True)) - set(queue_partitions(Q, new, True))
    assert not any(redis_client.keys(k.prefix + "dedupe:*") for k in gone)


@pytest.mark.parametrize(("old", "new"), [(4, 2), (1, 4)])
def test_a_concurrency_limit_holds_on_every_new_partition(
    redis_client: Any, old: int, new: int
) -> None:
    populate(redis_client, old).set_queue_concurrency(Q, 3)
    rp.repartition(JobQueue(redis_client), Q, new)
    moved = JobQueue(redis_client, partitions={Q: new})
    assert [r.concurrency_limit for r in queries.stats(moved, Q)] == [3] * new
    gone = set(queue_partitions(Q, old, True)) - set(queue_partitions(Q, new, True))
    assert not any(redis_client.exists(k.limits) for k in gone)


@pytest.mark.parametrize(("old", "new"), [(4, 2), (1, 4)])
def test_per_key_and_per_task_limits_hold_on_every_new_partition(
    redis_client: Any, old: int, new: int
) -> None:
    jq = populate(redis_client, old)
    jq.set_queue_concurrency(Q, 3, per_key=True)
    jq.set_queue_concurrency(Q, 2, task="export")
    jq.set_queue_rate(Q, 5, per=2, per_key=True)
    rp.repartition(JobQueue(redis_client), Q, new)
    moved = JobQueue(redis_client, partitions={Q: new})
    rows = queries.stats(moved, Q)
    assert [(r.key_concurrency_limit, r.task_caps) for r in rows] == [(3, {"export": 2})] * new
    assert [(r.key_rate_limit, r.key_rate_window_ms) for r in rows] == [(5, 2_000)] * new
    assert {redis_client.hget(k.limits, "task_caps") for k in queue_partitions(Q, new, True)} == {
        "1"
    }


def test_a_run_parked_by_a_cap_moves_at_its_own_due_time(redis_client: Any) -> None:
    jq = JobQueue(redis_client)
    jq.declare_task("t", queue=Q)
    jq.set_queue_concurrency(Q, 1, per_key=True)
    # A job whose runs leave partition 0 when the queue gets 4 partitions.
    job = next(j for j in (f"job{i}" for i in range(100)) if partition_of(j + "@1", 4) != 0)
    a, b = f"{job}@1", f"{job}@2"
    for run_id in (a, b):
        jq.enqueue(jq.resolve_task("t").with_options(run_id=run_id, limit_key="k"))
    source = jq.keys_for(Q, a)
    jq.scripts.run(CLAIM.call(source, 2, "w-1", LEASE_MS, RETENTION_MS))  # a runs, b held back
    assert redis_client.hget(source.run(b), "parked") == "key:k"
    # a's worker stopped, its run finished outside (no running run: a move is allowed).
    redis_client.zrem(source.leases, a)
    redis_client.hset(source.run(a), "state", "done")
    due = int(redis_client.hget(source.run(b), "due"))
    rp.repartition(JobQueue(redis_client), Q, 4)
    target = queue_partitions(Q, 4, True)[partition_of(b, 4)]
    assert redis_client.hget(target.run(b), "state") == "pending"
    assert redis_client.hget(target.run(b), "parked") is None
    assert redis_client.zscore(target.due, b) == due
    assert not redis_client.zcard(source.parked)


def test_a_running_queue_stays_running_after_a_repartition(redis_client: Any) -> None:
    populate(redis_client, 1)
    rp.repartition(JobQueue(redis_client), Q, 4)
    assert not JobQueue(redis_client, partitions={Q: 4}).queue_paused(Q)


def test_refused_while_runs_are_running_and_nothing_moves(redis_client: Any) -> None:
    jq = populate(redis_client, 1)
    keys = jq.partition_keys(Q, 0)
    jq.scripts.run(CLAIM.call(keys, 1, "w-1", LEASE_MS, RETENTION_MS))
    before = snapshot(redis_client, 1)
    with pytest.raises(OperationRefused, match="1 running runs: stop or drain its workers"):
        rp.repartition(JobQueue(redis_client), Q, 4)
    assert without_ttls(snapshot(redis_client, 1)) == without_ttls(before)
    assert redis_client.hget(QUEUES_KEY, Q) == "1"


def test_refused_while_workflow_runs_wait_in_the_queue_and_nothing_moves(
    redis_client: Any,
) -> None:
    jq = populate(redis_client, 1)
    t = jq.declare_task("t", queue=Q)
    jq.chain(t.s(), t.s())
    before = snapshot(redis_client, 1)
    with pytest.raises(OperationRefused, match="1 workflow runs waiting"):
        rp.repartition(JobQueue(redis_client), Q, 4)
    assert without_ttls(snapshot(redis_client, 1)) == without_ttls(before)
    assert redis_client.hget(QUEUES_KEY, Q) == "1"


def test_refused_while_a_live_worker_serves_the_queue(redis_client: Any) -> None:
    populate(redis_client, 1)
    register_worker(redis_client, [Q])
    with pytest.raises(OperationRefused, match="live workers serve queue 'mail'"):
        rp.repartition(JobQueue(redis_client), Q, 4)
    assert redis_client.hget(QUEUES_KEY, Q) == "1"


def test_a_stale_worker_entry_or_a_worker_of_another_queue_does_not_block(
    redis_client: Any,
) -> None:
    populate(redis_client, 1)
    register_worker(redis_client, [Q], seen_ago_ms=600_000)
    register_worker(redis_client, ["other"], worker_id="w-8")
    rp.repartition(JobQueue(redis_client), Q, 4)
    assert redis_client.hget(QUEUES_KEY, Q) == "4 spread"


def test_a_queue_not_recorded_in_redis_is_refused(redis_client: Any) -> None:
    populate(redis_client, 1)
    with pytest.raises(OperationRefused, match=r"no queue 'mial' recorded in Redis \(known: mail"):
        rp.repartition(JobQueue(redis_client), "mial", 4)


def test_a_rerun_after_a_crash_mid_move_completes_it(
    redis_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The crash comes after a page's copies are written and before its old keys are deleted:
    the run then exists twice, and the re-run must leave exactly one of each."""
    populate(redis_client, 4)
    before = snapshot(redis_client, 4)
    real, calls = rp._delete_sources, []

    def crashing(r: Any, moves: Any) -> None:
        calls.append(len(moves))
        if len(calls) == 4:
            raise RuntimeError("killed")
        real(r, moves)

    monkeypatch.setattr(rp, "_delete_sources", crashing)
    with pytest.raises(RuntimeError, match="killed"):
        rp.repartition(JobQueue(redis_client), Q, 2, page=2)
    assert redis_client.hget(QUEUES_KEY, Q) == "4 spread"  # clients still use the old count
    layouts = set(queue_partitions(Q, 4, True)) | set(queue_partitions(Q, 2, True))
    stored_twice = [r for r in before if sum(redis_client.exists(k.run(r)) for k in layouts) == 2]
    assert stored_twice  # the crash left copies whose old keys were not deleted yet
    assert redis_client.hget(rp.MOVING_KEY, Q) == "2 spread"
    monkeypatch.setattr(rp, "_delete_sources", real)
    rp.repartition(JobQueue(redis_client), Q, 2)
    after = snapshot(redis_client, 2)
    assert after.keys() == before.keys()
    assert all(
        after[r]["fields"] == b["fields"] and after[r]["score"] == b["score"]
        for r, b in before.items()
    )
    assert redis_client.hget(QUEUES_KEY, Q) == "2 spread"
    assert not redis_client.hget(rp.MOVING_KEY, Q)


def test_a_rerun_with_another_count_after_a_crash_still_finds_every_run(
    redis_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    populate(redis_client, 1)
    run_ids = set(snapshot(redis_client, 1))
    real, calls = rp._delete_sources, []

    def crashing(r: Any, moves: Any) -> None:
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("killed")
        real(r, moves)

    monkeypatch.setattr(rp, "_delete_sources", crashing)
    with pytest.raises(RuntimeError):
        rp.repartition(JobQueue(redis_client), Q, 8, page=2)
    monkeypatch.setattr(rp, "_delete_sources", real)
    rp.repartition(JobQueue(redis_client), Q, 3)  # some runs already sit in the 8 layout
    assert set(snapshot(redis_client, 3)) == run_ids
    stale = set(queue_partitions(Q, 8, True)) - set(queue_partitions(Q, 3, True))
    assert not any(redis_client.exists(k.run(r)) for k in stale for r in run_ids)


def test_a_second_run_of_a_finished_move_changes_nothing(redis_client: Any) -> None:
    populate(redis_client, 1)
    rp.repartition(JobQueue(redis_client), Q, 4)
    before = snapshot(redis_client, 4)
    report = rp.repartition(JobQueue(redis_client), Q, 4)
    assert report.total_moved == 0 and report.stayed == len(before)
    assert without_ttls(snapshot(redis_client, 4)) == without_ttls(before)


def test_a_run_id_stored_twice_with_different_contents_is_left_for_a_human(
    redis_client: Any,
) -> None:
    populate(redis_client, 1)
    run_id = next(f"later-{i}" for i in range(8) if partition_of(f"later-{i}", 4) != 0)
    target = part(partition_of(run_id, 4), 4)
    redis_client.hset(target.run(run_id), mapping={"state": "pending", "task": "other"})
    with pytest.raises(OperationRefused, match=f"1 run ids exist in two partitions.*{run_id}"):
        rp.repartition(JobQueue(redis_client), Q, 4)
    assert redis_client.hget(part(0, 1).run(run_id), "task") == "t"
    assert redis_client.hget(target.run(run_id), "task") == "other"
    assert redis_client.hget(QUEUES_KEY, Q) == "1"


def test_plan_page_keeps_runs_already_in_their_partition() -> None:
    source = part(1, 4)
    ids = [f"r-{i}" for i in range(40)]
    moves, stayed = rp.plan_page(source, "due", [(r, 5.0) for r in ids], 4)
    assert stayed == sum(partition_of(r, 4) == 1 for r in ids)
    assert [m.run_id for m in moves] == [r for r in ids if partition_of(r, 4) != 1]
    assert all(m.target.partition == partition_of(m.run_id, 4) for m in moves)


# -- the CLI ----------------------------------------------------------------------------------


def test_cli_json_reports_what_moved_by_state(redis_client: Any) -> None:
    populate(redis_client, 1)
    result = cli(redis_client, "repartition", Q, "--partitions", "4", "--yes", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    moved = sum(partition_of(r, 4) != 0 for r in snapshot(redis_client, 4))
    assert report["moved"] == moved and report["from"] == 1 and report["to"] == 4
    assert sum(report["moved_by_state"].values()) == moved
    assert set(report["moved_by_state"]) == {"pending", "dead", "done", "cancelled"}
    assert report["stayed"] == len(snapshot(redis_client, 4)) - moved
    assert isinstance(report["seconds"], float)


def test_cli_asks_first_and_no_moves_nothing(redis_client: Any) -> None:
    populate(redis_client, 1)
    before = snapshot(redis_client, 1)
    result = cli(redis_client, "repartition", Q, "--partitions", "4", input="n\n")
    assert result.exit_code == 1
    assert f"queue 'mail': 1 -> 4 partitions; {len(before)} runs" in result.stderr
    assert "nothing moved" in result.stderr
    assert without_ttls(snapshot(redis_client, 1)) == without_ttls(before)


def test_cli_yes_at_the_prompt_moves_and_prints_a_summary(redis_client: Any) -> None:
    populate(redis_client, 1)
    result = cli(redis_client, "repartition", Q, "--partitions", "4", input="y\n")
    assert result.exit_code == 0, result.output
    assert "recorded 4 partitions in" in result.stdout
    assert redis_client.hget(QUEUES_KEY, Q) == "4 spread"


def test_cli_refusal_is_one_line_and_exit_1(redis_client: Any) -> None:
    populate(redis_client, 1)
    register_worker(redis_client, [Q])
    result = cli(redis_client, "repartition", Q, "--partitions", "4", "--yes")
    assert result.exit_code == 1
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: 1 live workers")


def test_cli_partitions_out_of_range_is_a_usage_error(redis_client: Any) -> None:
    result = cli(redis_client, "repartition", Q, "--partitions", "0", "--yes")
    assert result.exit_code == 2 and "--partitions" in result.stderr
