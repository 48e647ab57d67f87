"""No script ever half-applies (issue 15): on corrupt data a script either refuses the whole
call before its first write, or goes through.

The cases are generated. Each scenario below is a realistic state and the call that drives one
script through its write paths. The keys the call touches are its declared KEYS (names and
types from its Lua header through ``jobqueue.store.contract``, real names from the call), and the
run records and history lists (``prefix + 'run:' + id``, ``prefix + 'hist:' + id``) of every
run the scenario knows: named by the call, listed in its indexes, or found in the keyspace
before or after the call. Each key is corrupted in each way that fits it, one case each:

- replaced by each other type: a string 'garbage', a list, a set, a hash or a zset;
- deleted, when the scenario has it;
- a hash that exists: each field it holds before the call or that the call writes, set to
  each of GARBAGE in turn;
- a string: set to each of GARBAGE;
- a zset: a member without a record, scored first, at -inf or at +inf;
- a list: overfull.

The oracle: the call raised one of jobqueue's errors (ScriptError; ConnectionFailed and its
ServerRefused for TRYLATER) and the keyspace (each key's type, content and expiry time) is what
it was before the call; or the call went through, its reply parses with its contract, and
no key became a type that is neither its own nor the one the header declares. Any other
exception fails the case. Both backends, like every Redis-facing test.

``survey()`` builds each scenario once on a private fakeredis at collection time and runs its
call, to learn which keys, fields and members there are before and after the call. Each case
then builds its scenario on the test's backend (once per backend; later cases restore the
first build's DUMPs), plants one corruption and calls the script. The cases of one key of one
scenario are one test (every case checked, each failure named): a test per case cost pytest
more than the case itself, two thirds of the survey's time.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import fakeredis
import pytest
import redis
from helpers import PAYLOAD, claim, create_new, spec
from script_calls import Advance, advance_groups, outcome

from jobqueue import JobQueue
from jobqueue.errors import ConnectionFailed, ScriptError
from jobqueue.recurring.config import SchedulerConfig
from jobqueue.recurring.daemon import Scheduler
from jobqueue.store.admin import PAUSE, PURGE, REPAIR, SET_LIMIT
from jobqueue.store.contract import headers
from jobqueue.store.embedded import EmbeddedServer
from jobqueue.store.exact import GLOBAL_LIMIT, PERMIT_SETTLE, PERMIT_TAKE, ExactKeys
from jobqueue.store.flows import (
    ATTACH,
    DELIVER,
    EXTEND,
    FLOW_ABORT,
    FLOW_COMMIT,
    FLOW_CREATE,
    FLOW_TIDY,
    RELAYED,
    Delivery,
    Edge,
    NodeSpec,
)
from jobqueue.store.groups import GROUP_SET
from jobqueue.store.keys import PartitionKeys, SchedKeys
from jobqueue.store.pages import INDEX_PAGE
from jobqueue.store.runs import (
    BOUNCE,
    CANCEL,
    CLAIM,
    COMPLETE,
    CREATE_RUN,
    DEDUPE,
    FAIL,
    FENCED_WRITE,
    HEARTBEAT,
    PROGRESS,
    READ_RECORDS,
    RELEASE,
    REQUEUE,
    RunSpec,
)
from jobqueue.store.schedules import (
    ADVANCE,
    HOLD_MS,
    SCHED_CREATE,
    SCHED_DEFINE,
    SCHED_DUE,
    SCHED_LEASE,
    SCHED_RELEASE,
    SCHED_UNHOLD,
    RunGroup,
)
from jobqueue.store.scripts import SCRIPT_NAMES, Call, Script, ScriptRunner, scripts

PK = PartitionKeys("default", 0)
SK = SchedKeys(0)
NOW = 1_700_000_000_000  # ms: the queue scenarios' calls run at this instant
S = 1_000  # the recurring jobs' clock starts at 0
LEASE = 30_000
RETENTION = 3_600_000  # of finished and dead records

# What a field or a string may hold that no script writes: not a number, empty, NaN, infinite,
# past 2^53, and digits that Lua reads as a number but Redis refuses as an integer.
GARBAGE = ("x", "", "nan", "1e400", "1" + "0" * 30, "007")
KINDS = ("string", "list", "set", "hash", "zset", "stream")
RECORD, HISTORY = "run:", "hist:"  # the undeclared keys: prefix + these + run id
# The partition's event log and its settings, undeclared too (prefix + these).
EVENT_KEYS = (("events", "stream"), ("events:conf", "hash"))


# -- building states ---------------------------------------------------------------------------


def fences_claimed(runner: ScriptRunner, limit: int, now: int, owner: str = "w1"
                   ) -> dict[str, int]:
    """Claim up to ``limit`` runs; their fences by run id."""
    result = claim(runner, PK, now, limit, owner, LEASE, RETENTION)
    return {r.run_id: r.fence for r in result.runs}


def accepted(runner: ScriptRunner, call: Call) -> None:
    assert outcome(call, runner.run(call)).accepted, call


def running_with_history(runner: ScriptRunner, run_id: str, now: int, **fields: Any) -> int:
    """A run on its second attempt (the first failed and was retried: a history entry); its
    fence."""
    create_new(runner, PK, spec(run_id, **fields), now=now)
    (first,) = fences_claimed(runner, 1, now=now).values()
    accepted(runner, FAIL.call(PK, run_id, first, "flaky", 0, RETENTION, now=now + 1))
    return fences_claimed(runner, 1, now=now + 2)[run_id]


def dead_with_history(runner: ScriptRunner, run_id: str, now: int) -> None:
    fence = running_with_history(runner, run_id, now, max_attempts=2)
    accepted(runner, FAIL.call(PK, run_id, fence, "boom", None, RETENTION, now=now + 3))


def expired_entry(runner: ScriptRunner, index: str) -> None:
    """An index entry of a run that finished before the retention: its record has expired, and
    the next write to the index trims the entry."""
    runner.client.zadd(index, {"old": NOW - RETENTION - 60_000})


def fire_run(job: str, second: int) -> str:
    """The run id of a recurring job's fire at ``second`` (under an hour)."""
    return f"{job}@1970-01-01T00:{second // 60:02d}:{second % 60:02d}Z"


