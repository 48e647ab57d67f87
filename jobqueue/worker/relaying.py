"""The worker's fast path for workflow completions: the deliveries of what it committed
(jobqueue.client.relay), carried in its next commit's round trip instead of two round trips
of their own.

A completion that runs wait on (complete.lua answers with the record's 'parents' and its
outbox entry's version) becomes a unit: first its deliveries (deliver.lua in each waiting
run's partition), then, once every one of them was taken, the clearing of its outbox entry
(relayed.lua at that version). Each step rides along with the next commit (commit k+1 carries
the deliveries of commit k and the clearing of commit k-1): never before what it depends on
was answered, so the order of the slow path is kept. When no more commits are queued the
deliveries are sent at once (``flush``), so an idle worker delivers right after its commit;
the clearings wait for the next round trip (a commit, or the commit thread's next wake-up,
before its sweep reads the outboxes), and a closing worker sends everything.

A unit whose delivery a lost connection failed is dropped: its outbox entry stays, and a
relay (the sweep of a worker serving the partition) delivers it again; a delivery made twice
changes nothing. One that Redis refused (a waiting run's foreign data refuses its partition's
whole call) goes the slow way at once, one delivery at a time, so that the others do not
wait for it."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from jobqueue.client.relay import (
    Committed,
    deliver_call,
    plan_deliveries,
    relay_committed_steps,
    relay_until_quiet,
)
from jobqueue.client.sync import JobQueue
from jobqueue.errors import ConnectionFailed
from jobqueue.store.flows import DELIVER, RELAYED, Delivery
from jobqueue.store.keys import PartitionKeys
from jobqueue.store.scripts import Call

log = logging.getLogger("jobqueue.workflows")


@dataclass
class _Unit:
    committed: Sequence[Committed]
    deliveries: dict[PartitionKeys, list[Delivery]]
    entries: dict[PartitionKeys, list[tuple[str, float, int | None]]]  # entries to clear
    delivered: bool = False  # deliver answered: the clearing goes next
    calls: list[Call] = field(default_factory=list)  # what this unit has in flight


class CommitRelay:
    """The units of one worker's commit thread (not thread-safe: that thread alone)."""

    def __init__(self, jq: JobQueue) -> None:
        self._jq = jq
        self._units: list[_Unit] = []
        self.relayed = 0  # dependencies counted (tests, logs)

    def add(self, committed: Sequence[Committed]) -> None:
        deliveries = self._jq.run_steps(plan_deliveries(self._jq, committed))
        entries: dict[PartitionKeys, list[tuple[str, float, int | None]]] = {}
        for c in committed:
            entries.setdefault(c.keys, []).append((c.run_id, c.version, c.told))
        self._units.append(_Unit(committed, deliveries, entries, delivered=not deliveries))

    @property
    def pending(self) -> bool:
        return bool(self._units)

    def calls(self) -> list[Call]:
        """The next step of every unit, to send in this round trip (then ``answer``)."""
        s = self._jq.settings
        out: list[Call] = []
        for u in self._units:
            if u.delivered:
                u.calls = [RELAYED.call(pk, es, s.done_retention_ms, s.dead_retention_ms)
                           for pk, es in u.entries.items()]
            else:
                u.calls = [deliver_call(self._jq, pk, ds) for pk, ds in u.deliveries.items()]
            out += u.calls
        return out

    def answer(self, replies: Sequence[Any]) -> None:
        """The replies to ``calls()``, in its order: each unit goes on, ends or is dropped.
        A partition where a waiting run died or was cancelled is relayed at once (its cascade)."""
        at, kept, finished = 0, [], set()
        for u in self._units:
            mine, at = replies[at:at + len(u.calls)], at + len(u.calls)
            failed = [r for r in mine if isinstance(r, Exception)]
            if u.delivered:
                if failed:  # (the sweep clears them: delivering again changes nothing)
                    log.debug("clearing relayed outbox entries failed for now: %s", failed[0])
                continue
            if any(isinstance(r, ConnectionFailed) for r in failed):
                log.warning("delivering %d completions failed for now (%s); their outbox "
                            "entries stay for the relay", len(u.committed), failed[0])
                continue
            if failed:  # refused (a waiting run's foreign data): one delivery at a time
                self._jq.run_steps(relay_committed_steps(self._jq, u.committed))
                continue
            for pk, reply in zip(u.deliveries, mine, strict=True):
                got = DELIVER.parse(reply)
                self.relayed += sum(got.counted)
                if got.finished:
                    finished.add(pk)
            u.delivered = True
            kept.append(u)
        self._units = kept
        for pk in finished:
            relay_until_quiet(self._jq, pk)

    def flush(self, *, clearing: bool = True) -> None:
        """Send what is carried (a round trip per step) until nothing is, or with
        ``clearing=False`` until every delivery is made: the clearings, which only tidy
        (an entry left is delivered again, changing nothing), then ride with the next."""
        while any(not u.delivered for u in self._units) or (clearing and self._units):
            self.answer(self._jq.scripts.run_each(self.calls()))
