"""Key names: one Redis Cluster hash tag per queue partition, so every script touches one slot.

Layout (``{q#p}`` is the hash tag of partition p of queue q, see Placement below):

    jq:{q#p}:run:<run_id>   hash   the run record (fields at their default are not stored)
    jq:{q#p}:hist:<run_id>  list   notable events the record cannot show (capped; the
                                   record's 'hist' field says it exists)
    jq:{q#p}:due            zset   run_id -> due time (ms): the claimable queue
    jq:{q#p}:prio           zset   run_id -> (9 - priority) * 2^43 + due time: the runs above
                                   the default priority, for claim to take first (a hint
                                   next to the due set, which stays the index of pending runs)
    jq:{q#p}:leases         zset   run_id -> lease expiry (ms): what is running
    jq:{q#p}:dead           zset   run_id -> time it died
    jq:{q#p}:done           zset   run_id -> finish time (done, cancelled); trimmed by retention
    jq:{q#p}:wake           list   wake tokens for idle workers
    jq:{q#p}:fences         string the last fence issued in the partition
    jq:{q#p}:orphans        zset   run_id -> when its index entry was found without a record
    jq:{q#p}:paused         string when the queue was paused (ms); absent while it runs
    jq:{q#p}:limits         hash   flow limits: concurrency (the most runs running at once),
                                   rate ('N W': at most N claims in any W ms), key_concurrency,
                                   key_rate and task:<name> (per key and per task; task_caps
                                   counts the task:<name> fields)
    jq:{q#p}:held:<group>   set    the occupants of a per-key ('key:<limit_key>') or per-task
                                   ('task:<name>') cap's slots: the run ids taking a slot (the
                                   key name, like the record's 'held' field that names a run's
                                   groups, is historical: old and new code share them)
    jq:{q#p}:parked:<group> zset   run_id -> original due time: runs waiting for a slot
    jq:{q#p}:parked         zset   run_id -> original due time: every run parked by a full cap
    jq:{q#p}:krate:<key>    zset   fence -> claim time: the claims of a per-key rate's window
    jq:{q#p}:claims         zset   fence -> claim time: the claims of a rate limit's window
    jq:{q#p}:dedupe:<key>   string the run id that owns a deduplication key (dedupe.lua)
    jq:{q#p}:stats          hash   counters (created, claimed, completed, failed, ...)
    jq:{q#p}:waiting        zset   run_id -> creation time: workflow runs waiting for their
                                   dependencies (not in due: nobody claims them)
    jq:{q#p}:deps:<run_id>  hash   a waiting run's dependencies -> '<index>|<policy>|<queue>'
    jq:{q#p}:got:<run_id>   hash   the dependencies it heard of -> their outcome
    jq:{q#p}:outbox         zset   finished runs whose parents must hear, and '!<run_id>'
                                   orders to cancel a dead waiting run's dependencies
    jq:{q#p}:flows          zset   flow_id -> when its first run here was created: the
                                   workflows and batches with runs in the partition
    jq:{q#p}:flow:<flow_id> set    the run ids of that flow in the partition (flow_create;
                                   flow_tidy.lua forgets both once every record expired)
    jq:{q#p}:staged         zset   run_id -> creation time: the runs written staged by an
                                   attempt to create a workflow not committed yet (the
                                   workers' audit settles those whose creator died)
    jq:{q#p}:flowmark:<flow_id> string  the commit of a flow whose home run is here: the
                                   nonce of the attempt that created it (flow_commit.lua),
                                   kept longer than its records
    jq:{q#p}:flows_tidy     hash   flow_tidy.lua's place: '' -> where it goes on (a rank in
                                   flows), flow_id -> a run of it found alive
    jq:{q#p}:events         stream what happened to the partition's runs, an entry per transition
                                   (written by the script that made it; trimmed by length
                                   and age, see jobqueue/store/events.py)
    jq:{q#p}:events:conf    hash   the event log's settings: off, maxlen, age_ms (absent:
                                   the defaults)
    jq:{q#p}:stats:from:<s> hash   counters of a removed partition s being folded in (a
                                   repartition in progress; short-lived)
    jq:queues               hash   queue name -> partition count, and its placement: '16'
                                   (the tags {q#p}) or '16 spread' (global, plain commands)
    jq:queues:moving        hash   queue -> target count while a repartition is in progress
    jq:workers              hash   worker id -> registry entry (global)
    jq:gauges:m:<queue>     hash   the dashboards' minute points of the queue's gauges: slot
                                   (minute % 60) -> JSON {t, due, running, late_ms}; at most
                                   60 fields, expires an hour after its last write
    jq:gauges:h:<queue>     hash   the same per hour (slot: hour % 168, each gauge the
                                   largest of the hour's minute points); at most 168 fields,
                                   expires a week after its last write
    jq:gauges:sampled:<minute>  string  the dashboard that samples that minute (SET NX;
                                   expires after 2 minutes): one sampler per minute

Recurring jobs have their own partitions (``jq:{sched#k}:...``, ``SchedKeys``; see
``jobqueue/recurring/definitions.py``), and their runs have the run ids of ``fire_run_id``.

Placement. A tag's slot is CRC16(tag) % 16384, so the plain tags ``{q#p}`` land where the hash
puts them: 16 partitions over 3 masters could land 7/5/4. A queue recorded as ``spread`` (every
queue created since placement existed) has the tags ``{q#p~xyz}`` for p >= 1 instead: the
3-character suffix is chosen so that partition p of P lands on slot
``(CRC16(q#0) + p * 16384 // P) % 16384``, evenly spaced from where ``{q#0}`` lands, so
P = 4 x masters puts 4 on each master of a cluster whose masters serve equal contiguous slot
ranges (redis-cli's layout).
The suffix comes from a table built once (CRC16 is linear: CRC16(tag + suffix) =
CRC16(tag + 3 zero bytes) XOR CRC16(suffix), so one suffix per 14-bit value serves every tag).
A queue recorded with a count only keeps the tags earlier versions wrote; ``jobqueue
repartition`` moves its runs to the spread tags. One partition needs no spreading: P = 1
always uses ``{q#0}``. Scheduler partitions are placed the same way (``recurring.py``).
"""

