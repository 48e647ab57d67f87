"""One capacity model (issue 16): ``jobqueue capacity`` sizes masters (CPU at the top of the
period and memory, AOF's cost, the busiest master's imbalance, headroom), schedulers and worker
processes from per-run costs measured here; docs/operations.md, docs/cluster.md and
docs/guarantees.md quote exactly what it prints."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from jobqueue.cli import main
from jobqueue.policy.capacity import (
    HEADROOM,
    IMBALANCE,
    MEASURED,
    MIN_SCHEDULERS,
    CapacityInputs,
    estimate,
)

ROOT = Path(__file__).resolve().parent.parent
SIZING = CapacityInputs(jobs=5_000_000, every_s=3600)


def capacity(*args: str) -> list[str]:
    result = CliRunner().invoke(main, ["capacity", *args])
    assert result.exit_code == 0, result.output
    return result.stdout.splitlines()


def test_operations_md_prints_exactly_what_jobqueue_capacity_prints() -> None:
    text = (ROOT / "docs" / "operations.md").read_text()
    section = text.split("## Capacity planning", 1)[1]
    block = section.split("```", 2)[1].strip("\n").splitlines()
    command, printed = block[0], block[1:]
    assert command.startswith("$ jobqueue capacity ")
    assert capacity(*command.split()[3:]) == printed


def _words(page: str) -> str:
    return " ".join((ROOT / "docs" / page).read_text().split())


def test_the_docs_quote_the_models_figures_for_5_million_hourly_jobs() -> None:
    """docs/cluster.md ("Capacity") sizes the fleet and docs/guarantees.md (the memory limit)
    what finished runs keep: both quote the model's figures, each on its own page."""
    r = estimate(SIZING)
    quoted = {
        "cluster.md": [
            f"**{r.runs_per_master:,.0f} runs/s per master**",
            f"**{r.masters} masters**",
            f"memory alone, {r.memory_bytes / 1e9:.1f} GB, "
            f"would take {r.masters_by_memory} of 16 GB",
            f"P = K = {4 * r.masters}",
            f"**{r.schedulers} schedulers** "
            f"(one plans {1e6 / MEASURED.scheduler_us * HEADROOM:,.0f}",
            f"**{r.workers} worker processes**",
            f"a backlog the {r.masters} masters claim in about {r.backlog_s:.0f} s",
            f"{MEASURED.sched_us:g} us of CPU to be created by the scheduler and "
            f"{MEASURED.claim_complete_us:g} us to be claimed and completed, "
            f"x{MEASURED.aof_everysec:.2f} with AOF everysec",
        ],
        "guarantees.md": [
            f"keep {r.redis_gb_retained:.1f} GB of finished runs",
            f"about {MEASURED.bytes_pending:.0f} bytes in Redis pending and "
            f"{MEASURED.bytes_finished:.0f} finished",
            f"a recurring job {MEASURED.bytes_job:.0f} with its counters",
        ],
    }
    missing = [(page, q) for page, qs in quoted.items() for q in qs if q not in _words(page)]
    assert not missing, missing


def test_the_first_lines_stay_the_reference_arithmetic() -> None:
    lines = capacity("--jobs", "5000000", "--every", "3600", "--row-bytes", "300")
    assert lines[:4] == [
        "runs/day 120,000,000; average 1,389 runs/s",
        "if every job fires at minute 0: 5,000,000 runs in one second",
        "with jitter over 60 s: about 83,333 runs/s at the top of the period",
        "run rows/day at 300 bytes each: 36 GB",
    ]


def test_aof_raises_the_server_cpu_per_run_by_its_measured_factor() -> None:
    costs = {
        p: estimate(CapacityInputs(5_000_000, 3600, persistence=p)).us_per_run
        for p in ("none", "everysec", "always")
    }
    base = MEASURED.sched_us + MEASURED.claim_complete_us
    assert costs == {
        "none": base,
        "everysec": base * MEASURED.aof_everysec,
        "always": base * MEASURED.aof_always,
    }
    assert costs["none"] < costs["everysec"] < costs["always"]


def test_a_master_is_planned_with_headroom_and_the_busiest_masters_imbalance() -> None:
    r = estimate(SIZING)
    assert r.runs_per_master == pytest.approx(1e6 * HEADROOM / (r.us_per_run * IMBALANCE))
    assert (HEADROOM, IMBALANCE) == (0.5, 1.25)


def test_masters_are_the_larger_of_cpu_at_the_peak_and_memory() -> None:
    r = estimate(SIZING)
    assert r.masters == max(r.masters_by_cpu, r.masters_by_memory) == r.masters_by_cpu
    retained = estimate(CapacityInputs(5_000_000, 3600, retention_s=7 * 86400, jitter_window_s=600))
    assert retained.masters == retained.masters_by_memory > retained.masters_by_cpu


def test_a_wider_jitter_window_needs_fewer_masters_until_creation_decides() -> None:
    narrow = estimate(CapacityInputs(5_000_000, 3600, jitter_window_s=60))
    wide = estimate(CapacityInputs(5_000_000, 3600, jitter_window_s=600, lookahead_s=600))
    assert wide.masters_by_cpu < narrow.masters_by_cpu


def test_schedulers_are_two_at_least_and_worker_processes_follow_the_task_time() -> None:
    assert estimate(CapacityInputs(1000, 3600)).schedulers == MIN_SCHEDULERS
    noop = estimate(SIZING)
    slow = estimate(CapacityInputs(5_000_000, 3600, task_seconds=1.0, concurrency=16))
    assert slow.workers == -(-int(slow.claim_per_s) // int(16 * HEADROOM))
    assert slow.workers > noop.workers


def test_measure_uses_a_finished_runs_memory_measured_now() -> None:
    line = capacity("--jobs", "1000", "--every", "3600", "--measure")[4]
    assert re.fullmatch(r"jobqueue in Redis: [\d,]+ bytes per finished run \(measured now\); .*",
                        line), line  # fmt: skip


def test_json_carries_the_fleet_and_the_figures_used() -> None:
    result = CliRunner().invoke(main, ["capacity", "--json"])
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert data["masters"] == estimate(SIZING).masters
    assert data["used"]["claim_complete_us"] == MEASURED.claim_complete_us
