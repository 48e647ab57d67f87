"""The soak's checker finds what it is meant to find: a run not done, a fire time with no run,
a side effect applied twice, a commit from a stale fence (records made by hand, fakeredis)."""

from __future__ import annotations

import json
from typing import Any

import fakeredis
import pytest
from checker import APPLIED, EFFECTS, Report, check

from jobqueue.store.keys import PartitionKeys

PK = PartitionKeys("default", 0)


def done_run(r: Any, run_id: str, fence: int = 1, result_fence: int | None = None) -> None:
    result = {"fence": fence if result_fence is None else result_fence, "n": 0}
    r.hset(PK.run(run_id), mapping={"state": "done", "fence": fence, "attempt": 1,
                                    "result": json.dumps(result)})  # fmt: skip
    r.hset(
        PK.fence_resource(f"chaos:{run_id}"), mapping={"fence": fence, "value": json.dumps(result)}
    )
    r.hincrby(EFFECTS, run_id, 1)
    r.sadd(APPLIED, run_id)
    r.hincrby(PK.stats, "completed", 1)
    r.hincrby(PK.stats, "created", 1)


@pytest.fixture
def r() -> Any:
    return fakeredis.FakeRedis(server=fakeredis.FakeServer(), decode_responses=True)


def test_a_clean_soak_has_no_problem(r: Any) -> None:
    for rid in ("a", "b", "job@1"):
        done_run(r, rid)
    report = check(r, PK, ["a", "b"], {"job": ["job@1"]}, Report())
    assert (report.runs, report.lost, report.duplicates, report.problems) == (3, 0, 0, [])


def test_a_run_not_done_and_a_missing_fire_time_count_as_lost(r: Any) -> None:
    done_run(r, "a")
    r.hset(PK.run("b"), mapping={"state": "running", "fence": 1, "attempt": 1})
    report = check(r, PK, ["a", "b"], {"job": ["job@1"]}, Report())
    assert report.lost == 2
    assert report.problems


def test_an_effect_applied_twice_and_an_unexpected_fire_count_as_duplicates(r: Any) -> None:
    done_run(r, "a")
    r.hincrby(EFFECTS, "a", 1)
    done_run(r, "job@1")
    done_run(r, "job@2")
    report = check(r, PK, ["a"], {"job": ["job@1"]}, Report())
    assert report.duplicates == 2


def test_a_commit_from_a_stale_fence_is_a_problem(r: Any) -> None:
    done_run(r, "a", fence=2, result_fence=1)
    report = check(r, PK, ["a"], {}, Report())
    assert any("committed by fence 1" in p for p in report.problems)