from __future__ import annotations

import re
import string
from binascii import crc_hqx
from dataclasses import dataclass
from functools import cache, cached_property, lru_cache

from jobqueue.errors import ConfigError, InvalidRunId
from jobqueue.policy.cron import format_fire_instant
from jobqueue.policy.hashing import fnv1a_32

QUEUES_KEY = "jq:queues"
WORKERS_KEY = "jq:workers"
# The dashboards' history of queue gauges (jobqueue.ops.gauges): plain single-key
# commands, so each key may sit on any slot of a cluster.
GAUGES_PREFIX = "jq:gauges:"
# worker id -> the server time (ms) from which its registry entry may be pruned: its last
# heartbeat plus PRUNE_AFTER_BEATS of its beats (a worker killed without withdrawing)
WORKERS_SEEN_KEY = "jq:workers:seen"

# The most partitions a queue (or the recurring-job store) may have: Redis Cluster's slot
# count, past which more partitions cannot spread anything further, and what `jobqueue
# repartition` has always allowed. A stored count above it is foreign data: reported, never
# iterated (a count of 99999999 made every listing loop for minutes).
MAX_PARTITIONS = 16384
SLOTS = 16384
# The placement a queue (or the scheduler store) records after its count: '<count> spread'.
SPREAD = "spread"

# Matched whole (fullmatch): with match() and '$', "q\n" passed ('$' matches before a final
# newline) and wrote keys no command could address.
_QUEUE_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
MAX_RUN_ID_LENGTH = 512


