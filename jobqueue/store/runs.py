"""The contracts of the run-lifecycle scripts (one queue partition, hash tag ``{q#p}``): what
the sync and asyncio clients, the worker and the CLI build their calls with and parse the
replies of, without I/O. ``CLAIM.call(pk, ...)`` builds a Call, ``CLAIM.parse(reply)`` reads
its reply."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from jobqueue.anomalies import stored_int
from jobqueue.store.contract import Contract, NowArg, Wire, now_arg, text
from jobqueue.store.keys import PartitionKeys

# A run above the default priority is also in its partition's prio zset, scored by level then
# due time (lua/lib/priority.lua prio_score: the same arithmetic).
PRIORITY_SPAN = 2**43


def prio_score(priority: int, due_ms: int) -> int:
    """A run's score in the prio zset (``priority`` 1..9)."""
    return (9 - priority) * PRIORITY_SPAN + due_ms


# -- create_run --------------------------------------------------------------------------------


@dataclass(slots=True)
class RunSpec:
    """Everything create_run needs to write one run (not frozen: built once per enqueued run,
    and a frozen dataclass costs several microseconds more to build)."""

    run_id: str
    task: str
    payload: str
    due_at_ms: int | None = None
    delay_ms: int = 0
    max_attempts: int = 3
    lease_ms: int = 0
    timeout_ms: int = 0
    job_id: str = ""
    scheduled_for_ms: int | None = None
    meta: str = ""  # JSON object of str -> str from the enqueue hooks (jobqueue.hooks), or ''
    priority: int = 0  # 0 (default) .. 9 (models.PRIORITY_MAX): higher is claimed first
    limit_key: str = ""  # the key of per-key limits (claim.lua), or ''


def _create(pk: PartitionKeys, specs: Sequence[RunSpec], now: NowArg = None) -> Wire:
    """Runs in order; consecutive runs sharing task, attempts, lease, timeout and priority
    form one group whose shared fields are sent once."""
    tail: list[str | int] = []
    i, n = 0, len(specs)
    while i < n:
        first = specs[i]
        head = (first.task, first.max_attempts, first.lease_ms, first.timeout_ms, first.priority)
        j = i + 1
        while j < n and (
            specs[j].task == head[0]
            and specs[j].max_attempts == head[1]
            and specs[j].lease_ms == head[2]
            and specs[j].timeout_ms == head[3]
            and specs[j].priority == head[4]
        ):
            j += 1
        tail += [j - i, *head]
        for s in specs[i:j]:
            tail += [
                s.run_id,
                s.payload,
                "" if s.due_at_ms is None else s.due_at_ms,
                s.delay_ms,
                s.job_id,
                "" if s.scheduled_for_ms is None else s.scheduled_for_ms,
                s.meta,
                s.limit_key,
            ]
        i = j
    return Wire(pk, {"now": now_arg(now), "prefix": pk.prefix}, tail)


def _parse_create(reply: Sequence[Any]) -> list[bool]:
    """Per run, in order: True when this call created it, False when it already existed."""
    return [int(x) == 1 for x in reply[1:]]


CREATE_RUN = Contract(
    "create_run",
    build=_create,
    parse=_parse_create,
)

# -- claim -------------------------------------------------------------------------------------


class ClaimedRun(NamedTuple):
    """One claimed run (a tuple: built per run on the worker's hot path)."""

    run_id: str
    fence: int
    attempt: int
    max_attempts: int
    task: str
    payload: str
    lease_until_ms: int
    timeout_ms: int
    job_id: str
    scheduled_for_ms: int | None
    due_ms: int
    meta: str = ""  # JSON object, or '' (see RunSpec.meta)


@dataclass(frozen=True)
class ClaimResult:
    now_ms: int
    next_wake_ms: int | None
    runs: list[ClaimedRun]


CLAIM_STRIDE = 12  # reply fields per claimed run


def _claim(
    pk: PartitionKeys,
    limit: int,
    owner: str,
    lease_ms: int,
    dead_retention_ms: int,
    now: NowArg = None,
) -> Wire:
    return Wire(
        pk,
        {
            "now": now_arg(now),
            "prefix": pk.prefix,
            "limit": limit,
            "owner": owner,
            "lease_ms": lease_ms,
            "dead_retention_ms": dead_retention_ms,
        },
    )


