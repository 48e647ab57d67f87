"""The definitions store on a sync connection (``jq.recurring``): the steps of
``jobqueue.recurring.steps`` driven there, and the start-up sync of the declarations in code."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TypeVar

from jobqueue.recurring.definitions import DECLARED_KEY, ORIGIN_CODE, Definition, _str
from jobqueue.recurring.info import ScheduleInfo
from jobqueue.recurring.steps import RecurringSteps, RuntimeOwned
from jobqueue.store.io import (
    Steps,
    checked_commands,
    cmd,
    run_steps,
)
from jobqueue.store.keys import (
    SchedKeys,
)
from jobqueue.store.scripts import ScriptRunner

T = TypeVar("T")

class SyncConnection(Protocol):
    """What :class:`Recurring` runs its operations on (a connected JobQueue)."""

    @property
    def redis(self) -> Any: ...

    @property
    def scripts(self) -> ScriptRunner: ...


@dataclass
class SyncReport:
    """What :meth:`Recurring.sync` did, by job id."""

    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    # Declared in code under the id of a schedule added at run time: left as it is.
    ignored: list[str] = field(default_factory=list)


class Recurring(RecurringSteps):
    """The definitions store on a sync connection (``jq.recurring``; the scheduler daemon's
    and the CLI's): each method runs the operation of the same name ``..._steps``."""

    def __init__(self, conn: SyncConnection, partitions: int | None = None) -> None:
        super().__init__(partitions)
        self.conn = conn

    def topology_client(self) -> Any:
        return self.conn.redis  # connected at first use, not when the client is made

    def run(self, steps: Steps[T]) -> T:
        return run_steps(steps, self.conn.redis, self.conn.scripts)

    @property
    def partitions(self) -> int:
        """K as recorded, else as configured: reads, never writes (see
        :meth:`record_partitions`)."""
        return self.read_partitions()

    def record_partitions(self) -> int:
        return self.run(self.record_partitions_steps())

    def read_partitions(self) -> int:
        return self.run(self.read_partitions_steps())

    def keys(self, job_id: str) -> SchedKeys:
        return self.run(self.keys_steps(job_id))

    def all_keys(self) -> list[SchedKeys]:
        return self.run(self.all_keys_steps())

    def get(self, job_id: str) -> ScheduleInfo | None:
        return self.run(self.get_steps(job_id))

    def sync(
        self, declared: Sequence[Definition], prune: bool = False, now: int | None = None
    ) -> SyncReport:
        """Write the code-declared definitions (upsert: an unchanged one is not written at all,
        so its next fire stays; a changed one applies from its next fire), and with ``prune``
        remove the code-declared ones no longer declared. Schedules added at run time
        (``jq.schedule``, the CLI) are never pruned, nor replaced by a declaration with the
        same id: that declaration is left out (``report.ignored``). The scheduler daemon's
        (sync) start-up step."""
        report = SyncReport()
        names = {d.job_id for d in declared}
        for defn in declared:
            info = self.get(defn.job_id)
            if info is not None and info.definition.origin != ORIGIN_CODE:
                report.ignored.append(defn.job_id)
                continue
            if info is not None and replace(defn, paused=info.definition.paused).to_json() == (
                info.definition.to_json()
            ):
                report.unchanged.append(defn.job_id)
            else:
                try:
                    self.run(self.upsert_steps(defn, now, code=True))
                except RuntimeOwned:  # jq.schedule took the id between the read and the write
                    report.ignored.append(defn.job_id)
                    continue
                (report.created if info is None else report.updated).append(defn.job_id)
            # After the write: a crash in between leaves a definition prune never sees (safe).
            self.run(checked_commands(cmd("sadd", DECLARED_KEY, defn.job_id)))
        if prune:
            (members,) = self.run(checked_commands(cmd("smembers", DECLARED_KEY)))
            for job_id in sorted(_str(j) or "" for j in members):
                if job_id not in names:
                    if self.run(self.remove_declared_steps(job_id)):
                        report.removed.append(job_id)
                    self.run(checked_commands(cmd("srem", DECLARED_KEY, job_id)))
        return report