def fire(job: str, second: int, due: int | None = None, lease: int = 0
         ) -> tuple[RunGroup, list[str | int]]:
    """A job's run of the fire at ``second`` as the scheduler sends it to sched_create: due at
    the fire time, or at ``due`` (HOLD_MS: a buffered buffer-one run)."""
    group = RunGroup("t", PAYLOAD, 3, lease, lease // 2, second * S)
    return group, [job, second * S if due is None else due]


def recurring_jobs(runner: ScriptRunner) -> None:
    """A scheduler partition after the ticks at 60 s and 120 s: a herd of two every-minute
    jobs, an hourly job, and two buffer-one jobs whose 120 s runs are buffered (their 60 s runs are
    still pending)."""
    jq = JobQueue(runner.client)
    for job in ("herd-1", "herd-2"):
        jq.schedule(job, "t", every=60, now=0)
    jq.schedule("hourly", "t", every=3600, now=0)
    for job in ("slow", "policed"):
        jq.schedule(job, "t", every=60, overlap="buffer-one", now=0)
    scheduler = Scheduler(jq, SchedulerConfig(lookahead=0), install_signal_handlers=False)
    scheduler.tick(now=60 * S)
    scheduler.tick(now=120 * S)


# -- the scenarios -----------------------------------------------------------------------------


def create_run(runner: ScriptRunner) -> Call:
    """A run is created again (it exists: left alone) with two new ones, one with its own
    lease, timeout, job and schedule."""
    create_new(runner, PK, spec("queued"), now=NOW - 1_000)
    return CREATE_RUN.call(PK, [
        spec("queued"),
        spec("new-1", lease_ms=5_000, timeout_ms=4_000, job_id="nightly", scheduled_for_ms=NOW),
        spec("new-2", delay_ms=1_000),
    ], now=NOW)


def claim_a_busy_partition(runner: ScriptRunner) -> Call:
    """Two expired leases (one retried, with its own lease and timeout; one past its attempts:
    buried), a due run, a run due later, a stray due entry of a finished run, and an orphan
    whose record has come back."""
    start = NOW - 60_000
    running_with_history(runner, "expired", start, max_attempts=3, lease_ms=5_000,
                         timeout_ms=4_000, job_id="nightly", scheduled_for_ms=start)
    create_new(runner, PK, spec("exhausted", max_attempts=1), now=start + 3)
    fences_claimed(runner, 1, now=start + 3)
    create_new(runner, PK, spec("finished"), now=start + 4)
    fence = fences_claimed(runner, 1, now=start + 4)["finished"]
    accepted(runner, COMPLETE.call(PK, [("finished", fence, "1")], RETENTION, now=start + 5))
    # What a failover leaves: a due entry of the finished run, and an orphan ('returned' was
    # indexed on a node its record had not reached yet; the record is here now).
    runner.client.zadd(PK.due, {"finished": start + 4})
    create_new(
        runner, PK, spec("due"), spec("later", delay_ms=120_000), spec("returned"), now=NOW - 10
    )
    runner.client.zrem(PK.due, "returned")
    runner.client.zadd(PK.orphans, {"returned": NOW - 5})
    return CLAIM.call(PK, 2, "w2", LEASE, RETENTION, now=NOW)


def create_prioritized_runs(runner: ScriptRunner) -> Call:
    """Runs above the default priority, one delayed, next to one at the default."""
    create_new(runner, PK, spec("old", priority=2), now=NOW - 1_000)
    return CREATE_RUN.call(PK, [
        spec("top", priority=9), spec("later", priority=9, delay_ms=1_000), spec("plain"),
    ], now=NOW)


def claim_by_priority(runner: ScriptRunner) -> Call:
    """Due runs at three levels; a prio entry of a cancelled run, one whose run's due time
    moved later (a retry's backoff), and one of a new record of the id at another level."""
    create_new(runner, PK, spec("top", priority=9), spec("mid", priority=4), spec("plain"),
            spec("gone", priority=9), now=NOW - 100)
    assert CANCEL.parse(runner.run(CANCEL.call(PK, "gone", RETENTION, "no", now=NOW - 90))).changed
    create_new(runner, PK, spec("moved", priority=4), now=NOW - 80)
    runner.client.zadd(PK.due, {"moved": NOW + 5_000})
    create_new(runner, PK, spec("renewed"), now=NOW - 70)
    runner.client.zadd(PK.prio, {"renewed": NOW - 70})  # a level-9 entry of an older life
    return CLAIM.call(PK, 3, "w2", LEASE, RETENTION, now=NOW)


def fail_and_retry_prioritized(runner: ScriptRunner) -> Call:
    fence = running_with_history(runner, "a", NOW - 3_000, priority=5)
    return FAIL.call(PK, "a", fence, "boom", 1_000, RETENTION, now=NOW)


def release_prioritized(runner: ScriptRunner) -> Call:
    fence = running_with_history(runner, "a", NOW - 3_000, priority=5)
    return RELEASE.call(PK, "a", fence, now=NOW)


def requeue_a_prioritized_run(runner: ScriptRunner) -> Call:
    create_new(runner, PK, spec("a", priority=5), now=NOW - 3_000)
    assert CANCEL.parse(runner.run(CANCEL.call(PK, "a", RETENTION, "no", now=NOW - 10))).changed
    return REQUEUE.call(PK, "a", now=NOW)


def dedupe(runner: ScriptRunner, mode: str, run_id: str, ttl: int | None = None) -> Call:
    return DEDUPE.call(PK, spec(run_id, priority=3, meta='{"a":"1"}'), "key", mode, ttl,
                       now=NOW)


def dedupe_create(runner: ScriptRunner) -> Call:
    """A key whose holder has finished (a ttl-less key left by a cancel): a new run."""
    runner.run(dedupe(runner, "throttle", "key@0"))
    assert CANCEL.parse(runner.run(CANCEL.call(PK, "key@0", RETENTION, "no", now=NOW))).changed
    return dedupe(runner, "throttle", "key@1")


def dedupe_throttle(runner: ScriptRunner) -> Call:
    runner.run(dedupe(runner, "throttle", "key@0", ttl=60_000))
    return dedupe(runner, "throttle", "key@1", ttl=60_000)


def dedupe_debounce(runner: ScriptRunner) -> Call:
    """The pending holder, with a history, takes the new payload, meta and due time."""
    runner.run(dedupe(runner, "debounce", "key@0"))
    runner.client.rpush(PK.history("key@0"), f"{NOW - 5} requeued (was cancelled)")
    runner.client.hset(PK.run("key@0"), "hist", "1")
    return dedupe(runner, "debounce", "key@1")


def claim_a_deduplicated_run(runner: ScriptRunner) -> Call:
    """The first claim of a run holding a key without a ttl releases the key."""
    runner.run(dedupe(runner, "throttle", "key@0"))
    return CLAIM.call(PK, 2, "w2", LEASE, RETENTION, now=NOW + 1)


def heartbeat(runner: ScriptRunner) -> Call:
    """A worker extends three leases (one of the runs has a lease of its own); another claim
    took one of them meanwhile, and a fourth run it names is gone."""
    create_new(
        runner, PK, spec("held", lease_ms=5_000), spec("other"), spec("stolen"), now=NOW - 3_000
    )
    fences = fences_claimed(runner, 3, now=NOW - 3_000)
    accepted(runner, RELEASE.call(PK, "stolen", fences["stolen"], now=NOW - 2_000))
    fences_claimed(runner, 1, now=NOW - 1_000, owner="w2")
    leases = [(r, fences[r]) for r in ("held", "other", "stolen")] + [("vanished", 1)]
    return HEARTBEAT.call(PK, leases, LEASE, now=NOW)


def complete_a_batch(runner: ScriptRunner) -> Call:
    """A worker commits three runs: two it holds (one with a history), and one another claim
    took meanwhile (refused). The done index holds an entry past the retention."""
    expired_entry(runner, PK.done)
    fence_a = running_with_history(runner, "a", NOW - 3_000)
    create_new(runner, PK, spec("b"), spec("stale"), now=NOW - 2_000)
    fences = fences_claimed(runner, 2, now=NOW - 2_000)
    accepted(runner, RELEASE.call(PK, "stale", fences["stale"], now=NOW - 1_500))
    fences_claimed(runner, 1, now=NOW - 1_000, owner="w2")
    items = [("a", fence_a, '"ok"'), ("b", fences["b"], "2"), ("stale", fences["stale"], "3")]
    return COMPLETE.call(PK, items, RETENTION, now=NOW)


def fail_and_retry(runner: ScriptRunner) -> Call:
    fence = running_with_history(runner, "a", NOW - 3_000)
    return FAIL.call(PK, "a", fence, "boom", 1_000, RETENTION, now=NOW)


def fail_for_good(runner: ScriptRunner) -> Call:
    """The last attempt fails: the run is buried. The dead index holds an entry past the
    retention."""
    expired_entry(runner, PK.dead)
    fence = running_with_history(runner, "a", NOW - 3_000, max_attempts=2)
    return FAIL.call(PK, "a", fence, "boom", 1_000, RETENTION, now=NOW)


def cancel_a_running_run(runner: ScriptRunner) -> Call:
    expired_entry(runner, PK.done)
    running_with_history(runner, "a", NOW - 3_000)
    return CANCEL.call(PK, "a", RETENTION, "stop", now=NOW)


# -- workflows: a waiting run "w" and its dependencies "a" and "b" --------------------------


def a_flow(runner: ScriptRunner, now: int, *, receives: str = "all") -> None:
    """w waits on a (fail policy) and b (ignore); both are pending, and say w waits on them."""
    parents = '[["default","w"]]'
    nodes = [
        NodeSpec("w", "t", PAYLOAD, receives=receives, args_tail='],"kwargs":{}}',
                 deps=[Edge("a", "default"), Edge("b", "default", "ignore")]),
        NodeSpec("a", "t", PAYLOAD, parents=parents),
        NodeSpec("b", "t", PAYLOAD, parents=parents),
    ]
    assert all(FLOW_CREATE.parse(runner.run(FLOW_CREATE.call(PK, nodes, now=now))))


def flow_create(runner: ScriptRunner) -> Call:
    """A second workflow beside a first: a waiting run and a pending dependency."""
    a_flow(runner, NOW - 3_000)
    nodes = [NodeSpec("w2", "t", PAYLOAD, deps=[Edge("c", "default")]),
             NodeSpec("c", "t", PAYLOAD, parents='[["default","w2"]]')]
    return FLOW_CREATE.call(PK, nodes, now=NOW)


def complete_a_dependency(runner: ScriptRunner) -> Call:
    """A run others wait on completes: it goes to the outbox and keeps its record."""
    a_flow(runner, NOW - 3_000)
    fences = fences_claimed(runner, 2, now=NOW - 2_000)
    return COMPLETE.call(PK, [("a", fences["a"], '"A"')], RETENTION, now=NOW)


def fail_a_dependency_for_good(runner: ScriptRunner) -> Call:
    a_flow(runner, NOW - 3_000)
    fences = fences_claimed(runner, 2, now=NOW - 2_000)
    return FAIL.call(PK, "b", fences["b"], "boom", None, RETENTION, now=NOW)


def cancel_a_waiting_run(runner: ScriptRunner) -> Call:
    a_flow(runner, NOW - 3_000)
    return CANCEL.call(PK, "w", RETENTION, "stop", now=NOW)


def deliver_and_release(runner: ScriptRunner) -> Call:
    """Both dependencies finished (b died, ignored): w is released with their results."""
    a_flow(runner, NOW - 3_000)
    return DELIVER.call(PK, [Delivery("w", "a", 'd"A"'), Delivery("w", "b", "xboom")],
                        RETENTION, 1 << 20, RETENTION, now=NOW)


def deliver_a_death(runner: ScriptRunner) -> Call:
    """a died, under the fail policy: w dies and orders its dependencies cancelled."""
    a_flow(runner, NOW - 3_000)
    return DELIVER.call(PK, [Delivery("w", "a", "xboom")], RETENTION, 1 << 20, RETENTION,
                        now=NOW)


def attach_a_finished_run(runner: ScriptRunner) -> Call:
    create_new(runner, PK, spec("old"), now=NOW - 3_000)
    fences = fences_claimed(runner, 1, now=NOW - 2_000)
    accepted(runner, COMPLETE.call(PK, [("old", fences["old"], "1")], RETENTION, now=NOW - 1_000))
    return ATTACH.call(PK, '["default","w"]', ["old"], now=NOW)


def deliver_a_skip(runner: ScriptRunner) -> Call:
    """w waits on s under the skip policy; s died: w is cancelled, nothing else is."""
    parents = '[["default","w"]]'
    nodes = [NodeSpec("w", "t", PAYLOAD, deps=[Edge("s", "default", "skip")]),
             NodeSpec("s", "t", PAYLOAD, parents=parents)]
    assert all(FLOW_CREATE.parse(runner.run(FLOW_CREATE.call(PK, nodes, now=NOW - 3_000))))
    return DELIVER.call(PK, [Delivery("w", "s", "xboom")], RETENTION, 1 << 20, RETENTION,
                        now=NOW)


def extend_a_waiting_run(runner: ScriptRunner) -> Call:
    """a, which w waits on, adds n: w waits on n too."""
    a_flow(runner, NOW - 3_000)
    return EXTEND.call(PK, "a", [("n", "default")], ["w"], now=NOW)


def tidy_flows(runner: ScriptRunner) -> Call:
    """Two flows, one of whose records all expired: it is forgotten."""
    a_flow(runner, NOW - 3_000)
    nodes = [NodeSpec("f1", "t", PAYLOAD, flow="F"), NodeSpec("f2", "t", PAYLOAD, flow="G")]
    assert all(FLOW_CREATE.parse(runner.run(FLOW_CREATE.call(PK, nodes, now=NOW - 2_000))))
    runner.client.delete(PK.run("f2"))
    return FLOW_TIDY.call(PK, 10, now=NOW)


STAGED = '["default","h","n1"]'  # the mark of attempt n1, whose home run is h


def a_staged_flow(runner: ScriptRunner, now: int) -> None:
    """A workflow written staged: h (the home, waiting on nothing) and w, waiting on h and
    receiving its result."""
    nodes = [
        NodeSpec("h", "t", PAYLOAD, flow="F", parents='[["default","w"]]'),
        NodeSpec("w", "t", PAYLOAD, flow="F", receives="one", args_tail='],"kwargs":{}}',
                 deps=[Edge("h", "default")]),
    ]
    call = FLOW_CREATE.call(PK, nodes, now=now, staged=STAGED)
    assert all(FLOW_CREATE.parse(runner.run(call)))


def commit_a_staged_flow(runner: ScriptRunner) -> Call:
    """The commit in the home's partition: h is released, w stays waiting (no longer staged)."""
    a_staged_flow(runner, NOW - 3_000)
    return FLOW_COMMIT.call(PK, "F", STAGED, "h", RETENTION, 1 << 20, RETENTION, now=NOW)


def abort_a_staged_flow(runner: ScriptRunner) -> Call:
    """The abort in the home's partition: both staged runs are deleted."""
    a_staged_flow(runner, NOW - 3_000)
    return FLOW_ABORT.call(PK, "F", STAGED, "h", now=NOW)


def relay_done(runner: ScriptRunner) -> Call:
    """a, which a run of another queue waits on, completed: its outbox entry is cleared."""
    nodes = [NodeSpec("a", "t", PAYLOAD, parents='[["other","w"]]')]
    assert all(FLOW_CREATE.parse(runner.run(FLOW_CREATE.call(PK, nodes, now=NOW - 3_000))))
    fences = fences_claimed(runner, 1, now=NOW - 2_000)
    assert runner.run(COMPLETE.call(PK, [("a", fences["a"], '"A"')], RETENTION, now=NOW))
    return RELAYED.call(PK, [("a", NOW)], RETENTION, RETENTION, now=NOW + 1)


def release(runner: ScriptRunner) -> Call:
    fence = running_with_history(runner, "a", NOW - 3_000)
    return RELEASE.call(PK, "a", fence, now=NOW)


def bounce(runner: ScriptRunner) -> Call:
    """A worker without the task hands a running run back, a second time."""
    fence = running_with_history(runner, "a", NOW - 3_000)
    accepted(runner, BOUNCE.call(
        PK, "a", fence, "w-old", "no task", delay_ms=1, delay_cap_ms=1, window_ms=3_600_000,
        dead_retention_ms=RETENTION, now=NOW - 2_000,
    ))
    again = fences_claimed(runner, 1, now=NOW - 1_000)["a"]
    return BOUNCE.call(
        PK, "a", again, "w-old", "no task", delay_ms=1_000, delay_cap_ms=60_000,
        window_ms=3_600_000, dead_retention_ms=RETENTION, now=NOW,
    )


def bounce_for_good(runner: ScriptRunner) -> Call:
    """The hand-back window is over: the run is buried."""
    expired_entry(runner, PK.dead)
    fence = running_with_history(runner, "a", NOW - 3_000)
    return BOUNCE.call(
        PK, "a", fence, "w-old", "no task", delay_ms=1_000, delay_cap_ms=60_000, window_ms=0,
        dead_retention_ms=RETENTION, now=NOW,
    )


def requeue_a_dead_run(runner: ScriptRunner) -> Call:
    dead_with_history(runner, "a", NOW - 3_000)
    return REQUEUE.call(PK, "a", now=NOW)


def fenced_write(runner: ScriptRunner) -> Call:
    """A run writes a resource that an older claim wrote before it."""
    create_new(runner, PK, spec("older"), now=NOW - 4_000)
    create_new(runner, PK, spec("a"), now=NOW - 3_000)
    fences = fences_claimed(runner, 2, now=NOW - 3_000)
    call = FENCED_WRITE.call(PK, "report", fences["older"], "v1", "older", now=NOW - 2_000)
    assert FENCED_WRITE.parse(runner.run(call))[0]
    return FENCED_WRITE.call(PK, "report", fences["a"], "v2", "a", ttl_ms=60_000, now=NOW)


def progress(runner: ScriptRunner) -> Call:
    """A running run reports its progress (it reported before)."""
    fence = running_with_history(runner, "a", NOW - 3_000)
    call = PROGRESS.call(PK, "a", fence, 10, "started", now=NOW - 2_000)
    assert PROGRESS.parse(runner.run(call)).accepted
    return PROGRESS.call(PK, "a", fence, 50, "half", now=NOW)


def read_records(runner: ScriptRunner) -> Call:
    """A waiter's listener reads a run with a history, a dead one and a pending one."""
    running_with_history(runner, "a", NOW - 3_000)
    dead_with_history(runner, "b", NOW - 2_000)
    create_new(runner, PK, spec("c"), now=NOW - 1_000)
    return READ_RECORDS.call(PK, ["a", "b", "c"], now=NOW)


def index_page(runner: ScriptRunner) -> Call:
    """A listing pages through the dead index after a place whose run left it."""
    dead_with_history(runner, "a", NOW - 3_000)
    dead_with_history(runner, "b", NOW - 2_000)
    return INDEX_PAGE.call(PK.dead, "desc", after=(str(NOW - 1_000), "gone"), now=NOW)


def purge(runner: ScriptRunner) -> Call:
    """Two dead runs (one with a history) and a pending one (refused)."""
    dead_with_history(runner, "a", NOW - 3_000)
    create_new(runner, PK, spec("b", max_attempts=1), now=NOW - 2_000)
    fence = fences_claimed(runner, 1, now=NOW - 2_000)["b"]
    accepted(runner, FAIL.call(PK, "b", fence, "boom", None, RETENTION, now=NOW - 1_000))
    create_new(runner, PK, spec("c"), now=NOW - 1_000)
    return PURGE.call(PK, ["a", "b", "c"])


def sched_due(runner: ScriptRunner) -> Call:
    recurring_jobs(runner)
    return SCHED_DUE.call(SK, 0, 100, now=180 * S)


def advance(runner: ScriptRunner) -> Call:
    """The 180 s tick moves the herd on, records a buffered run for 'policed', and ends 'hourly'
    (its schedule is over)."""
    recurring_jobs(runner)
    fired = {"fired": 1, "last_fire_ms": 180 * S, "through_ms": 180 * S}
    return ADVANCE.call(SK, advance_groups([
        Advance("herd-1", 180 * S, 240 * S, **fired),
        Advance("herd-2", 180 * S, 240 * S, **fired),
        Advance("policed", 180 * S, 240 * S, skipped=1, through_ms=180 * S,
                buffered=f"{180 * S} {60 * S} {180 * S} default"),
        Advance("hourly", 3600 * S, None, through_ms=180 * S),
    ]), now=180 * S, token=int(runner.client.hget(SK.owner, "token")))  # the ticks' scheduler


def sched_define_put(runner: ScriptRunner) -> Call:
    """'herd-1' is redefined to every two minutes, compare-and-set against what was read."""
    recurring_jobs(runner)
    return SCHED_DEFINE.call(
        SK, "herd-1", expected_definition=runner.client.hget(SK.defs, "herd-1"),
        expected_next_ms=180 * S, definition='{"task":"t","queue":"default","every_ms":120000}',
        next_ms=240 * S, state="2 0 0 0 120000 120000 default",
    )


def sched_define_delete(runner: ScriptRunner) -> Call:
    recurring_jobs(runner)
    return SCHED_DEFINE.call(
        SK, "hourly", expected_definition=runner.client.hget(SK.defs, "hourly"),
        expected_next_ms=3600 * S, definition=None, next_ms=None,
    )


def sched_create(runner: ScriptRunner) -> Call:
    """The 180 s fire: 'herd-1' (with its own lease and timeout) and 'herd-2', and the buffered
    run of 'policed'; with the 120 s run of 'herd-1' again (it exists: the scheduler crashed
    before its advance)."""
    runner.run(SCHED_CREATE.call(PK, [fire("herd-1", 120)], now=120 * S))
    group, herd = fire("herd-1", 180, lease=5_000)
    herd += fire("herd-2", 180)[1]
    return SCHED_CREATE.call(PK, [
        fire("herd-1", 120), (group, herd), fire("policed", 180, due=HOLD_MS),
    ], now=180 * S)


def sched_release(runner: ScriptRunner) -> Call:
    """Two buffer-one jobs with their 120 s runs buffered: 'policed' (its 60 s run completed:
    released) and 'slow' (its 60 s run is still running: still buffered)."""
    runner.run(SCHED_CREATE.call(PK, [fire("policed", 60), fire("slow", 60)], now=60 * S))
    fences = fences_claimed(runner, 2, now=61 * S)
    buffered = [fire("policed", 120, due=HOLD_MS), fire("slow", 120, due=HOLD_MS)]
    runner.run(SCHED_CREATE.call(PK, buffered, now=120 * S))
    first = fire_run("policed", 60)
    accepted(runner, COMPLETE.call(PK, [(first, fences[first], "1")], RETENTION, now=122 * S))
    return SCHED_RELEASE.call(PK, [
        (fire_run("policed", 120), first, 120 * S),
        (fire_run("slow", 120), fire_run("slow", 60), 120 * S),
    ], now=130 * S)


def sched_unhold(runner: ScriptRunner) -> Call:
    """Two buffered entries are forgotten; a third is named with a text that changed since it was
    read (kept)."""
    recurring_jobs(runner)
    buffered = runner.client.hgetall(SK.buffered)
    return SCHED_UNHOLD.call(SK, [("policed", buffered["policed"]), ("slow", buffered["slow"]),
                                  ("herd-1", "120000 60000 120000 default")], now=130 * S)


def sched_lease_takeover(runner: ScriptRunner) -> Call:
    """The partition's owner (the ticks' scheduler) stopped renewing at 120 s; another
    scheduler acquires it at 180 s, its lease long expired: a new owner and token."""
    recurring_jobs(runner)
    return SCHED_LEASE.call(SK, "s-2", "acquire", 5_000, now=180 * S)


def sched_lease_renew(runner: ScriptRunner) -> Call:
    """The owner renews its lease with its token."""
    recurring_jobs(runner)
    token = int(runner.client.hget(SK.owner, "token"))
    owner = runner.client.hget(SK.owner, "owner")
    return SCHED_LEASE.call(SK, owner, "renew", 5_000, token, now=121 * S)


def repair(runner: ScriptRunner) -> Call:
    """A pending run whose due entry is gone, a running run whose lease entry is gone, a
    due entry whose record is gone, an orphan whose record is back, and a run in place."""
    create_new(
        runner, PK, spec("lost"), spec("gone"), spec("returned"), spec("fine"), now=NOW - 4_000
    )
    runner.client.zrem(PK.due, "lost")
    create_new(runner, PK, spec("held"), now=NOW - 3_500)
    fences_claimed(runner, 1, now=NOW - 3_000)
    runner.client.delete(PK.leases)
    runner.client.delete(PK.run("gone"))
    runner.client.zrem(PK.due, "returned")
    runner.client.zadd(PK.orphans, {"returned": NOW - 5})
    return REPAIR.call(PK, ["lost", "held", "gone", "returned", "fine"], now=NOW)


def claim_a_paused_partition(runner: ScriptRunner) -> Call:
    """The busy partition of claim_a_busy_partition, paused: nothing is taken."""
    call = claim_a_busy_partition(runner)
    assert PAUSE.parse(runner.run(PAUSE.call(PK, True, now=NOW - 1)))
    return call


def pause(runner: ScriptRunner) -> Call:
    """A busy partition is paused."""
    claim_a_busy_partition(runner)
    return PAUSE.call(PK, True, now=NOW)


def resume(runner: ScriptRunner) -> Call:
    """A paused partition with runs due (and tokens in its wake list) is resumed."""
    claim_a_busy_partition(runner)
    assert PAUSE.parse(runner.run(PAUSE.call(PK, True, now=NOW - 1)))
    return PAUSE.call(PK, False, now=NOW)


def claim_under_a_limit(runner: ScriptRunner) -> Call:
    """The busy partition of claim_a_busy_partition under a concurrency limit of 2, one slot
    held by a live lease: the call takes one run."""
    call = claim_a_busy_partition(runner)
    create_new(runner, PK, spec("live"), now=NOW - 8)
    runner.run(CLAIM.call(PK, 1, "w1", LEASE, RETENTION, now=NOW - 8))  # takes 'expired' back
    assert SET_LIMIT.parse(runner.run(SET_LIMIT.call(PK, "concurrency", 3, now=NOW - 1)))
    return call


def claim_a_full_partition(runner: ScriptRunner) -> Call:
    """The busy partition under a concurrency limit its live leases already fill."""
    call = claim_a_busy_partition(runner)
    assert SET_LIMIT.parse(runner.run(SET_LIMIT.call(PK, "concurrency", 0, now=NOW - 1)))
    return call


def claim_under_a_rate(runner: ScriptRunner) -> Call:
    """The busy partition under a rate limit of 3 claims per 10 s, one claim in the window
    (and one that left it): the call takes two runs."""
    call = claim_a_busy_partition(runner)
    assert SET_LIMIT.parse(runner.run(SET_LIMIT.call(PK, "rate", "3 10000", now=NOW - 1)))
    runner.client.zadd(PK.claims, {"1": NOW - 15_000, "2": NOW - 5_000})
    return call


def claim_a_rate_limited_partition(runner: ScriptRunner) -> Call:
    """The busy partition whose rate limit's window is full."""
    call = claim_a_busy_partition(runner)
    assert SET_LIMIT.parse(runner.run(SET_LIMIT.call(PK, "rate", "1 10000", now=NOW - 1)))
    runner.client.zadd(PK.claims, {"1": NOW - 5_000})
    return call


def set_rate(runner: ScriptRunner) -> Call:
    """A rate limit is changed on a busy partition (idle workers are woken)."""
    claim_a_busy_partition(runner)
    assert SET_LIMIT.parse(runner.run(SET_LIMIT.call(PK, "rate", "1 1000", now=NOW - 1)))
    return SET_LIMIT.call(PK, "rate", "50 1000", now=NOW)


def complete_under_a_limit(runner: ScriptRunner) -> Call:
    """complete_a_batch under a concurrency limit: each completion wakes an idle worker."""
    call = complete_a_batch(runner)
    assert SET_LIMIT.parse(runner.run(SET_LIMIT.call(PK, "concurrency", 2, now=NOW - 1)))
    return call


def fail_for_good_under_a_limit(runner: ScriptRunner) -> Call:
    call = fail_for_good(runner)
    assert SET_LIMIT.parse(runner.run(SET_LIMIT.call(PK, "concurrency", 2, now=NOW - 1)))
    return call


def set_limit_raise(runner: ScriptRunner) -> Call:
    """A limit is raised on a busy partition (idle workers are woken)."""
    claim_a_busy_partition(runner)
    assert SET_LIMIT.parse(runner.run(SET_LIMIT.call(PK, "concurrency", 1, now=NOW - 1)))
    return SET_LIMIT.call(PK, "concurrency", 5, now=NOW)


def group_set_resume(runner: ScriptRunner) -> Call:
    """A paused group of a fair partition with runs in line is resumed."""
    runner.run(GROUP_SET.call(PK, True, "g", 2, 10, True, now=NOW - 2))
    runner.run(CREATE_RUN.call(PK, [RunSpec("g1", "t", "{}", limit_key="g")], now=NOW - 2))
    runner.run(CLAIM.call(PK, 10, "w", 30_000, 3_600_000, now=NOW - 1))
    return GROUP_SET.call(PK, None, "g", paused=False, now=NOW)


EXACT = ExactKeys("default")


def permit_take(runner: ScriptRunner) -> Call:
    """A queue at its exact cap with a permit about to expire is asked for two more."""
    runner.run(GLOBAL_LIMIT.call(EXACT, "concurrency", 2, now=NOW - 2))
    runner.run(GLOBAL_LIMIT.call(EXACT, "rate", "5 1000", now=NOW - 2))
    runner.run(PERMIT_TAKE.call(EXACT, 2, 1, "old", NOW - 2))
    return PERMIT_TAKE.call(EXACT, 2, 30_000, "new", NOW)


def permit_settle(runner: ScriptRunner) -> Call:
    """A worker binds one permit, drops one, extends a run's and gives one back."""
    runner.run(GLOBAL_LIMIT.call(EXACT, "concurrency", 4, now=NOW - 2))
    runner.run(PERMIT_TAKE.call(EXACT, 2, 30_000, "a", NOW - 2))
    runner.run(PERMIT_SETTLE.call(EXACT, 30_000, [("a:1", "p|r1|1")], now=NOW - 1))
    runner.run(PERMIT_TAKE.call(EXACT, 2, 30_000, "b", NOW - 1))
    return PERMIT_SETTLE.call(EXACT, 30_000, [("b:1", "p|r2|1")], ["b:2"], ["p|r1|1"],
                              ["a:2"], now=NOW)


def global_limit(runner: ScriptRunner) -> Call:
    runner.run(GLOBAL_LIMIT.call(EXACT, "concurrency", 2, now=NOW - 1))
    return GLOBAL_LIMIT.call(EXACT, "concurrency", 3, now=NOW)


def claim_fair(runner: ScriptRunner) -> Call:
    """A claim of a fair partition: two groups with runs in line, one run without a group."""
    runner.run(GROUP_SET.call(PK, True, "a", 3, now=NOW - 2))
    runner.run(CREATE_RUN.call(PK, [RunSpec(f"a{i}", "t", "{}", limit_key="a") for i in range(3)]
                               + [RunSpec("b1", "t", "{}", limit_key="b"),
                                  RunSpec("n1", "t", "{}")], now=NOW - 1))
    return CLAIM.call(PK, 2, "w", 30_000, 3_600_000, now=NOW)


def set_limit_remove(runner: ScriptRunner) -> Call:
    claim_a_busy_partition(runner)
    assert SET_LIMIT.parse(runner.run(SET_LIMIT.call(PK, "concurrency", 1, now=NOW - 1)))
    return SET_LIMIT.call(PK, "concurrency", None, now=NOW)


def key_capped(runner: ScriptRunner) -> None:
    """A queue with a per-key cap of 1 and a cap of 1 on task 'export': 'held' runs (key k),
    'waits' is parked behind it, 'exporting' runs and 'export-2' is parked behind it, and
    'stale' (key k, one attempt) ran out of lease. A key rate of 5 per minute too."""
    for name, value in (("key_concurrency", 1), ("task:export", 1), ("key_rate", "5 60000")):
        assert SET_LIMIT.parse(runner.run(SET_LIMIT.call(PK, name, value, now=NOW - 100)))
    create_new(runner, PK, spec("stale", limit_key="j", max_attempts=1), now=NOW - LEASE - 20)
    fences_claimed(runner, 1, now=NOW - LEASE - 20)  # its lease expires at NOW - 20
    create_new(runner, PK, spec("held", limit_key="k"), now=NOW - 50)
    create_new(runner, PK, RunSpec("exporting", "export", PAYLOAD), now=NOW - 49)
    create_new(runner, PK, spec("waits", limit_key="k"), RunSpec("export-2", "export", PAYLOAD),
            spec("waits-j", limit_key="j"), now=NOW - 48)
    assert set(fences_claimed(runner, 5, now=NOW - 40)) == {"held", "exporting"}


def claim_under_key_caps(runner: ScriptRunner) -> Call:
    """The stale lease is buried (its slot frees: 'waits-j' unparks), a new run of key k is
    parked, one of another key is taken."""
    key_capped(runner)
    create_new(runner, PK, spec("k-new", limit_key="k"), spec("m-new", limit_key="m"), now=NOW - 10)
    return CLAIM.call(PK, 3, "w2", LEASE, RETENTION, now=NOW)


def complete_a_key_holder(runner: ScriptRunner) -> Call:
    key_capped(runner)
    fence = int(runner.client.hget(PK.run("held"), "fence"))
    return COMPLETE.call(PK, [("held", fence, "1")], RETENTION, now=NOW)


def cancel_a_parked_run(runner: ScriptRunner) -> Call:
    key_capped(runner)
    return CANCEL.call(PK, "waits", RETENTION, "stop", now=NOW)


def set_limit_raise_a_key_cap(runner: ScriptRunner) -> Call:
    key_capped(runner)
    return SET_LIMIT.call(PK, "key_concurrency", 3, now=NOW)


@dataclass(frozen=True)
class Scenario:
    """A state, and the call under test in it. ``build`` sets up the state and returns the
    call (the same call each time: the clocks are explicit)."""

    name: str
    script: str
    build: Callable[[ScriptRunner], Call]
    parse: Callable[[Any], object]  # the reply's parser: its script's contract's
    prefix: str = PK.prefix  # where the records and histories of its runs live ('' = none)
    names: tuple[str, ...] = ()  # run ids the call names that have no key at all
    writes: bool = True  # False: this state makes its script change nothing (a paused claim)


SCENARIOS = {
    s.name: s
    for s in (
        Scenario("create_run", "create_run", create_run, CREATE_RUN.parse),
        Scenario("claim", "claim", claim_a_busy_partition, CLAIM.parse),
        Scenario("create_run-priority", "create_run", create_prioritized_runs,
                 CREATE_RUN.parse),
        Scenario("claim-priority", "claim", claim_by_priority, CLAIM.parse),
        Scenario("dedupe-create", "dedupe", dedupe_create, DEDUPE.parse),
        Scenario("dedupe-throttle", "dedupe", dedupe_throttle, DEDUPE.parse),
        Scenario("dedupe-debounce", "dedupe", dedupe_debounce, DEDUPE.parse),
        Scenario("claim-dedupe", "claim", claim_a_deduplicated_run, CLAIM.parse),
        Scenario("fail-retry-priority", "fail", fail_and_retry_prioritized, FAIL.parse),
        Scenario("release-priority", "release", release_prioritized, RELEASE.parse),
        Scenario("requeue-priority", "requeue", requeue_a_prioritized_run, REQUEUE.parse),
        Scenario("heartbeat", "heartbeat", heartbeat, HEARTBEAT.parse, names=("vanished",)),
        Scenario("complete", "complete", complete_a_batch, COMPLETE.parse),
        Scenario("fail-retry", "fail", fail_and_retry, FAIL.parse),
        Scenario("fail-dead", "fail", fail_for_good, FAIL.parse),
        Scenario("cancel", "cancel", cancel_a_running_run, CANCEL.parse),
        Scenario("release", "release", release, RELEASE.parse),
        Scenario("bounce", "bounce", bounce, BOUNCE.parse),
        Scenario("bounce-dead", "bounce", bounce_for_good, BOUNCE.parse),
        Scenario("requeue", "requeue", requeue_a_dead_run, REQUEUE.parse),
        Scenario("fenced_write", "fenced_write", fenced_write, FENCED_WRITE.parse),
        Scenario("progress", "progress", progress, PROGRESS.parse),
        Scenario("purge", "purge", purge, PURGE.parse),
        Scenario("read_records", "read_records", read_records, READ_RECORDS.parse,
                 writes=False),
        Scenario("index_page", "index_page", index_page, INDEX_PAGE.parse, writes=False),
        Scenario("repair", "repair", repair, REPAIR.parse),
        Scenario("claim-paused", "claim", claim_a_paused_partition, CLAIM.parse,
                 writes=False),
        Scenario("pause", "pause", pause, PAUSE.parse),
        Scenario("claim-limited", "claim", claim_under_a_limit, CLAIM.parse),
        Scenario("claim-full", "claim", claim_a_full_partition, CLAIM.parse, writes=False),
        Scenario("claim-rated", "claim", claim_under_a_rate, CLAIM.parse),
        Scenario("complete-limited", "complete", complete_under_a_limit, COMPLETE.parse),
        Scenario("fail-dead-limited", "fail", fail_for_good_under_a_limit, FAIL.parse),
        Scenario("claim-rate-full", "claim", claim_a_rate_limited_partition, CLAIM.parse,
                 writes=False),
        Scenario("set_limit-rate", "set_limit", set_rate, SET_LIMIT.parse),
        Scenario("set_limit-raise", "set_limit", set_limit_raise, SET_LIMIT.parse),
        Scenario("set_limit-remove", "set_limit", set_limit_remove, SET_LIMIT.parse),
        Scenario("resume", "pause", resume, PAUSE.parse),
        Scenario("group_set-resume", "group_set", group_set_resume, GROUP_SET.parse),
        Scenario("claim-fair", "claim", claim_fair, CLAIM.parse),
        Scenario("permit_take", "permit_take", permit_take, PERMIT_TAKE.parse),
        Scenario("permit_settle", "permit_settle", permit_settle, PERMIT_SETTLE.parse),
        Scenario("global_limit", "global_limit", global_limit, GLOBAL_LIMIT.parse),
        Scenario("claim-key-capped", "claim", claim_under_key_caps, CLAIM.parse),
        Scenario("complete-key-holder", "complete", complete_a_key_holder, COMPLETE.parse),
        Scenario("cancel-parked", "cancel", cancel_a_parked_run, CANCEL.parse),
        Scenario("set_limit-key-raise", "set_limit", set_limit_raise_a_key_cap,
                 SET_LIMIT.parse),
        Scenario("sched_due", "sched_due", sched_due, SCHED_DUE.parse, prefix=""),
        Scenario("advance", "advance", advance, ADVANCE.parse, prefix=""),
        Scenario("sched_define-put", "sched_define", sched_define_put, SCHED_DEFINE.parse,
                 prefix=""),
        Scenario("sched_define-delete", "sched_define", sched_define_delete,
                 SCHED_DEFINE.parse, prefix=""),
        Scenario("sched_create", "sched_create", sched_create, SCHED_CREATE.parse),
        Scenario("sched_release", "sched_release", sched_release, SCHED_RELEASE.parse),
        Scenario("sched_unhold", "sched_unhold", sched_unhold, SCHED_UNHOLD.parse, prefix=""),
        Scenario("sched_lease-takeover", "sched_lease", sched_lease_takeover,
                 SCHED_LEASE.parse, prefix=""),
        Scenario("sched_lease-renew", "sched_lease", sched_lease_renew, SCHED_LEASE.parse,
                 prefix=""),
        Scenario("flow_create", "flow_create", flow_create, FLOW_CREATE.parse),
        Scenario("complete-dependency", "complete", complete_a_dependency, COMPLETE.parse),
        Scenario("fail-dependency", "fail", fail_a_dependency_for_good, FAIL.parse),
        Scenario("cancel-waiting", "cancel", cancel_a_waiting_run, CANCEL.parse),
        Scenario("deliver-release", "deliver", deliver_and_release, DELIVER.parse),
        Scenario("deliver-death", "deliver", deliver_a_death, DELIVER.parse),
        Scenario("attach", "attach", attach_a_finished_run, ATTACH.parse),
        Scenario("deliver-skip", "deliver", deliver_a_skip, DELIVER.parse),
        Scenario("extend", "extend", extend_a_waiting_run, EXTEND.parse),
        Scenario("flow_tidy", "flow_tidy", tidy_flows, FLOW_TIDY.parse),
        Scenario("relayed", "relayed", relay_done, RELAYED.parse),
        Scenario("flow_commit", "flow_commit", commit_a_staged_flow, FLOW_COMMIT.parse),
        Scenario("flow_abort", "flow_abort", abort_a_staged_flow, FLOW_ABORT.parse),
    )
}


# -- the keyspace ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    kind: str
    value: object  # the content, in a canonical order
    expires_at: int  # PEXPIRETIME: -1 when the key has no expiry


READ: dict[str, Callable[[Any, str], object]] = {
    "string": lambda pipe, key: pipe.get(key),
    "list": lambda pipe, key: pipe.lrange(key, 0, -1),
    "set": lambda pipe, key: pipe.smembers(key),
    "hash": lambda pipe, key: pipe.hgetall(key),
    "zset": lambda pipe, key: pipe.zrange(key, 0, -1, withscores=True),
    "stream": lambda pipe, key: pipe.xrange(key),
}


def canonical(kind: str, value: Any) -> object:
    if kind == "stream":
        return [(entry_id, sorted(fields.items())) for entry_id, fields in value]
    if isinstance(value, set):
        return sorted(value)
    if isinstance(value, dict):
        return sorted(value.items())
    return value


def kinds(client: Any) -> dict[str, str]:
    """Every key's type."""
    keys = sorted(client.keys("*"))
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.type(key)
    return dict(zip(keys, pipe.execute(), strict=True))


def keyspace(client: Any) -> dict[str, Entry]:
    """Every key's type, content and expiry time. Contents, not DUMPs: a real server
    serializes a hash or a set kept as a hash table in its table's order, which a mere read
    changes while the table is being rehashed (a restored one, say)."""
    types = kinds(client)
    pipe = client.pipeline(transaction=False)
    for key, kind in types.items():
        READ[kind](pipe, key)
        pipe.execute_command("PEXPIRETIME", key)
    replies = pipe.execute()
    return {
        key: Entry(kind, canonical(kind, replies[2 * i]), replies[2 * i + 1])
        for i, (key, kind) in enumerate(types.items())
    }


def differences(before: dict[str, Entry], after: dict[str, Entry]) -> list[str]:
    out = [f"{k} created" for k in after.keys() - before.keys()]
    out += [f"{k} deleted" for k in before.keys() - after.keys()]
    out += [f"{k} changed" for k in before.keys() & after.keys() if before[k] != after[k]]
    return sorted(out)


Shape = dict[str, tuple[str, frozenset[str]]]  # key -> (type, hash fields or zset members)


def shape(client: Any) -> Shape:
    out: Shape = {}
    for key in client.scan_iter(count=1000):
        kind = client.type(key)
        inside = {"hash": client.hkeys, "zset": lambda k: client.zrange(k, 0, -1)}.get(kind)
        out[key] = (kind, frozenset(inside(key) if inside else ()))
    return out


# -- what is corrupted, and how ----------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """A key the call touches. ``role``: its name in the script's header ('due') or, for an
    undeclared one, 'run:<id>' / 'hist:<id>'; ``kind``: the type the scripts expect there."""

    role: str
    kind: str
    exists: bool  # before the call
    fields: tuple[str, ...] = ()  # an existing hash's fields, before or after the call


def targets(scenario: Scenario, call: Call, before: Shape, after: Shape) -> Iterator[Target]:
    """The call's declared KEYS (from the header and the call), then the records and
    histories of the runs it names, its indexes list, or the keyspace holds before or after."""
    header = headers()[scenario.script]
    declared = dict(zip(header.keys, call.keys, strict=True))

    def target(role: str, key: str, kind: str) -> Target:
        fields: set[str] = set()
        if key in before and kind == "hash":
            for state in (before, after):
                if state.get(key, ("none",))[0] == "hash":
                    fields |= state[key][1]
        return Target(role, kind, key in before, tuple(sorted(fields)))

    for role, key in declared.items():
        yield target(role, key, header.kind_of(role))
    if not scenario.prefix:
        return
    runs = set(scenario.names)
    for key in declared.values():
        if before.get(key, ("none",))[0] == "zset":
            runs |= before[key][1]
    for key in before.keys() | after.keys():
        for part in (RECORD, HISTORY):
            if key.startswith(scenario.prefix + part):
                runs.add(key[len(scenario.prefix + part) :])
    for run_id in sorted(runs):
        for part, kind in ((RECORD, "hash"), (HISTORY, "list")):
            key = scenario.prefix + part + run_id
            if key not in declared.values():
                yield target(part + run_id, key, kind)
    for role, kind in EVENT_KEYS:
        yield target(role, scenario.prefix + role, kind)


@dataclass(frozen=True)
class Corruption:
    name: str
    plant: Callable[[Any, str], object] = field(compare=False)


FOREIGN: dict[str, Callable[[Any, str], object]] = {
    "string": lambda client, key: client.set(key, "garbage"),
    "list": lambda client, key: client.rpush(key, "garbage"),
    "set": lambda client, key: client.sadd(key, "garbage"),
    "hash": lambda client, key: client.hset(key, "garbage", "garbage"),
    "zset": lambda client, key: client.zadd(key, {"garbage": 0}),
    "stream": lambda client, key: client.xadd(key, {"garbage": "garbage"}),
}


def foreign(kind: str) -> Corruption:
    def plant(client: Any, key: str) -> None:
        client.delete(key)
        FOREIGN[kind](client, key)

    return Corruption(f"a {kind}", plant)


def ghost(where: str) -> Corruption:
    """A member without a record: scored first (below every member and the clock), or at
    -inf or +inf."""

    def plant(client: Any, key: str) -> None:
        first = min([NOW, *(score for _, score in client.zrange(key, 0, 0, withscores=True))])
        client.zadd(key, {"ghost": first - 1 if where == "first" else where})

    return Corruption(f"ghost member at {where}", plant)


def corruptions(target: Target) -> list[Corruption]:
    out = [foreign(kind) for kind in KINDS if kind != target.kind]
    if target.exists:
        out.append(Corruption("deleted", lambda client, key: client.delete(key)))
    if target.kind == "hash":
        out += [
            Corruption(f"{f}={v!r}", lambda client, key, f=f, v=v: client.hset(key, f, v))
            for f in target.fields
            for v in GARBAGE
        ]
    elif target.kind == "string":
        out += [Corruption(f"={v!r}", lambda client, key, v=v: client.set(key, v))
                for v in GARBAGE]
    elif target.kind == "zset":
        out += [ghost(where) for where in ("first", "-inf", "+inf")]
    elif target.kind == "list":
        out.append(Corruption("overfull", lambda client, key: client.rpush(key, *["1"] * 100)))
    return out


@dataclass(frozen=True)
class Case:
    scenario: Scenario
    target: Target
    corruption: Corruption

    @property
    def id(self) -> str:
        return f"{self.scenario.name}:{self.target.role}:{self.corruption.name}"


def survey() -> list[Case]:
    """Every case: each scenario built on a private fakeredis and its call run once, to see the
    keys, fields and members there are before and after; every corruption of every key."""
    cases = []
    for scenario in SCENARIOS.values():
        client = fakeredis.FakeRedis(server=fakeredis.FakeServer(), decode_responses=True)
        runner = ScriptRunner(client)
        call = scenario.build(runner)
        before = shape(client)
        runner.run(call)
        for target in targets(scenario, call, before, shape(client)):
            cases += [Case(scenario, target, c) for c in corruptions(target)]
        client.close()
    return cases


CASES = survey()
# The cases by scenario and key: each key's corruptions, one test.
BY_KEY: dict[str, list[Case]] = {}
for _case in CASES:
    BY_KEY.setdefault(f"{_case.scenario.name}:{_case.target.role}", []).append(_case)


# -- the check ---------------------------------------------------------------------------------

Dumps = list[tuple[str, bytes, int]]  # key, DUMP, PEXPIRETIME
_built: dict[tuple[str, str], tuple[Call, Dumps]] = {}


def set_up(scenario: Scenario, runner: ScriptRunner, backend: str) -> Call:
    """The scenario's state on an empty server, and its call: built by the first case on each
    backend, restored from that build's DUMPs for the next ones."""
    client = runner.client
    built = _built.get((backend, scenario.name))
    if built is None:
        call = scenario.build(runner)
        pipe = client.pipeline(transaction=False)
        keys = sorted(client.keys("*"))
        for key in keys:
            pipe.dump(key)
            pipe.execute_command("PEXPIRETIME", key)
        replies = pipe.execute()
        _built[(backend, scenario.name)] = (call, [
            (key, replies[2 * i], replies[2 * i + 1]) for i, key in enumerate(keys)
        ])
        return call
    call, dumps = built
    pipe = client.pipeline(transaction=False)
    for key, dump, expires_at in dumps:
        pipe.restore(key, 0, dump)
        if expires_at >= 0:
            pipe.pexpireat(key, int(expires_at))  # fakeredis 2.26 replies a float
    pipe.execute()
    return call


def key_of(case: Case, call: Call) -> str:
    header = headers()[case.scenario.script]
    if case.target.role in header.keys:
        return call.keys[header.keys.index(case.target.role)]
    return case.scenario.prefix + case.target.role


def check(case: Case, call: Call, runner: ScriptRunner) -> None:
    """Plant the corruption in the scenario's state and make its call: refused with nothing
    changed, or gone through with a reply that parses and no key turned into a type that is
    neither its own nor the declared one."""
    client = runner.client
    key = key_of(case, call)
    case.corruption.plant(client, key)
    before = keyspace(client)
    try:
        reply = runner.run(call)
    except (ScriptError, ConnectionFailed) as refused:
        changed = differences(before, keyspace(client))
        assert not changed, f"{call.script} raised after writing {changed}: {refused}"
        return
    case.scenario.parse(reply)
    after = kinds(client)
    declared = dict(zip(call.keys, headers()[call.script].kinds, strict=True))
    declared[key] = case.target.kind
    retyped = [
        f"{k}: {before[k].kind} -> {after[k]}"
        for k in before.keys() & after.keys()
        if after[k] not in (before[k].kind, declared.get(k))
    ]
    assert not retyped, f"{call.script} turned {retyped}"


@pytest.fixture(scope="module")
def survey_connection(real_server: EmbeddedServer) -> Iterator[ScriptRunner]:
    """One connection for the whole survey: a case's cost is its own commands, not a new
    client, a script cache flushed and every script compiled again (scripts hold no state:
    the same source is the same script)."""
    client = redis.Redis.from_url(real_server.url, decode_responses=True, encoding_errors="replace")
    runner = ScriptRunner(client)
    yield runner
    client.close()


@pytest.fixture
def survey_runner(survey_connection: ScriptRunner) -> ScriptRunner:
    survey_connection.client.flushall()
    return survey_connection


# On the real server only: what is checked is Redis's own behaviour (a script that fails
# half-way is not rolled back), and the survey's 10,000 cases on a second backend would cost a
# minute and a half of every run. fakeredis runs each scenario on clean data below.
@pytest.mark.parametrize("cases", BY_KEY.values(), ids=list(BY_KEY))
def test_a_script_on_corrupt_data_is_refused_whole_or_goes_through(
    cases: list[Case], survey_runner: ScriptRunner
) -> None:
    """Each corruption of the key, on a fresh copy of the scenario's state."""
    failures = []
    for case in cases:
        survey_runner.client.flushall()
        try:
            check(case, set_up(case.scenario, survey_runner, "real"), survey_runner)
        except Exception as exc:  # any exception fails the case: each one is reported
            failures.append(f"{case.id}: {type(exc).__name__}: {exc}")
    assert failures == []


def test_every_script_has_a_scenario() -> None:
    assert {s.script for s in SCENARIOS.values()} == set(SCRIPT_NAMES)


@pytest.mark.parametrize("scenario", SCENARIOS.values(), ids=list(SCENARIOS))
def test_each_scenario_goes_through_and_writes_on_clean_data(
    scenario: Scenario, runner: ScriptRunner, redis_client: Any
) -> None:
    """The scenarios are not vacuous: uncorrupted, each call succeeds, and each writing script
    changes the keyspace (sched_due is read-only, and a paused claim changes nothing)."""
    call = scenario.build(runner)
    before = keyspace(redis_client)
    scenario.parse(runner.run(call))
    changed = differences(before, keyspace(redis_client))
    read_only = scripts()[scenario.script].source.startswith("#!lua flags=no-writes")
    assert (not changed) if read_only or not scenario.writes else changed


def broken(name: str, old: str, new: str) -> Script:
    good = scripts()[name]
    source, plain = good.source.replace(old, new, 1), good.plain.replace(old, new, 1)
    assert source != good.source
    return Script(name, source, hashlib.sha1(source.encode()).hexdigest(),
                  plain, hashlib.sha1(plain.encode()).hexdigest())


def test_the_check_catches_a_script_that_writes_before_it_reads(
    runner: ScriptRunner, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check is not vacuous: a complete.lua that counts a completion before its read
    phase, refused on a foreign leases key, has still written the stats hash."""
    catches_a_complete_that_writes_first(runner, backend, monkeypatch)


def test_the_survey_connection_catches_a_script_that_writes_before_it_reads(
    survey_runner: ScriptRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same through the survey's shared connection, which keeps the script cache."""
    catches_a_complete_that_writes_first(survey_runner, "real", monkeypatch)


def catches_a_complete_that_writes_first(
    runner: ScriptRunner, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    (case,) = [c for c in CASES if c.id == "complete:leases:a string"]
    call = set_up(case.scenario, runner, backend)
    monkeypatch.setitem(scripts(), "complete", broken(
        "complete", "local ok, plan = reading(",
        "redis.call('HINCRBY', KEYS[3], 'completed', 1)\nlocal ok, plan = reading(",
    ))
    with pytest.raises(AssertionError, match=r"complete raised after writing .*stats changed"):
        check(case, call, runner)