def gauges_key(queue: str, resolution: str) -> str:
    """A queue's gauge points at one resolution ('m': minutes, 'h': hours)."""
    return f"{GAUGES_PREFIX}{resolution}:{queue}"


def gauges_claim_key(minute: int) -> str:
    """Taken (SET NX) by the one dashboard that samples minute ``minute`` (ms // 60000)."""
    return f"{GAUGES_PREFIX}sampled:{minute}"


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


def parse_placement(stored: object) -> tuple[int, bool] | None:
    """A recorded partition count with its placement: (count, spread), or None when it is not
    one jobqueue could have written ('<count>' or '<count> spread')."""
    if isinstance(stored, str):
        text, _, placement = stored.partition(" ")
        count = parse_partition_count(text)
        if count is not None and placement in ("", SPREAD):
            return count, placement == SPREAD
    return None


def placement_record(count: int, spread: bool) -> str:
    """What ``parse_placement`` reads back; one partition has nothing to spread."""
    return f"{count} {SPREAD}" if spread and count > 1 else str(count)


def bad_count(stored: object) -> str:
    """What is wrong with a stored partition count ``parse_partition_count`` refused."""
    return f"partition count {stored!r} is not an integer from 1 to {MAX_PARTITIONS}"


# -- placement ---------------------------------------------------------------------------------

_SUFFIX_ALPHABET = string.digits + string.ascii_letters


def crc16(data: bytes) -> int:
    """Redis Cluster's CRC16 (XMODEM)."""
    return crc_hqx(data, 0)


def key_slot(key: str) -> int:
    """The Redis Cluster slot of a key: CRC16 of its hash tag (or of the whole key)."""
    data = key.encode()
    start = data.find(b"{")
    if start > -1:
        end = data.find(b"}", start + 1)
        if end > start + 1:
            data = data[start + 1 : end]
    return crc16(data) % SLOTS


@cache
def _suffixes() -> tuple[str, ...]:
    """For each slot value v (14 bits), a 3-character suffix s with CRC16(s) % 16384 == v.
    By linearity CRC16(abc) = CRC16(a\\0\\0) ^ CRC16(b\\0) ^ CRC16(c); the 238,328 strings
    of the alphabet cover all 16,384 values (about 20 ms, once)."""
    one = [(c, crc16(c.encode())) for c in _SUFFIX_ALPHABET]
    two = [(c, crc16(c.encode() + b"\0")) for c in _SUFFIX_ALPHABET]
    three = [(c, crc16(c.encode() + b"\0\0")) for c in _SUFFIX_ALPHABET]
    table: list[str | None] = [None] * SLOTS
    for a, x in three:
        for b, y in two:
            xy = x ^ y
            for c, z in one:
                v = (xy ^ z) % SLOTS
                if table[v] is None:
                    table[v] = a + b + c
    assert all(table), "the suffix alphabet must cover every slot"
    return tuple(s for s in table if s is not None)


