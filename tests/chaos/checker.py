"""The chaos soak's checker: reads everything back from Redis after the soak and proves the
guarantees, with counts.

- every run is done (lost = runs not done, or an expected fire time with no run);
- exactly one accepted commit per run: stats.completed equals the number of runs, each run's
  result carries its current fence, and the fenced resource holds that attempt's write;
- the run-id-keyed side effect was applied exactly once per run (duplicates = runs whose
  effect was applied more than once, or an unexpected run);
- every recurring fire time in the window has exactly one run;
- nothing is left in the due, leases or dead sets.

Counts that show the faults were real: stale commits refused by the fence, re-executions
(at-least-once made visible), and the highest attempt number.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from jobqueue.store.keys import PartitionKeys

EFFECTS, APPLIED, EXECUTIONS = "chaos:effects", "chaos:applied", "chaos:executions"


@dataclass
class Report:
    runs: int = 0
    enqueued: int = 0
    recurring: int = 0
    kills: int = 0
    pauses: int = 0
    restarts: int = 0
    rejected_stale_commits: int = 0
    re_executions: int = 0
    max_attempt: int = 0
    lost: int = 0
    duplicates: int = 0
    problems: list[str] = field(default_factory=list)

    def line(self) -> str:
        return (
            f"chaos soak: runs={self.runs} (enqueued={self.enqueued} recurring={self.recurring}) "
            f"kills={self.kills} pauses={self.pauses} restarts={self.restarts} "
            f"rejected_stale_commits={self.rejected_stale_commits} "
            f"re_executions={self.re_executions} max_attempt={self.max_attempt} "
            f"duplicates: {self.duplicates} lost: {self.lost}"
        )

    def problem(self, text: str) -> None:
        if len(self.problems) < 20:  # enough to diagnose, not a flood
            self.problems.append(text)


def _records(r: Any, pk: PartitionKeys, run_ids: list[str]) -> list[dict[str, str]]:
    pipe = r.pipeline(transaction=False)
    for run_id in run_ids:
        pipe.hgetall(pk.run(run_id))
    return list(pipe.execute())


def _resources(r: Any, pk: PartitionKeys, run_ids: list[str]) -> list[dict[str, str]]:
    pipe = r.pipeline(transaction=False)
    for run_id in run_ids:
        pipe.hgetall(pk.fence_resource(f"chaos:{run_id}"))
    return list(pipe.execute())


def check(
    r: Any,
    pk: PartitionKeys,
    enqueued: list[str],
    expected_fires: dict[str, list[str]],
    report: Report,
) -> Report:
    """Fill ``report`` from what Redis holds; ``expected_fires`` maps each recurring job to
    the run ids of its fire times in the window."""
    scheduled = sorted(
        key.split(":run:", 1)[1]
        for key in r.scan_iter(match=pk.run("*"), count=10_000)
        if "@" in key.split(":run:", 1)[1]
    )
    expected_recurring = sorted(rid for rids in expected_fires.values() for rid in rids)
    missing_fires = set(expected_recurring) - set(scheduled)
    extra_fires = set(scheduled) - set(expected_recurring)
    all_ids = enqueued + expected_recurring
    report.enqueued, report.recurring, report.runs = (
        len(enqueued),
        len(expected_recurring),
        len(all_ids),
    )

    records = dict(zip(all_ids, _records(r, pk, all_ids), strict=True))
    resources = dict(zip(all_ids, _resources(r, pk, all_ids), strict=True))
    effects = {k: int(v) for k, v in r.hgetall(EFFECTS).items()}
    executions = {k: int(v) for k, v in r.hgetall(EXECUTIONS).items()}
    stats = {k: int(v) for k, v in r.hgetall(pk.stats).items()}

    not_done = [rid for rid, rec in records.items() if rec.get("state") != "done"]
    report.lost = len(set(not_done) | missing_fires)
    for rid in not_done[:5]:
        report.problem(f"not done: {rid} {records[rid]}")
    for rid in sorted(missing_fires)[:5]:
        report.problem(f"fire time without a run: {rid}")

    doubles = [rid for rid in all_ids if effects.get(rid, 0) > 1]
    unexpected_effects = set(effects) - set(all_ids)
    report.duplicates = len(set(doubles) | extra_fires | unexpected_effects)
    for rid in doubles[:5]:
        report.problem(f"side effect applied {effects[rid]} times: {rid}")
    for rid in sorted(extra_fires | unexpected_effects)[:5]:
        report.problem(f"unexpected run: {rid}")

    _check_commits(records, resources, effects, stats, report)
    _check_indexes(r, pk, report)
    report.rejected_stale_commits = stats.get("rejected", 0)
    report.re_executions = sum(1 for rid in all_ids if executions.get(rid, 0) > 1)
    report.max_attempt = max((int(rec.get("attempt", 0)) for rec in records.values()), default=0)
    return report


def _check_commits(
    records: dict[str, dict[str, str]],
    resources: dict[str, dict[str, str]],
    effects: dict[str, int],
    stats: dict[str, int],
    report: Report,
) -> None:
    """One accepted commit per run, made by the holder of the run's current fence."""
    if stats.get("completed") != len(records):
        report.problem(f"stats.completed={stats.get('completed')} for {len(records)} runs")
    if stats.get("created") != len(records):
        report.problem(f"stats.created={stats.get('created')} for {len(records)} runs")
    for rid, rec in records.items():
        if rec.get("state") != "done":
            continue
        result = json.loads(rec["result"])
        fence = int(rec["fence"])
        if result["fence"] != fence:
            report.problem(f"{rid}: committed by fence {result['fence']}, current {fence}")
        res = resources[rid]
        if not res or int(res["fence"]) != fence or json.loads(res["value"]) != result:
            report.problem(f"{rid}: fenced resource {res} is not the committing attempt's")
        if effects.get(rid) != 1:
            report.problem(f"{rid}: effect applied {effects.get(rid, 0)} times")


def _check_indexes(r: Any, pk: PartitionKeys, report: Report) -> None:
    for name, key in (("due", pk.due), ("leases", pk.leases), ("dead", pk.dead)):
        left = r.zrange(key, 0, 9)
        if left:
            report.problem(f"{name} set not empty: {left}")


def fire_ids(job: str, fires_ms: Iterable[int], fmt: Any) -> list[str]:
    """Run ids of a recurring job's fire times (``fmt`` formats an instant in ms)."""
    return [f"{job}@{fmt(ms)}" for ms in fires_ms]