def _parse_claim(reply: Sequence[Any]) -> ClaimResult:
    now, next_wake, count = int(reply[0]), int(reply[1]), int(reply[2])
    if count and isinstance(reply[3], bytes):  # a client without decode_responses
        reply = [*reply[:3], *(text(x) if isinstance(x, bytes) else x for x in reply[3:])]
    runs = []
    for i in range(3, 3 + count * CLAIM_STRIDE, CLAIM_STRIDE):
        rid, fence, attempt, most, task, payload, until, timeout, job, sched, due, meta = reply[
            i : i + CLAIM_STRIDE
        ]
        runs.append(
            ClaimedRun(
                rid,
                int(fence),
                int(attempt),
                int(most),
                task,
                payload,
                int(until),
                int(timeout),
                job,
                # Informational only: a garbage value in a record must not fail the claim.
                # isdigit() alone took "²", which int() refuses: strictly ASCII digits.
                stored_int(sched),
                int(due),
                meta,
            )
        )
    return ClaimResult(now, None if next_wake < 0 else next_wake, runs)


CLAIM = Contract(
    "claim",
    build=_claim,
    parse=_parse_claim,
)

# -- heartbeat ---------------------------------------------------------------------------------


class Beats(NamedTuple):
    """A heartbeat's answer: the server's now, and per lease the new expiry in ms or the
    refusal reason."""

    now_ms: int
    answers: list[int | str]


def _heartbeat(
    pk: PartitionKeys, leases: Sequence[tuple[str, int]], lease_ms: int, now: NowArg = None
) -> Wire:
    tail: list[str | int] = []
    for run_id, fence in leases:
        tail += [run_id, fence]
    return Wire(pk, {"now": now_arg(now), "prefix": pk.prefix, "lease_ms": lease_ms}, tail)


def _parse_heartbeat(reply: Sequence[Any]) -> Beats:
    return Beats(int(reply[0]), [x if isinstance(x, int) else text(x) for x in reply[1:]])


HEARTBEAT = Contract(
    "heartbeat",
    build=_heartbeat,
    parse=_parse_heartbeat,
)

# -- fenced commits: complete, fail, release ---------------------------------------------------


class Outcome(NamedTuple):
    """The answer of a fenced operation: accepted, or refused with the reason (a tuple: one
    per committed run)."""

    accepted: bool
    status: str  # 'done', 'retry', 'dead', 'released' or the refusal reason
    current_fence: int | None = None
    retry_at_ms: int | None = None
    relay: bool = False  # finished, and runs wait on it: its outbox entry is to be relayed
    # complete.lua's, when relay: the record's 'parents' and the outbox entry's version, for
    # the committing worker to deliver at once (jobqueue.client.relay.relay_committed_steps)
    parents: str | None = None
    outbox_version: int | None = None


def _outcome(reply: Sequence[Any]) -> Outcome:
    status = text(reply[1])
    if int(reply[0]) == 1:
        if status == "retry":
            return Outcome(True, status, retry_at_ms=int(reply[2]))
        relay = len(reply) > 2 and int(reply[2]) == 1
        if relay and len(reply) > 4:
            return Outcome(True, status, relay=True, parents=text(reply[3]),
                           outbox_version=int(reply[4]))
        return Outcome(True, status, relay=relay)
    fence = int(reply[2]) if len(reply) > 2 else None
    return Outcome(False, status, current_fence=fence)


# The most bytes a run receiving its dependencies' results may hold (its payload: the
# results first, then its own arguments); past it the run dies saying so (lua/deliver.lua,
# and lua/complete.lua for a waiting run of the completed run's own partition).
MAX_RESULTS_BYTES = 16 * 1024 * 1024
DEFAULT_DEAD_RETENTION_MS = 7 * 86_400_000  # Settings.dead_retention_s's default


def _complete(
    pk: PartitionKeys,
    items: Sequence[tuple[str, int, str]],
    retention_ms: int,
    now: NowArg = None,
    *,
    dead_retention_ms: int = DEFAULT_DEAD_RETENTION_MS,
    max_bytes: int = MAX_RESULTS_BYTES,
) -> Wire:
    """Completions of runs of one partition: (run_id, fence, result JSON) each.
    ``dead_retention_ms`` and ``max_bytes``: for the waiting runs of the partition that hear
    of them in the same call (as deliver.lua's)."""
    tail: list[str | int] = []
    for run_id, fence, result_json in items:
        tail += [run_id, fence, result_json]
    return Wire(
        pk,
        {"now": now_arg(now), "prefix": pk.prefix, "retention_ms": retention_ms,
         "dead_retention_ms": dead_retention_ms, "max_bytes": max_bytes},
        tail,
    )


