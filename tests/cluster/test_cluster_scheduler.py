"""Recurring jobs on the cluster: definitions partitioned over scheduler slots on several
masters, two schedulers ticking the same moments, each fire time's run created once."""

from __future__ import annotations

from collections import Counter

import pytest
from cluster_launcher import Cluster

from jobqueue import JobQueue
from jobqueue.policy.cron import parse_fire_instant
from jobqueue.scheduler.daemon import Scheduler
from jobqueue.schedules.recurring import ENV_SCHED_PARTITIONS

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
        schedulers.append(Scheduler(jq, lookahead=0, install_signal_handlers=False))
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