def spread_slot(name: str, index: int, count: int) -> int:
    """Where partition ``index`` of ``count`` is placed: evenly spaced over the slots from
    where partition 0's plain tag ``name#0`` lands (so different queues start at different
    slots, and partition 0 keeps its tag in every layout)."""
    return (crc16(f"{name}#0".encode()) + index * SLOTS // count) % SLOTS


@cache
def spread_tag(name: str, index: int, count: int) -> str:
    """The hash tag of partition ``index`` of ``count`` under the spread placement:
    ``name#index~xyz``, whose slot is ``spread_slot`` (``name#0`` for partition 0, and for
    every partition of a single one: already there)."""
    head = f"{name}#{index}"
    if count <= 1 or index == 0:
        return head
    head += "~"
    offset = crc16(head.encode() + b"\0\0\0")
    return head + _suffixes()[(spread_slot(name, index, count) ^ offset) % SLOTS]


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
    instant with lua/lib/records.lua's ``fire_run_id``, which tests/test_script_prelude.py
    checks against this function."""
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
    built once per instance (clients keep one instance per partition).

    ``spread``: the queue's partition count when it is recorded with the spread placement (its
    tag is then ``spread_tag``), 0 for the tags ``{q#p}`` (see the module's Placement)."""

    queue: str
    partition: int
    spread: int = 0

    # Equal when the keys are: partition 0 of 2 and of 4 spread share their tag, and a
    # repartition must see that such a run stays where it is (a copy onto itself followed by
    # the source's deletion would delete it).
    def __eq__(self, other: object) -> bool:
        return isinstance(other, PartitionKeys) and self.prefix == other.prefix

    def __hash__(self) -> int:
        # Hashed per run on the worker's paths (dict keys): computed once per instance.
        return self._hash

    @cached_property
    def _hash(self) -> int:
        return hash(self.prefix)

    @cached_property
    def tag(self) -> str:
        if self.spread > 1:
            return spread_tag(self.queue, self.partition, self.spread)
        return f"{self.queue}#{self.partition}"

    @cached_property
    def prefix(self) -> str:
        return f"jq:{{{self.tag}}}:"

    @cached_property
    def slot(self) -> int:
        return key_slot(self.prefix)

    @cached_property
    def due(self) -> str:
        return self.prefix + "due"

    @cached_property
    def prio(self) -> str:
        """The due runs above the default priority, by level then due time (create_run.lua):
        claim takes them first; the due set still holds them too."""
        return self.prefix + "prio"

    @cached_property
    def gconf(self) -> str:
        """Fair shares' settings (group_set.lua): 'fair' while on; per group w:<group>,
        max:<group>, p:<group>."""
        return self.prefix + "gconf"

    @cached_property
    def gwait(self) -> str:
        """The fair-share ring's waiting groups, group -> when claim looks at it again."""
        return self.prefix + "gwait"

    @cached_property
    def gready(self) -> str:
        """The fair-share ring's groups with due runs, group -> pass (claim.lua)."""
        return self.prefix + "gready"

    @cached_property
    def gserved(self) -> str:
        """Runs claimed per group while fair shares were on, group -> count."""
        return self.prefix + "gserved"

    def gq(self, group: str) -> str:
        """A group's queue: its pending runs, by priority then due time (claim.lua)."""
        return self.prefix + "gq:" + group

    @cached_property
    def parked(self) -> str:
        """The runs parked by a full per-key or per-task cap, run_id -> original due time
        (claim.lua parks them; a freed slot unparks them)."""
        return self.prefix + "parked"

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
    def seq(self) -> str:
        """The order of the runs created in this partition in the current millisecond (a hash
        {ms, n}): the n-th is due at its ms plus n / 2048, so that runs due in the same
        millisecond are claimed in the order they were created (create_run, dedupe)."""
        return self.prefix + "seq"

    @cached_property
    def orphans(self) -> str:
        """Index entries found without their record (a Redis Cluster slot being imported):
        kept until the record appears (see claim.lua)."""
        return self.prefix + "orphans"

    @cached_property
    def done(self) -> str:
        return self.prefix + "done"

    @cached_property
    def limits(self) -> str:
        """The partition's flow limits (``set_queue_limit``): concurrency, read by claim."""
        return self.prefix + "limits"

    @cached_property
    def claims(self) -> str:
        """The claims of the last window of a rate limit (fence -> claim time), read by claim."""
        return self.prefix + "claims"

    @cached_property
    def paused(self) -> str:
        """Present while the queue is paused (``pause_queue``): claim takes nothing here."""
        return self.prefix + "paused"

    @cached_property
    def wake(self) -> str:
        return self.prefix + "wake"

    @cached_property
    def stats(self) -> str:
        return self.prefix + "stats"

    @cached_property
    def waiting(self) -> str:
        """Workflow runs waiting for their dependencies, run_id -> creation time
        (flow_create.lua; deliver.lua releases them to due)."""
        return self.prefix + "waiting"

    @cached_property
    def outbox(self) -> str:
        """Finished runs whose parents must hear of them, and '!<run_id>' orders to cancel a
        dead or cancelled waiting run's dependencies, member -> version (the relay,
        jobqueue.workflows.relay, carries them out)."""
        return self.prefix + "outbox"

    @cached_property
    def flows(self) -> str:
        """The flows with runs here, flow_id -> creation time of the first (flow_create.lua;
        flow_tidy.lua forgets one once all its records here expired)."""
        return self.prefix + "flows"

    @cached_property
    def events(self) -> str:
        """The partition's event log, a stream (see lua/lib/events.lua, event_log)."""
        return self.prefix + "events"

    @cached_property
    def events_conf(self) -> str:
        """The event log's settings (off, maxlen, age_ms); absent: the defaults."""
        return self.prefix + "events:conf"

    @cached_property
    def flows_tidy(self) -> str:
        """flow_tidy.lua's place: '' -> the rank in ``flows`` it goes on from; flow_id -> a
        run of it found alive (looked at first next time)."""
        return self.prefix + "flows_tidy"

    def flow(self, flow_id: str) -> str:
        """The run ids of a flow in this partition (a set)."""
        return self.prefix + "flow:" + flow_id

    @cached_property
    def staged(self) -> str:
        """The runs written staged, not committed or undone yet (flow_create.lua)."""
        return self.prefix + "staged"

    def flowmark(self, flow_id: str) -> str:
        """The commit of a flow whose home run is here: the nonce of the attempt that
        created it (flow_commit.lua, flow_create.lua), for longer than its records live."""
        return self.prefix + "flowmark:" + flow_id

    def deps(self, run_id: str) -> str:
        """A waiting run's dependencies: run_id -> '<index>|<policy>|<queue>'."""
        return self.prefix + "deps:" + run_id

    def got(self, run_id: str) -> str:
        """A waiting run's dependencies heard of: run_id -> outcome ('d' + result JSON, 'x' +
        error, 'c' + reason, 'r' for a removed edge)."""
        return self.prefix + "got:" + run_id

    def run(self, run_id: str) -> str:
        return self.prefix + "run:" + run_id

    def history(self, run_id: str) -> str:
        return self.prefix + "hist:" + run_id

    def fence_resource(self, name: str) -> str:
        return self.prefix + "fenced:" + name

    def dedupe(self, key: str) -> str:
        """The run holding a deduplication key (dedupe.lua)."""
        return self.prefix + "dedupe:" + key


def partition_keys(
    queue: str, partitions: int, run_id: str, spread: bool = False
) -> PartitionKeys:
    return queue_partition(queue, partition_of(run_id, partitions), partitions, spread)


def queue_partition(queue: str, partition: int, count: int, spread: bool) -> PartitionKeys:
    """Partition ``partition`` of a queue of ``count`` partitions, with its placement."""
    return PartitionKeys(queue, partition, count if spread and count > 1 else 0)


def queue_partitions(queue: str, count: int, spread: bool) -> list[PartitionKeys]:
    return [queue_partition(queue, p, count, spread) for p in range(count)]


@dataclass(frozen=True)
class SchedKeys:
    """The keys of one scheduler partition; every name carries the same hash tag. ``spread``:
    the partition count K when the store is recorded with the spread placement (see above),
    0 for the tags ``{sched#k}``."""

    partition: int
    spread: int = 0

    @property
    def prefix(self) -> str:
        return f"jq:{{{spread_tag('sched', self.partition, self.spread)}}}:"

    @property
    def owner(self) -> str:
        """The lease by which one scheduler owns the partition (sched_lease.lua)."""
        return self.prefix + "owner"

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
    def buffered(self) -> str:
        """buffer-one: job_id -> 'fire pred_fire due queue [pred_queue]' while its buffered run
        waits. The key is spelled 'held' for history: old and new schedulers share it."""
        return self.prefix + "held"