def _parse_complete(reply: Sequence[Any]) -> list[Outcome]:
    """One outcome per run, in order."""
    return [_outcome(r) for r in reply]


COMPLETE = Contract(
    "complete",
    build=_complete,
    parse=_parse_complete,
)


def _fail(
    pk: PartitionKeys,
    run_id: str,
    fence: int,
    error: str,
    retry_delay_ms: int | None,
    dead_retention_ms: int,
    now: NowArg = None,
    *,
    traceback: str = "",
) -> Wire:
    """One failed attempt; ``traceback`` (already bounded by the caller) is kept with the
    attempt's history entry."""
    return Wire(
        pk,
        {
            "now": now_arg(now),
            "prefix": pk.prefix,
            "run_id": run_id,
            "fence": fence,
            "error": error,
            "retry_delay_ms": "" if retry_delay_ms is None else retry_delay_ms,
            "dead_retention_ms": dead_retention_ms,
            "traceback": traceback,
        },
    )


FAIL = Contract(
    "fail",
    build=_fail,
    parse=_outcome,
)


def _release(pk: PartitionKeys, run_id: str, fence: int, now: NowArg = None) -> Wire:
    return Wire(
        pk, {"now": now_arg(now), "prefix": pk.prefix, "run_id": run_id, "fence": fence}
    )


RELEASE = Contract(
    "release",
    build=_release,
    parse=_outcome,
)

class Bounced(NamedTuple):
    """bounce.lua's answer: handed back ('bounced', due again at ``due_ms``), buried at the
    end of the window ('dead'), or refused (the reason, with the current fence)."""

    accepted: bool
    status: str
    hand_backs: int = 0
    due_ms: int | None = None
    current_fence: int | None = None


def _bounce(
    pk: PartitionKeys,
    run_id: str,
    fence: int,
    owner: str,
    error: str,
    *,
    delay_ms: int,
    delay_cap_ms: int,
    window_ms: int,
    dead_retention_ms: int,
    min_hand_backs: int = 1,
    now: NowArg = None,
) -> Wire:
    """Hand a run whose task this worker lacks back (attempt not counted), due again after
    ``delay_ms`` doubled at each hand-back (at most ``delay_cap_ms``); buried with ``error``
    once hand-backs went on for ``window_ms`` and numbered ``min_hand_backs`` or more."""
    return Wire(
        pk,
        {
            "now": now_arg(now),
            "prefix": pk.prefix,
            "run_id": run_id,
            "fence": fence,
            "owner": owner,
            "delay_ms": delay_ms,
            "delay_cap_ms": delay_cap_ms,
            "window_ms": window_ms,
            "dead_retention_ms": dead_retention_ms,
            "error": error,
            "min_hand_backs": min_hand_backs,
        },
    )


def _parse_bounce(reply: Sequence[Any]) -> Bounced:
    status = text(reply[1])
    if int(reply[0]) != 1:
        return Bounced(False, status, current_fence=int(reply[2]) if len(reply) > 2 else None)
    if status == "bounced":
        return Bounced(True, status, hand_backs=int(reply[3]), due_ms=int(reply[2]))
    return Bounced(True, status, hand_backs=int(reply[2]))


BOUNCE = Contract(
    "bounce",
    build=_bounce,
    parse=_parse_bounce,
)

# -- cancel, requeue ---------------------------------------------------------------------------


class StateChange(NamedTuple):
    """cancel / requeue: whether the run changed, and its previous state or the refusal."""

    changed: bool
    state: str


def _state_change(reply: Sequence[Any]) -> StateChange:
    return StateChange(int(reply[0]) == 1, text(reply[1]))


def _cancel(
    pk: PartitionKeys,
    run_id: str,
    retention_ms: int,
    reason: str,
    now: NowArg = None,
    *,
    running: bool = True,
) -> Wire:
    """``running=False`` leaves a running run alone (a workflow's cascade)."""
    return Wire(
        pk,
        {
            "now": now_arg(now),
            "prefix": pk.prefix,
            "run_id": run_id,
            "retention_ms": retention_ms,
            "reason": reason,
            "running": int(running),
        },
    )


CANCEL = Contract(
    "cancel",
    build=_cancel,
    parse=_state_change,
)


def _requeue(pk: PartitionKeys, run_id: str, force: bool = False, now: NowArg = None) -> Wire:
    return Wire(
        pk, {"now": now_arg(now), "prefix": pk.prefix, "run_id": run_id, "force": int(force)}
    )


REQUEUE = Contract(
    "requeue",
    build=_requeue,
    parse=_state_change,
)

# -- fenced_write ------------------------------------------------------------------------------


