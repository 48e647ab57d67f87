"""A herd created before it fires (issue 16): the scheduler's lookahead grows, up to
--max-lookahead, to the time its creation rate needs for the jobs firing within reach, and
``jobqueue check`` warns when the largest herd cannot be created in the lookahead the
schedulers may use. Explicit clocks where the scheduler runs; both backends."""

from __future__ import annotations

import re
from typing import Any

import pytest

from jobqueue.client.sync import JobQueue
from jobqueue.ops.scheduler_checks import checks as scheduler_checks
from jobqueue.policy.cron import parse_fire_instant
from jobqueue.recurring.config import SchedulerConfig
from jobqueue.recurring.daemon import Scheduler
from jobqueue.recurring.declarations import make_definition
from jobqueue.recurring.fires import first_fire_after
from jobqueue.recurring.membership import read_members

# What this module checks does not depend on the backend: run on the real server only
# (real_only, tests/conftest.py); the scripts and the client API are tested on fakeredis too.
pytestmark = pytest.mark.real_only

S = 1000


def scheduler(jq: JobQueue, **kw: Any) -> Scheduler:
    return Scheduler(jq, SchedulerConfig(**kw), install_signal_handlers=False)


def bulk_herd(jq: JobQueue, n: int, cron: str = "0 * * * *", after_ms: int = 0) -> int:
    """n jobs on the same cron, written as ``jq.schedule`` writes them (pipelined); their
    first fire."""
    template = make_definition(jq, "job-0", "t", cron=cron)
    first = first_fire_after(template, after_ms)
    assert first is not None
    (sk,) = jq.recurring.all_keys()
    jq.recurring.record_partitions()
    ids = [f"job-{i}" for i in range(n)]
    pipe = jq.redis.pipeline(transaction=False)
    pipe.hset(sk.defs, mapping=dict.fromkeys(ids, template.to_json()))
    pipe.zadd(sk.next, dict.fromkeys(ids, first))
    pipe.execute()
    return first


def runs_created(jq: JobQueue) -> int:
    return int(jq.redis.hget(jq.partition_keys("default", 0).stats, "created") or 0)


def test_the_lookahead_is_the_creation_time_of_the_jobs_ahead_with_a_margin(jq: JobQueue) -> None:
    s = scheduler(jq, lookahead=60, create_rate=1_000)
    assert s.max_lookahead_ms == 600 * S  # 10 x --lookahead by default
    assert s.lookahead_for(0) == 60 * S  # never below --lookahead
    assert s.lookahead_for(100_000) == 150 * S  # 100 s at 1,000 runs/s, x 1.5
    assert s.lookahead_for(10_000_000) == 600 * S  # never above --max-lookahead


def test_no_lookahead_stays_no_lookahead(jq: JobQueue) -> None:
    assert scheduler(jq, lookahead=0).lookahead_for(10_000_000) == 0


def test_a_herd_too_big_for_the_lookahead_is_created_earlier(jq: JobQueue) -> None:
    """3,000 jobs fire at 01:00; at 500 runs/s their creation takes 6 s (9 s with the margin):
    the scheduler starts 9 s ahead, not 5 s."""
    top = bulk_herd(jq, 3_000)
    slow = scheduler(jq, lookahead=5, max_lookahead=60, create_rate=500)
    report = slow.tick(now=top - 8 * S)
    assert slow.effective_lookahead_ms == 9 * S
    assert report.runs_created == 3_000  # all created 8 s before they fire
    run = jq.get_run("job-7@1970-01-01T01:00:00Z")  # the run id and due of their fire time
    assert run.scheduled_for_ms == run.due_ms == top


def test_without_growth_the_same_herd_waits_for_the_lookahead(jq: JobQueue) -> None:
    top = bulk_herd(jq, 3_000)
    fixed = scheduler(jq, lookahead=5, max_lookahead=5, create_rate=500)
    assert fixed.tick(now=top - 8 * S).runs_created == 0
    assert fixed.effective_lookahead_ms == 5 * S


def test_the_measured_creation_rate_replaces_the_assumed_one(jq: JobQueue) -> None:
    top = bulk_herd(jq, 2_000)
    s = scheduler(jq, lookahead=0, create_rate=1)
    assert s.create_rate is None
    s.tick(now=top)
    assert runs_created(jq) == 2_000
    assert s.create_rate is not None and s.create_rate > 1
    s.tick(now=top + S)  # the registry shows it
    (me,) = read_members(jq, now_ms=top + S)
    assert me.rate == round(s.create_rate)


# -- check --------------------------------------------------------------------------------------


def herd_line(jq: JobQueue, create_rate: float | None = None) -> Any:
    (line,) = [c for c in scheduler_checks(jq, create_rate) if c.name == "herd"]
    return line


def test_check_finds_the_largest_herd_and_is_ok_when_it_can_be_created_in_time(
    jq: JobQueue,
) -> None:
    now = jq.server_time_ms()
    top = bulk_herd(jq, 2_000, after_ms=now)
    line = herd_line(jq)
    assert line.ok, line.detail
    assert "largest herd of the next 24 h: 2,000 jobs firing within 60 s" in line.detail
    assert "20,000 runs/s (assumed: no scheduler has measured one yet)" in line.detail
    found = re.search(r"within 60 s of (\S+);", line.detail)
    assert found and top - 60 * S <= parse_fire_instant(found.group(1)) <= top


def test_check_warns_when_the_largest_herd_cannot_be_created_before_it_fires(
    jq: JobQueue,
) -> None:
    bulk_herd(jq, 2_000, after_ms=jq.server_time_ms())
    line = herd_line(jq, create_rate=2)  # 1,000 s of work, 600 s of lookahead at most
    assert not line.ok
    assert "more than the 600 s the lookahead may grow to" in line.detail
    assert "or reach 5 runs/s" in line.detail


@pytest.mark.parametrize("cron", ["* * * * *", "*/5 * * * *"])
def test_jobs_spread_over_the_hour_are_no_herd(jq: JobQueue, cron: str) -> None:
    """The same 2,000 jobs, half of them a minute later: the herd is the larger half."""
    now = jq.server_time_ms()
    bulk_herd(jq, 1_000, cron=cron, after_ms=now)
    later = make_definition(jq, "late-0", "t", cron=cron)
    first = first_fire_after(later, now + 600 * S)
    assert first is not None
    (sk,) = jq.recurring.all_keys()
    jq.redis.zadd(sk.next, {f"late-{i}": first for i in range(1_000)})
    jq.redis.hset(sk.defs, mapping={f"late-{i}": later.to_json() for i in range(1_000)})
    assert "1,000 jobs firing within 60 s" in herd_line(jq).detail
