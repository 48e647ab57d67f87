"""Key names: one Redis Cluster hash tag per queue partition, so every script touches one slot.

Layout (``{q#p}`` is the hash tag of partition p of queue q):

    jq:{q#p}:run:<run_id>   hash   the run record (fields at their default are not stored)
    jq:{q#p}:hist:<run_id>  list   notable events the record cannot show (capped; the
                                   record's 'hist' field says it exists)
    jq:{q#p}:due            zset   run_id -> due time (ms): the claimable queue
    jq:{q#p}:leases         zset   run_id -> lease expiry (ms): what is running
    jq:{q#p}:dead           zset   run_id -> time it died
    jq:{q#p}:done           zset   run_id -> finish time (done, cancelled); trimmed by retention
    jq:{q#p}:wake           list   wake tokens for idle workers
    jq:{q#p}:fences         string the last fence issued in the partition
    jq:{q#p}:orphans        zset   run_id -> when its index entry was found without a record
    jq:{q#p}:stats          hash   counters (created, claimed, completed, failed, ...)
    jq:{q#p}:stats:from:<s> hash   counters of a removed partition s being folded in (a
                                   repartition in progress; short-lived)
    jq:queues               hash   queue name -> partition count (global, plain commands only)
    jq:queues:moving        hash   queue -> target count while a repartition is in progress
    jq:workers              hash   worker id -> registry entry (global)

Recurring jobs have their own partitions (``jq:{sched#k}:...``, ``SchedKeys``; see
``jobqueue/schedules/recurring.py``), and their runs have the run ids of ``fire_run_id``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property, lru_cache

from jobqueue.errors import ConfigError, InvalidRunId
from jobqueue.policy.cron import format_fire_instant
from jobqueue.policy.hashing import fnv1a_32

QUEUES_KEY = "jq:queues"
WORKERS_KEY = "jq:workers"

# The most partitions a queue (or the recurring-job store) may have: Redis Cluster's slot
# count, past which more partitions cannot spread anything further, and what `jobqueue
# repartition` has always allowed. A stored count above it is foreign data: reported, never
# iterated (a count of 99999999 made every listing loop for minutes).
MAX_PARTITIONS = 16384

# Matched whole (fullmatch): with match() and '$', "q\n" passed ('$' matches before a final
# newline) and wrote keys no command could address.
_QUEUE_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
MAX_RUN_ID_LENGTH = 512


def validate_queue_name(name: str) -> str:
    if not isinstance(name, str) or not _QUEUE_NAME.fullmatch(name):
        raise ConfigError(f"invalid queue name {name!r}: use 1-64 letters, digits, '_', '.' or '-'")
    return name


def validate_partition_count(count: int, what: str) -> int:
    """A partition count given in code or on the command line: 1 to MAX_PARTITIONS."""
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_PARTITIONS:
        raise ConfigError(f"{what}: partitions must be an integer from 1 to {MAX_PARTITIONS}")
    return count


def parse_partition_count(stored: object) -> int | None:
    """A partition count as read from Redis, or None when it is not one jobqueue could have
    written (not a decimal integer from 1 to MAX_PARTITIONS)."""
    if isinstance(stored, str) and stored.isascii() and stored.isdigit() and len(stored) <= 5:
        count = int(stored)
        if 1 <= count <= MAX_PARTITIONS:
            return count
    return None


def bad_count(stored: object) -> str:
    """What is wrong with a stored partition count ``parse_partition_count`` refused."""
    return f"partition count {stored!r} is not an integer from 1 to {MAX_PARTITIONS}"


def validate_run_id(run_id: str) -> str:
    """Run ids are free text (idempotency keys), within limits that keep keys sane."""
    if not isinstance(run_id, str) or not run_id:
        raise InvalidRunId("run id must be a non-empty string")
    if len(run_id) > MAX_RUN_ID_LENGTH:
        raise InvalidRunId(f"run id is {len(run_id)} characters; the limit is {MAX_RUN_ID_LENGTH}")
    if _CONTROL.search(run_id):
        raise InvalidRunId(f"run id {run_id!r} contains control characters")
    if not run_id.isascii():
        try:
            run_id.encode()
        except UnicodeEncodeError:
            # A lone surrogate (e.g. from a non-UTF-8 byte in argv) has no UTF-8 form: the
            # client would fail to send it, or store '?' and merge it with another id.
            raise InvalidRunId(f"run id {run_id!r} is not valid Unicode text") from None
    return run_id


@lru_cache(maxsize=4096)
def fire_instant(fire_ms: int) -> str:
    """A fire time as run ids spell it (cached: a tick builds the runs of a few instants)."""
    return format_fire_instant(fire_ms)


def fire_run_id(job_id: str, fire_ms: int, *, manual: bool = False) -> str:
    """The run id of a recurring job's fire: ``<job_id>@<fire instant in UTC>``, e.g.
    ``nightly-report@2026-11-29T06:30:00Z``; one spelling per instant, so every scheduler
    builds the same id. ``manual``: a run fired by hand (``schedules trigger``) at that
    instant, ``<job_id>@manual-<instant>``, which no scheduled fire can take.

    The only place a fire's run id is built: sched_create.lua joins the job id and the
    instant with the prelude's ``fire_run_id``, which tests/test_script_prelude.py checks
    against this function."""
    return f"{job_id}@{'manual-' if manual else ''}{fire_instant(fire_ms)}"


def partition_key(run_id: str) -> str:
    """What decides a run's partition: the job id, i.e. the part before the last '@'.

    Scheduled runs are ``<job_id>@<fire time>``, so all runs of one job share a slot; a run id
    without '@' is its own job.
    """
    job, sep, _ = run_id.rpartition("@")
    return job if sep and job else run_id


def partition_of(run_id: str, partitions: int) -> int:
    if partitions <= 1:
        return 0
    return fnv1a_32(partition_key(run_id)) % partitions


@dataclass(frozen=True)
class PartitionKeys:
    """The keys of one queue partition; every name carries the same hash tag. The names are
    built once per instance (clients keep one instance per partition)."""

    queue: str
    partition: int

    def __hash__(self) -> int:
        # Hashed per run on the worker's paths (dict keys): computed once per instance.
        return self._hash

    @cached_property
    def _hash(self) -> int:
        return hash((self.queue, self.partition))

    @cached_property
    def prefix(self) -> str:
        return f"jq:{{{self.queue}#{self.partition}}}:"

    @cached_property
    def due(self) -> str:
        return self.prefix + "due"

    @cached_property
    def leases(self) -> str:
        return self.prefix + "leases"

    @cached_property
    def dead(self) -> str:
        return self.prefix + "dead"

    @cached_property
    def fences(self) -> str:
        """The last fence issued in this partition: every claim or cancel issues a greater one,
        so a run id created again after its record expired never reuses an old fence."""
        return self.prefix + "fences"

    @cached_property
    def orphans(self) -> str:
        """Index entries found without their record (a Redis Cluster slot being imported):
        kept until the record appears (see claim.lua)."""
        return self.prefix + "orphans"

    @cached_property
    def done(self) -> str:
        return self.prefix + "done"

    @cached_property
    def wake(self) -> str:
        return self.prefix + "wake"

    @cached_property
    def stats(self) -> str:
        return self.prefix + "stats"

    def run(self, run_id: str) -> str:
        return self.prefix + "run:" + run_id

    def history(self, run_id: str) -> str:
        return self.prefix + "hist:" + run_id

    def fence_resource(self, name: str) -> str:
        return self.prefix + "fenced:" + name


def partition_keys(queue: str, partitions: int, run_id: str) -> PartitionKeys:
    return PartitionKeys(queue, partition_of(run_id, partitions))


@dataclass(frozen=True)
class SchedKeys:
    """The keys of one scheduler partition; every name carries the same hash tag."""

    partition: int

    @property
    def prefix(self) -> str:
        return f"jq:{{sched#{self.partition}}}:"

    @property
    def defs(self) -> str:
        return self.prefix + "def"

    @property
    def next(self) -> str:
        return self.prefix + "next"

    @property
    def state(self) -> str:
        return self.prefix + "state"

    @property
    def held(self) -> str:
        """buffer-one: job_id -> 'held_fire predecessor_fire' while its run waits."""
        return self.prefix + "held"
