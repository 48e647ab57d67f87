"""``jobqueue check``: every check, in the order they print: the servers' settings
(``health``: version, eviction, persistence, replicas, failover time, clocks, scripts), whether
every due run has a live worker that can run it (``coverage``), and the schedulers'
partitions and herds (``scheduler_checks``).

The rules themselves are pure functions of what was read (``jobqueue.policy.health`` and
``jobqueue.policy.coverage``) and stay in ``jobqueue.policy``: the layer of rules without I/O,
which the daemons' layer may use too and which tests/test_health.py and
tests/test_check_workers.py hold without a server. What reads a server lives here."""

from __future__ import annotations

from typing import TYPE_CHECKING

from jobqueue.ops import coverage, health
from jobqueue.ops.scheduler_checks import checks as scheduler_checks
from jobqueue.policy.health import Check, Limits

if TYPE_CHECKING:
    from jobqueue.client.sync import JobQueue


def run(
    jq: JobQueue, lease_s: float | None = None, create_rate: float | None = None
) -> list[Check]:
    """Every line of ``jobqueue check``: ``lease_s`` is the shortest lease in use (default: the
    app's ``Settings.default_lease_s``), ``create_rate`` the runs/s a scheduler creates while
    none has measured its own."""
    limits = Limits(lease_s=lease_s or jq.settings.default_lease_s)
    return health.run(jq, limits) + coverage.run(jq) + scheduler_checks(jq, create_rate)
