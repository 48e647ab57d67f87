"""How far ahead of their fire time a scheduler creates runs: --lookahead, grown up to
--max-lookahead for a herd too big to be created within it at the creation rate this scheduler
measures (--create-rate until it has measured one)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from jobqueue.recurring.config import LOOKAHEAD_MARGIN, SchedulerConfig
from jobqueue.recurring.steps import due_count_steps
from jobqueue.store.keys import SchedKeys

if TYPE_CHECKING:
    from jobqueue.client.sync import JobQueue

# A partition's drain counts as a measurement of the creation rate from this many runs on.
RATE_SAMPLE_RUNS = 1000


class Lookahead:
    """One scheduler's lookahead: ``effective_ms`` is this tick's, set by :meth:`plan`."""

    def __init__(self, config: SchedulerConfig) -> None:
        self.base_ms = config.lookahead_ms
        self.max_ms = config.max_lookahead_ms
        self.effective_ms = self.base_ms
        self.interval_ms = int(config.interval * 1000)
        self.assumed_rate = config.create_rate
        self.rate: float | None = None  # runs/s measured

    def registry_info(self) -> dict[str, Any]:
        """What the registry shows of this scheduler besides its partitions."""
        return {
            "lookahead_ms": self.effective_ms,
            "base_lookahead_ms": self.base_ms,
            "max_lookahead_ms": self.max_ms,
            "interval_ms": self.interval_ms,
            "rate": None if self.rate is None else round(self.rate),
        }

    def lookahead_for(self, jobs_ahead: int) -> int:
        """The lookahead (ms) that lets this scheduler create ``jobs_ahead`` runs (the jobs
        of its partitions firing within --max-lookahead) before they fire: the time that
        takes at its creation rate, with a margin, never below --lookahead nor above
        --max-lookahead. A top-of-hour herd of 5,000,000 at 46,000 runs/s needs ~109 s:
        its creation then starts ~163 s before the hour instead of 60 s."""
        rate = self.rate or self.assumed_rate
        needed = int(jobs_ahead / rate * LOOKAHEAD_MARGIN * 1000)
        return min(self.max_ms, max(self.base_ms, needed))

    def plan(self, jq: JobQueue, keys: Sequence[SchedKeys], now_ms: int) -> None:
        """Set this tick's lookahead from the jobs of ``keys`` firing within --max-lookahead
        (one ZCOUNT per partition)."""
        if self.max_ms <= self.base_ms or not keys:
            self.effective_ms = self.base_ms
            return
        ahead = jq.run_steps(due_count_steps(keys, now_ms + self.max_ms))
        self.effective_ms = self.lookahead_for(ahead)

    def measure(self, runs: int, seconds: float) -> bool:
        """Count a partition's drain of ``runs`` in ``seconds`` toward the creation rate;
        whether it counted (enough runs to be a measurement)."""
        if runs < RATE_SAMPLE_RUNS:
            return False
        sample = runs / max(seconds, 1e-6)
        self.rate = sample if self.rate is None else 0.5 * self.rate + 0.5 * sample
        return True
