"""Recurring jobs on the cluster: definitions partitioned over scheduler slots on several
masters, two schedulers ticking the same moments, each fire time's run created once."""

from __future__ import annotations

from collections import Counter

import pytest
from cluster_launcher import Cluster
from redis.crc import key_slot

from jobqueue import JobQueue
from jobqueue.ops import queries as inspect
from jobqueue.policy.cron import parse_fire_instant
from jobqueue.recurring.config import SchedulerConfig
from jobqueue.recurring.daemon import Scheduler
from jobqueue.recurring.definitions import ENV_SCHED_PARTITIONS, SCHED_CONFIG_KEY

S = 1000


def scheduled_runs(cluster: Cluster) -> Counter[tuple[str, int]]:
    """(job id, fire second) -> number of run records, read from every master."""
    out: Counter[tuple[str, int]] = Counter()
    for node in cluster.master_nodes():
        with node.client() as c:
            for key in c.scan_iter(match="jq:{*}:run:*", count=1000):
                job, _, when = key.split(":run:", 1)[1].rpartition("@")
                out[(job, parse_fire_instant(when) // S)] += 1
    return out


def masters_holding(cluster: Cluster, pattern: str) -> int:
    count = 0
    for node in cluster.master_nodes():
        with node.client() as c:
            count += any(True for _ in c.scan_iter(match=pattern, count=1000))
    return count


def test_two_schedulers_fire_each_recurring_job_once_per_fire_time(
    cluster_url: str, cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_SCHED_PARTITIONS, "8")
    admin = JobQueue.from_url(cluster_url, partitions={"default": 16})
    admin.declare_task("t")
    jobs = [f"job-{i}" for i in range(40)]
    for job in jobs:
        admin.schedule(job, "t", every=60, misfire="fire-all", now=0)
    assert masters_holding(cluster, "jq:{sched#*}:def") >= 2  # definitions are partitioned
    schedulers = []
    for _ in range(2):
        jq = JobQueue.from_url(cluster_url, partitions={"default": 16})
        jq.declare_task("t")
        schedulers.append(
            Scheduler(jq, SchedulerConfig(lookahead=0), install_signal_handlers=False)
        )
    for now in (60 * S, 120 * S, 180 * S):
        # Worst interleaving: both read and create before either advances.
        batches = [(s, s.fire(sk, now)) for sk in schedulers[0].store.all_keys()
                   for s in schedulers]
        for s, batch in batches:
            s.advance(batch)
        assert sum(b.report.advanced for _, b in batches) == len(jobs)
    runs = scheduled_runs(cluster)
    assert runs == Counter({(job, t): 1 for job in jobs for t in (60, 120, 180)})
    assert masters_holding(cluster, "jq:{default#*}:run:*") == 3
    for job in jobs[:3]:
        info = admin.get_schedule(job)
        assert info is not None and info.state.fired == 3 and info.next_fire_ms == 240 * S
    for s in schedulers:
        s.jq.close()
    admin.close()


def test_k_defaults_to_4_per_master_spread_evenly_and_two_schedulers_share_it(
    cluster_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing configures K: the first write records 4 x the 3 masters, spread 4 over each
    third of the slots (the masters' equal ranges as the cluster is created; another test may
    have moved a slot since); two schedulers then own 6 each and every job fires once."""
    monkeypatch.delenv(ENV_SCHED_PARTITIONS, raising=False)
    admin = JobQueue.from_url(cluster_url)
    admin.declare_task("t")
    for i in range(60):
        admin.schedule(f"job-{i}", "t", every=60, misfire="fire-all", now=0)
    assert admin.redis.hget(SCHED_CONFIG_KEY, "partitions") == "12 spread"
    keys = admin.recurring.all_keys()
    thirds = Counter(key_slot(sk.next.encode()) * 3 // 16384 for sk in keys)
    assert thirds == Counter({0: 4, 1: 4, 2: 4})
    schedulers = [
        Scheduler(JobQueue.from_url(cluster_url), SchedulerConfig(lookahead=0),
                  install_signal_handlers=False, scheduler_id=name)
        for name in ("a", "b")
    ]  # fmt: skip
    for t in (1, 2, 3):
        for s in schedulers:
            s.tick(now=t * S)
    assert sorted(len(s.ownership.owned()) for s in schedulers) == [6, 6]
    for s in schedulers:
        s.tick(now=60 * S)
    assert scheduled_runs_on(admin) == Counter({(f"job-{i}", 60): 1 for i in range(60)})
    for s in schedulers:
        s.close()
        s.jq.close()
    admin.close()


def scheduled_runs_on(jq: JobQueue) -> Counter[tuple[str, int]]:
    """(job id, fire second) -> run records, through the client (every partition of every
    queue)."""
    out: Counter[tuple[str, int]] = Counter()
    for run in inspect.runs(jq, state="pending", limit=10_000):
        job, _, when = run.run_id.rpartition("@")
        out[(job, parse_fire_instant(when) // S)] += 1
    return out
