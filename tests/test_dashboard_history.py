"""The history of the queues' gauges in Redis (jobqueue.ops.gauges) and the dashboard's
sampler that writes it: a point per minute for the last hour and per hour for the last week,
one per minute whatever the number of dashboards, shared by all of them and kept through a
restart, bounded, and read over foreign data without an error."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from helpers import wait_for
from starlette.testclient import TestClient

from jobqueue.client.sync import JobQueue
from jobqueue.dashboard.app import create_app
from jobqueue.dashboard.sampler import Sampler
from jobqueue.ops import gauges
from jobqueue.ops.gauges import HOURS, MINUTES, GaugePoint
from jobqueue.ops.queries import QueueTotals
from jobqueue.runtime.clock import FakeClock

MIN = 60_000
HOUR = 60 * MIN
T0 = 1_800_000_000_000 - 1_800_000_000_000 % HOUR  # an hour's start, in 2027
# What a queue's two keys take at most (docs/dashboard.md): measured with every slot full and
# every number 19 digits long, on the suite's server.
BYTES_PER_QUEUE = 40_000


def row(queue: str = "q", due: int = 0, running: int = 0, late_ms: int | None = None
        ) -> QueueTotals:  # fmt: skip
    return QueueTotals(queue, 1, due, 0, running, 0, 0, 0, 0, late_ms)


def points(jq: JobQueue, res: gauges.Resolution, now: int, queue: str = "q"
           ) -> list[GaugePoint]:  # fmt: skip
    (found,) = gauges.history(jq, [queue], res, now)
    assert found.anomalies == ()
    return found.points


# -- the history in Redis ------------------------------------------------------------------------


def test_a_recorded_minute_is_read_back_as_its_point(jq: JobQueue) -> None:
    assert gauges.record(jq, T0 + 5 * MIN + 7, [row(due=3, running=2, late_ms=1500)]) == []
    assert points(jq, MINUTES, T0 + 6 * MIN) == [GaugePoint(T0 + 5 * MIN + 7, 3, 2, 1500)]


def test_a_second_write_of_a_minute_replaces_its_point(jq: JobQueue) -> None:
    gauges.record(jq, T0 + 10, [row(due=3)])
    gauges.record(jq, T0 + 20_000, [row(due=4)])  # another dashboard, the same minute
    assert points(jq, MINUTES, T0 + MIN) == [GaugePoint(T0 + 20_000, 4, 0, 0)]


def test_the_minute_history_holds_the_last_hour_and_never_more(
    jq: JobQueue, redis_client: Any
) -> None:
    for minute in range(180):
        gauges.record(jq, T0 + minute * MIN, [row(due=minute)])
    now = T0 + 179 * MIN
    kept = points(jq, MINUTES, now)
    assert [p.due_now for p in kept] == list(range(120, 180))
    assert redis_client.hlen("jq:gauges:m:q") == 60


def test_the_hour_history_holds_the_last_week_and_never_more(
    jq: JobQueue, redis_client: Any
) -> None:
    for hour in range(9 * 24):
        gauges.record(jq, T0 + hour * HOUR, [row(due=hour)])
    now = T0 + (9 * 24 - 1) * HOUR
    kept = points(jq, HOURS, now)
    assert [p.due_now for p in kept] == list(range(2 * 24, 9 * 24))  # 168 hours
    assert redis_client.hlen("jq:gauges:h:q") == 168


def test_an_hours_point_holds_the_largest_of_its_minutes(jq: JobQueue) -> None:
    gauges.record(jq, T0 + 1 * MIN, [row(due=5, running=1, late_ms=100)])
    gauges.record(jq, T0 + 2 * MIN, [row(due=9, running=0, late_ms=40)])
    gauges.record(jq, T0 + 3 * MIN, [row(due=2, running=4, late_ms=None)])
    gauges.record(jq, T0 + HOUR, [row(due=1)])  # the next hour starts afresh
    assert points(jq, HOURS, T0 + HOUR) == [
        GaugePoint(T0, 9, 4, 100),
        GaugePoint(T0 + HOUR, 1, 0, 0),
    ]


def test_a_week_old_hour_slot_is_written_afresh_not_merged(jq: JobQueue) -> None:
    gauges.record(jq, T0, [row(due=50)])
    later = T0 + 168 * HOUR  # the same slot, a week on
    gauges.record(jq, later, [row(due=1)])
    assert points(jq, HOURS, later) == [GaugePoint(later, 1, 0, 0)]


def test_the_keys_expire_when_no_dashboard_writes_them_any_more(
    jq: JobQueue, redis_client: Any
) -> None:
    gauges.record(jq, T0, [row()])
    assert 0 < redis_client.pttl("jq:gauges:m:q") <= MINUTES.window_ms
    assert MINUTES.window_ms < redis_client.pttl("jq:gauges:h:q") <= HOURS.window_ms


@pytest.mark.real_only
def test_a_queues_history_takes_at_most_the_documented_bytes(
    jq: JobQueue, redis_client: Any
) -> None:
    # a queue name and every number at their longest
    longest = row("q".ljust(64, "x"), 10**18, 10**18, 10**18)
    for minute in range(60):
        gauges.record(jq, T0 + minute * MIN, [longest])
    for hour in range(1, 200):
        gauges.record(jq, T0 + hour * HOUR, [longest])
    keys = [f"jq:gauges:m:{longest.queue}", f"jq:gauges:h:{longest.queue}"]
    assert [redis_client.hlen(k) for k in keys] == [60, 168]
    assert sum(redis_client.memory_usage(k) for k in keys) <= BYTES_PER_QUEUE


def test_only_the_first_claim_of_a_minute_wins(jq: JobQueue) -> None:
    assert gauges.claim_minute(jq, T0 + 1_000) is True
    assert gauges.claim_minute(jq, T0 + 59_000) is False
    assert gauges.claim_minute(jq, T0 + MIN) is True


def test_a_key_of_another_type_is_an_anomaly_and_is_never_written(
    jq: JobQueue, redis_client: Any
) -> None:
    redis_client.set("jq:gauges:m:q", "not ours")
    written = gauges.record(jq, T0, [row("q", due=1), row("other", due=2)])
    assert [str(a) for a in written] == ["jq:gauges:m:q: holds another type, not a hash"]
    assert redis_client.get("jq:gauges:m:q") == "not ours"
    assert redis_client.pttl("jq:gauges:m:q") == -1  # not even an expiry
    assert redis_client.exists("jq:gauges:h:q") == 0  # the queue is skipped whole
    found = gauges.history(jq, ["q", "other"], MINUTES, T0 + 1)
    assert [(h.queue, len(h.points), [str(a) for a in h.anomalies]) for h in found] == [
        ("q", 0, ["jq:gauges:m:q: holds another type, not a hash"]),
        ("other", 1, []),
    ]


def test_fields_that_are_not_points_are_anomalies_and_the_rest_is_read(
    jq: JobQueue, redis_client: Any
) -> None:
    gauges.record(jq, T0 + 3 * MIN, [row(due=7)])
    negative = json.dumps({"t": T0 + 2 * MIN, "due": -4, "running": 0, "late_ms": 0})
    redis_client.hset("jq:gauges:m:q", mapping={
        "0": "{garbage",
        "1": json.dumps({"t": 1, "due": 1, "running": 0, "late_ms": 0}),  # slot 0's time
        "2": negative,
        "x": "{}",
        "99": "{}",
    })  # fmt: skip
    (found,) = gauges.history(jq, ["q"], MINUTES, T0 + 4 * MIN)
    assert found.points == [GaugePoint(T0 + 3 * MIN, 7, 0, 0)]
    problems = sorted(a.problem for a in found.anomalies)
    assert problems == [
        "field '0' is '{garbage', not a point",
        "field '1' holds a point of slot 0",
        f"field '2' is {negative!r}, not a point",
        "field '99' is not a slot (0 to 59)",
        "field 'x' is not a slot (0 to 59)",
    ]


# -- the sampler --------------------------------------------------------------------------------


@pytest.fixture
def queued(jq: JobQueue) -> JobQueue:
    jq.declare_task("report")
    for run_id in ("r1", "r2"):
        jq.enqueue(jq.resolve_task("report").with_options(run_id=run_id))
    return jq


def test_a_sampler_writes_the_queues_as_redis_holds_them(queued: JobQueue) -> None:
    clock = FakeClock(now_ms=T0)
    assert Sampler(queued, clock=clock).sample() is True
    assert [p.due_now for p in points(queued, MINUTES, T0, "default")] == [2]


def test_of_two_dashboards_looking_in_one_minute_only_the_first_writes(queued: JobQueue) -> None:
    clock = FakeClock(now_ms=T0)
    first, second = Sampler(queued, clock=clock), Sampler(queued, clock=clock)
    assert first.sample() is True
    clock.advance(20)
    assert second.sample() is False
    assert first.sample() is False  # nor the first again
    assert [p.at_ms for p in points(queued, MINUTES, T0 + MIN, "default")] == [T0]
    clock.advance(40)  # the next minute: whoever looks first
    assert second.sample() is True
    assert first.sample() is False
    assert [p.at_ms for p in points(queued, MINUTES, T0 + MIN, "default")] == [T0, T0 + MIN]


# -- the pages -------------------------------------------------------------------------------------

pages = pytest.mark.real_only  # what the pages show does not depend on the backend


def depth_points(page: str, queue: str = "default") -> int:
    """How many points the 'due now' line of a queue's depth chart has."""
    chart = re.search(rf'<svg[^>]*id="chart-depth-{queue}".*?</svg>', page, re.S)
    assert chart, "no depth chart"
    line = re.search(r'<polyline points="([^"]+)"', chart.group(0))
    if line:
        return len(line.group(1).split())
    return len(re.findall(r"<circle", chart.group(0))) // 2  # a lone point: a dot per series