class FencedWrite(NamedTuple):
    """Whether the resource was written, and the fence that decided it."""

    written: bool
    fence: int


def _fenced_write(
    pk: PartitionKeys,
    resource: str,
    fence: int,
    value: str,
    run_id: str,
    ttl_ms: int = 0,
    now: NowArg = None,
) -> Wire:
    return Wire(
        {"resource": pk.fence_resource(resource), "run": pk.run(run_id)},
        {"now": now_arg(now), "fence": fence, "value": value, "run_id": run_id, "ttl_ms": ttl_ms},
    )


def _parse_fenced_write(reply: Sequence[Any]) -> FencedWrite:
    return FencedWrite(int(reply[0]) == 1, int(reply[1]))


FENCED_WRITE = Contract(
    "fenced_write",
    build=_fenced_write,
    parse=_parse_fenced_write,
)

# -- progress ----------------------------------------------------------------------------------


def _progress(
    pk: PartitionKeys, run_id: str, fence: int, progress: float, message: str, now: NowArg = None
) -> Wire:
    return Wire(
        {"run": pk.run(run_id)},
        # repr: the shortest text that reads back as the same float
        {"now": now_arg(now), "fence": fence, "progress": repr(float(progress)),
         "message": message, "prefix": pk.prefix, "run_id": run_id},
    )


PROGRESS = Contract(
    "progress",
    build=_progress,
    parse=_outcome,
)

# -- read_records ------------------------------------------------------------------------------


class Record(NamedTuple):
    """A run's record as read_records.lua gives it: its fields (empty when there is none) and
    its history; None for both when either key holds another type."""

    fields: dict[str, str] | None
    history: list[str] | None


def _read_records(pk: PartitionKeys, run_ids: Sequence[str], now: NowArg = None) -> Wire:
    if not run_ids:
        raise ValueError("read_records needs at least one run")
    return Wire(
        {"run": pk.run(run_ids[0])},
        {"now": now_arg(now), "prefix": pk.prefix},
        list(run_ids),
    )


def _parse_read_records(reply: Sequence[Any]) -> list[Record]:
    out = []
    for i in range(0, len(reply), 2):
        flat, history = reply[i], reply[i + 1]
        if flat is None or history is None:
            out.append(Record(None, None))
            continue
        if (flat and isinstance(flat[0], bytes)) or (history and isinstance(history[0], bytes)):
            flat, history = [text(v) for v in flat], [text(h) for h in history]
        out.append(Record(dict(zip(flat[0::2], flat[1::2], strict=True)), history))
    return out


READ_RECORDS = Contract(
    "read_records",
    build=_read_records,
    parse=_parse_read_records,
)

# -- dedupe ------------------------------------------------------------------------------------


class Deduped(NamedTuple):
    """What an enqueue under a deduplication key did: 'created', 'existed', 'deduplicated'
    or 'replaced', and the run it is about (the holder's, unless created or existed)."""

    outcome: str
    run_id: str


def _dedupe(
    pk: PartitionKeys,
    spec: RunSpec,
    key: str,
    mode: str,
    ttl_ms: int | None,
    now: NowArg = None,
) -> Wire:
    return Wire(
        {"due": pk.due, "wake": pk.wake, "stats": pk.stats, "prio": pk.prio,
         "dedupe": pk.dedupe(key), "seq": pk.seq},
        {
            "now": now_arg(now),
            "prefix": pk.prefix,
            "mode": mode,
            "ttl_ms": "" if ttl_ms is None else ttl_ms,
            "key": key,
            "run_id": spec.run_id,
            "task": spec.task,
            "payload": spec.payload,
            "due_at": "" if spec.due_at_ms is None else spec.due_at_ms,
            "delay_ms": spec.delay_ms,
            "max_attempts": spec.max_attempts,
            "lease_ms": spec.lease_ms,
            "timeout_ms": spec.timeout_ms,
            "priority": spec.priority,
            "meta": spec.meta,
            "limit_key": spec.limit_key,
        },
    )


def _parse_dedupe(reply: Sequence[Any]) -> Deduped:
    return Deduped(text(reply[1]), text(reply[2]))


DEDUPE = Contract(
    "dedupe",
    build=_dedupe,
    parse=_parse_dedupe,
)

CONTRACTS = (
    CREATE_RUN, DEDUPE, CLAIM, HEARTBEAT, COMPLETE, FAIL, RELEASE, BOUNCE, CANCEL, REQUEUE,
    FENCED_WRITE, PROGRESS, READ_RECORDS,
)
