"""Every script's contract by name: the run-lifecycle scripts (``runs``), the recurring-job
scripts (``schedules``) and the operator's (``admin``). tests/test_script_contract.py checks
that it names exactly the scripts in lua/, each as its header declares it."""

from __future__ import annotations

from typing import Any

from jobqueue.store import admin, exact, flows, groups, pages, runs, schedules
from jobqueue.store.contract import Contract

CONTRACTS: dict[str, Contract[..., Any]] = {
    c.name: c for c in (*runs.CONTRACTS, *flows.CONTRACTS, *schedules.CONTRACTS, *admin.CONTRACTS,
              *pages.CONTRACTS, *groups.CONTRACTS,
              *exact.CONTRACTS)
}