def wait_for_a_point(jq: JobQueue, queue: str = "default") -> None:
    wait_for(
        lambda: gauges.history(jq, [queue], MINUTES, jq.server_time_ms())[0].points,
        10, "a point to be written", interval=0.02,
    )


@pages
def test_two_dashboards_show_the_same_history(queued: JobQueue) -> None:
    sampling = TestClient(create_app(queued))
    assert sampling.get("/workers").status_code == 200  # its first request starts its sampler
    wait_for_a_point(queued)
    other = TestClient(create_app(queued, sample_every_s=None))  # samples nothing itself
    # the point the first wrote, then the page's own reading
    assert depth_points(other.get("/queue?name=default").text) == 2


@pages
def test_a_dashboard_started_again_shows_the_history_recorded_before(queued: JobQueue) -> None:
    before = create_app(queued)
    TestClient(before).get("/workers")
    wait_for_a_point(queued)
    del before
    again = TestClient(create_app(queued, sample_every_s=None))
    assert depth_points(again.get("/queues").text) == 2


@pages
def test_a_page_alone_has_only_its_own_reading(queued: JobQueue) -> None:
    """The control of the two tests above: with no history, the line is one point."""
    alone = TestClient(create_app(queued, sample_every_s=None))
    assert depth_points(alone.get("/queue?name=default").text) == 1


@pages
@pytest.mark.parametrize("page", ["/queues", "/queue?name=default"])
def test_a_foreign_history_key_is_an_anomaly_on_the_page_not_an_error(
    queued: JobQueue, redis_client: Any, page: str
) -> None:
    redis_client.set("jq:gauges:m:default", "foreign")
    redis_client.hset("jq:gauges:h:default", "3", "{garbage")
    reply = TestClient(create_app(queued, sample_every_s=None)).get(page)
    assert reply.status_code == 200
    assert "<code>jq:gauges:m:default</code>: holds another type, not a hash" in reply.text
    if page.startswith("/queue?"):  # the week's chart reads the hours
        assert "<code>jq:gauges:h:default</code>: field &#39;3&#39; is" in reply.text
