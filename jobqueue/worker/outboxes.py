"""The upkeep of the workflow outboxes of the partitions a worker serves, run by its
committer on a thread: every RELAY_SWEEP_S the outboxes holding entries are relayed (runs
buried by a claim, handed back to death, or left by a relay that failed), and every
Settings.flow_audit_s the waiting runs are audited for outcomes they never heard of, the
staged workflows whose creator died are settled, and the flows index is tidied."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from jobqueue.client.relay import (
    audit_waiting_steps,
    relay_until_quiet,
    settle_staged_steps,
    tidy_flows_steps,
)
from jobqueue.client.sync import JobQueue
from jobqueue.runtime.clock import Clock
from jobqueue.store.io import Steps, cmd, commands
from jobqueue.store.keys import PartitionKeys

log = logging.getLogger("jobqueue.worker")

# How often the outboxes of the served partitions are looked at (workflows, see
# jobqueue.client.relay): what a commit did not relay at once waits this long at most.
RELAY_SWEEP_S = 2.0
# Chunks (of jobqueue.client.relay.AUDIT_RUNS waiting runs) a worker's audit reads per
# partition and period at most: 2,000 waiting runs; a longer index takes more periods.
AUDIT_CHUNKS = 40


def outbox_sizes_steps(partitions: Sequence[PartitionKeys]) -> Steps[list[Any]]:
    """Each partition's outbox length, in one round trip; an error in place of a length
    whose key could not be read (its master down: that partition waits for the next sweep)."""
    if not partitions:
        return []
    return list((yield commands(*(cmd("zcard", keys.outbox) for keys in partitions))))


class OutboxUpkeep:
    def __init__(self, jq: JobQueue, clock: Clock) -> None:
        self._jq = jq
        self._clock = clock
        self.partitions: list[PartitionKeys] = []
        self._next_sweep = 0.0
        self._next_audit = 0.0
        # Where each partition's audits go on from (a rank, going round the index).
        self._audit_from: dict[PartitionKeys, int] = {}
        self._staged_from: dict[PartitionKeys, int] = {}

    def until_due(self) -> float | None:
        """Seconds until the next sweep (0 when due), or None with no partition served."""
        if not self.partitions:
            return None
        return max(self._next_sweep - self._clock.monotonic(), 0.0)

    def due(self) -> bool:
        """Whether a sweep is due now; if so, the next is RELAY_SWEEP_S from now."""
        if not self.partitions or self._clock.monotonic() < self._next_sweep:
            return False
        self._next_sweep = self._clock.monotonic() + RELAY_SWEEP_S
        return True

    def relay(self, keys: PartitionKeys) -> None:
        try:
            relay_until_quiet(self._jq, keys)
        except Exception as exc:  # (the sweep tries again)
            log.warning("relaying the outbox of %s failed for now: %s", keys.tag, exc)

    def sweep(self) -> None:
        """On a thread: relay the served partitions whose outboxes hold entries (one
        pipelined read), and now and then audit them."""
        try:
            sizes = self._jq.run_steps(outbox_sizes_steps(self.partitions))
        except Exception as exc:
            log.warning("reading the outboxes failed for now: %s", exc)
            return
        for keys, size in zip(self.partitions, sizes, strict=True):
            if isinstance(size, int) and size > 0:
                self.relay(keys)
        if self._clock.monotonic() >= self._next_audit:  # (the first sweep too)
            every = self._jq.settings.flow_audit_s
            self._next_audit = self._clock.monotonic() + every
            self._audit(round(every * 1000))

    def _audit(self, min_age_ms: int) -> None:
        """Outcomes the waiting runs never heard of (audit_waiting_steps), and the flows
        whose records all expired (tidy_flows_steps)."""
        for keys in self.partitions:
            try:
                start = self._audit_from.get(keys, 0)
                for _ in range(AUDIT_CHUNKS):  # round the index, a chunk at a time
                    start, _ = self._jq.run_steps(
                        audit_waiting_steps(self._jq, keys, start, min_age_ms)
                    )
                    if start == 0:
                        break
                self._audit_from[keys] = start
            except Exception as exc:  # (one partition's trouble: the others go on)
                log.warning("auditing the waiting runs of %s failed for now: %s", keys.tag, exc)
            try:  # workflows whose creator died between their staging and their release
                stage_ms = round(self._jq.settings.flow_stage_timeout_s * 1000)
                start = self._staged_from.get(keys, 0)
                self._staged_from[keys] = self._jq.run_steps(
                    settle_staged_steps(self._jq, keys, stage_ms, start)
                )[0]
            except Exception as exc:
                log.warning("settling the staged workflows of %s failed for now: %s",
                            keys.tag, exc)
        try:
            self._jq.run_steps(tidy_flows_steps(self._jq, self.partitions))
        except Exception as exc:
            log.warning("tidying the flows index failed for now: %s", exc)
