"""The one source of a scheduler's defaults: ``SchedulerConfig``. The ``Scheduler`` takes one,
``jobqueue scheduler`` builds one from its options (whose defaults are these), and ``jobqueue
check`` reads the lookahead and creation-rate defaults from here."""

from __future__ import annotations

from dataclasses import dataclass

from jobqueue.policy.misfire import DEFAULT_MISFIRE_GRACE_MS

DEFAULT_LOOKAHEAD_MS = 60_000
DEFAULT_BATCH = 1000
DEFAULT_INTERVAL_S = 1.0
# Fire times one job may create in one tick (a 1 ms interval with a 60 s lookahead would
# otherwise make 60,000); the rest follow in the next ticks.
MAX_FIRES_PER_TICK = 1000
# How long a scheduler's lease on a scheduler partition lasts without renewal.
DEFAULT_PARTITION_LEASE_S = 5.0
# The lookahead grows (up to --max-lookahead, by default this many times --lookahead) so that
# the jobs firing within it can be created before their fire time: jobs due within
# max_lookahead / creation rate x the margin.
MAX_LOOKAHEAD_FACTOR = 10
LOOKAHEAD_MARGIN = 1.5
# Runs/s assumed before this scheduler measured its own (--create-rate): a conservative
# share of what one scheduler process measured here against one Redis (bench/scheduler.py;
# its sittings: docs/performance.md).
DEFAULT_CREATE_RATE = 20_000.0


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """How one scheduler runs; the fields are the ``jobqueue scheduler`` options (seconds).

    ``lookahead``: runs are created up to this long before their fire time. ``interval``:
    seconds between ticks. ``misfire_grace``: a fire time later than this is a misfire (never
    below two intervals, see ``misfire.effective_misfire_grace_ms``). ``batch``: due jobs read
    per call;
    ``max_fires``: fire times one job may create in one tick. ``partitions``: the scheduler
    partition count K this process expects (None: as recorded, else
    $JOBQUEUE_SCHED_PARTITIONS, else the default). ``partition_lease``: how long its lease on
    each scheduler partition it owns lasts without renewal. ``max_lookahead``: how far the
    lookahead may grow so that a herd is created before its fire time (None:
    MAX_LOOKAHEAD_FACTOR x ``lookahead``), at the creation rate the scheduler measures
    (``create_rate`` runs/s until it has measured one). ``prune``: at start, remove the
    schedules declared in code that are no longer declared."""

    lookahead: float = DEFAULT_LOOKAHEAD_MS / 1000
    interval: float = DEFAULT_INTERVAL_S
    misfire_grace: float = DEFAULT_MISFIRE_GRACE_MS / 1000
    batch: int = DEFAULT_BATCH
    max_fires: int = MAX_FIRES_PER_TICK
    partitions: int | None = None
    partition_lease: float = DEFAULT_PARTITION_LEASE_S
    max_lookahead: float | None = None
    create_rate: float = DEFAULT_CREATE_RATE
    prune: bool = False

    def __post_init__(self) -> None:
        if (
            self.lookahead < 0
            or self.interval <= 0
            or self.misfire_grace < 0
            or self.batch < 1
            or self.max_fires < 1
        ):
            raise ValueError(
                "lookahead and misfire_grace >= 0, interval > 0, batch and max_fires >= 1"
            )
        if not self.partition_lease > 0 or not self.create_rate > 0:
            raise ValueError("partition_lease > 0 and create_rate > 0")
        if self.max_lookahead is not None and self.max_lookahead < 0:
            raise ValueError("max_lookahead >= 0")

    @property
    def lookahead_ms(self) -> int:
        return int(self.lookahead * 1000)

    @property
    def max_lookahead_ms(self) -> int:
        """Never below the lookahead; MAX_LOOKAHEAD_FACTOR x it when not set."""
        most = MAX_LOOKAHEAD_FACTOR * self.lookahead if self.max_lookahead is None else (
            self.max_lookahead
        )
        return max(self.lookahead_ms, int(most * 1000))

    @property
    def partition_lease_ms(self) -> int:
        return int(self.partition_lease * 1000)
