"""The relay: carries a partition's outbox to the runs waiting on its finished runs (I/O-free
steps, driven by the worker after its commits and every few seconds for the partitions it
serves, and by the client after a cancel).

An outbox entry is a finished run whose record lists the runs waiting on it ('parents'), or
an order '!<run_id>' to cancel the unfinished dependencies of a waiting run that died or was
cancelled. For each entry the relay reads what it needs, delivers (deliver.lua in each
waiting run's partition: a dependency is counted once, by its run id, however many times it
is delivered), carries out the orders (cancel.lua), and only then removes the entries it read
(relayed.lua, which leaves an entry whose version changed meanwhile). A relay that dies half
way leaves every entry it did not remove; the next one delivers again, and nothing is counted
twice.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from jobqueue.client.core import ClientCore
from jobqueue.errors import ConnectionFailed, JobQueueError
from jobqueue.store.flows import (
    DELIVER,
    FLOW_ABORT,
    FLOW_COMMIT,
    FLOW_TIDY,
    RELAYED,
    Delivered,
    Delivery,
    DepSpec,
    parse_dep_spec,
    parse_mark,
)
from jobqueue.store.io import DurableScripts, Scripts, Steps, cmd, commands, raised
from jobqueue.store.keys import PartitionKeys
from jobqueue.store.runs import CANCEL
from jobqueue.store.scripts import Call

log = logging.getLogger("jobqueue.workflows")

RELAY_BATCH = 200  # outbox entries per pass

_OUTCOME = {"done": "d", "dead": "x", "cancelled": "c"}


@dataclass(frozen=True)
class Relayed:
    entries: int  # outbox entries removed
    delivered: int  # dependencies counted for the first time
    cancelled: int  # runs cancelled by orders
    touched: tuple[PartitionKeys, ...]  # partitions whose outboxes may have new entries


def _parents(text: str | None) -> list[tuple[str, str]]:
    try:
        value = json.loads(text or "[]")
    except ValueError:
        return []
    return [
        (p[0], p[1])
        for p in value if isinstance(value, list)
        if isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p)
    ]


def relay_steps(core: ClientCore, keys: PartitionKeys) -> Steps[Relayed]:
    (entries,) = yield commands(cmd("zrange", keys.outbox, 0, RELAY_BATCH - 1, withscores=True))
    if isinstance(entries, Exception) or not entries:
        return Relayed(0, 0, 0, ())
    entries = [(m.decode() if isinstance(m, bytes) else m, s) for m, s in entries]
    runs = [m for m, _ in entries if not m.startswith("!")]
    orders = [m[1:] for m, _ in entries if m.startswith("!")]
    reads = [cmd("hmget", keys.run(r), "state", "result", "error", "parents") for r in runs]
    for o in orders:
        reads += [cmd("hgetall", keys.deps(o)), cmd("hgetall", keys.got(o)),
                  cmd("hmget", keys.run(o), "cancel_running", "flow")]
    replies = list((yield commands(*reads))) if reads else []

    deliveries: dict[PartitionKeys, list[Delivery]] = {}
    told: dict[str, int] = {}  # the 'parents' each finished run's outcome is delivered to
    for run_id, fields in zip(runs, replies[: len(runs)], strict=True):
        if isinstance(fields, Exception) or not fields or fields[0] not in _OUTCOME:
            continue  # no record, not one, or running again (requeued): nothing to tell
        state, result, error, parents = fields
        told[run_id] = len((parents or "").encode())
        outcome = _OUTCOME[state] + (
            (result if result is not None else "null") if state == "done" else (error or "")
        )
        for queue, parent in _parents(parents):
            target = yield from _partition(core, queue, parent, run_id)
            if target is not None:
                deliveries.setdefault(target, []).append(Delivery(parent, run_id, outcome))

    s = core.settings
    cancels = yield from _cancels(core, orders, replies[len(runs):])
    result = yield from _deliver(core, deliveries)
    delivered = result.counted
    if not result.durable:
        # A replica may not have the deliveries: a failover could lose them, so the entries
        # stay for the next relay (delivering again changes nothing).
        log.warning("deliveries from %s were not acknowledged by %d replica(s) in time; its "
                    "outbox entries are kept for the next relay", keys.tag, s.durable_replicas)
        return Relayed(0, delivered, 0, tuple(deliveries))
    cancelled = 0
    for _target, call in cancels:
        try:
            (reply,) = yield Scripts([call])
            cancelled += CANCEL.parse(reply).changed
        except ConnectionFailed:
            raise
        except JobQueueError as exc:  # that run's own foreign data: reported, not retried
            log.error("a workflow's cancel of %s failed: %s", call.args[2], exc)
    done = RELAYED.call(keys, [(m, v, told.get(m)) for m, v in entries], s.done_retention_ms,
                        s.dead_retention_ms)
    (removed,) = yield Scripts([done])
    # A run told (that died or was cancelled) or cancelled went to its own outbox.
    touched = tuple(dict.fromkeys([*result.finished, *(t for t, _ in cancels)]))
    return Relayed(RELAYED.parse(removed), delivered, cancelled, touched)


@dataclass(frozen=True)
class Committed:
    """A run its worker just completed, that others wait on (complete.lua's answer): what
    the relay would read from its outbox entry and record, known already."""

    keys: PartitionKeys
    run_id: str
    result_json: str
    parents: str
    version: int

    @property
    def told(self) -> int:
        """The length of 'parents' in bytes, as relayed.lua checks it."""
        return len(self.parents.encode())


def plan_deliveries(
    core: ClientCore, committed: Sequence[Committed]
) -> Steps[dict[PartitionKeys, list[Delivery]]]:
    """The deliveries of ``committed``, by the partition of each waiting run (no I/O but a
    queue's first registration)."""
    deliveries: dict[PartitionKeys, list[Delivery]] = {}
    for c in committed:
        for queue, parent in _parents(c.parents):
            target = yield from _partition(core, queue, parent, c.run_id)
            if target is not None:
                deliveries.setdefault(target, []).append(
                    Delivery(parent, c.run_id, "d" + c.result_json)
                )
    return deliveries


def relay_committed_steps(core: ClientCore, committed: Sequence[Committed]) -> Steps[int]:
    """The fast path of a worker's commit: deliver the completions it just made to the runs
    waiting on them, then clear their outbox entries at the versions complete.lua gave (one
    round trip each, for the whole commit batch), without reading the outboxes and records
    first. What cannot be cleared, and what else the outboxes hold, waits for the sweep.
    Then the partitions where a waiting run died or was cancelled are relayed (its own
    waiting runs, and a fail policy's cascade).
    Returns the dependencies counted."""
    deliveries = yield from plan_deliveries(core, committed)
    result = yield from _deliver(core, deliveries)
    if not result.durable:
        log.warning("deliveries of %d completions were not acknowledged by %d replica(s) in "
                    "time; their outbox entries are kept for the next relay", len(committed),
                    core.settings.durable_replicas)
        return result.counted
    s = core.settings
    by_source: dict[PartitionKeys, list[tuple[str, float, int | None]]] = {}
    for c in committed:
        by_source.setdefault(c.keys, []).append((c.run_id, c.version, c.told))
    yield Scripts([RELAYED.call(pk, entries, s.done_retention_ms, s.dead_retention_ms)
                   for pk, entries in by_source.items()])
    for pk in result.finished:  # a waiting run there died or was cancelled: its cascade
        yield from relay_cascade_steps(core, pk)
    return result.counted


def _partition(
    core: ClientCore, queue: str, run_id: str, source: str
) -> Steps[PartitionKeys | None]:
    """Where ``run_id`` of ``queue`` lives, or None (logged) for a queue no command can use:
    a foreign 'parents' entry is that one run's problem, never the whole outbox's."""
    try:
        yield from core._register_queue(queue)
    except ConnectionFailed:
        raise
    except JobQueueError as exc:
        log.error("run %s names a run %s of queue %r it cannot tell: %s", source, run_id,
                  queue, exc)
        return None
    return core.keys_for(queue, run_id)


@dataclass
class _Delivered:
    counted: int = 0  # dependencies counted for the first time
    durable: bool = True  # the replicas Settings.durable_* asks for have the deliveries
    finished: set[PartitionKeys] = field(default_factory=set)  # new outbox entries there


def _deliver(
    core: ClientCore, deliveries: dict[PartitionKeys, list[Delivery]]
) -> Steps[_Delivered]:
    """All deliveries in one round trip; when a call is refused (a waiting run's keys hold
    foreign data, which refuses its partition's whole call), one delivery at a time, and
    the ones still refused are reported and dropped: the others still go."""
    out = _Delivered()
    if not deliveries:
        return out
    calls = [deliver_call(core, pk, ds) for pk, ds in deliveries.items()]
    try:
        results, out.durable = yield from _send(core, calls)
        for pk, reply in zip(deliveries, results, strict=True):
            _add(out, pk, DELIVER.parse(reply))
        return out
    except ConnectionFailed:
        raise  # (a slot moving, a failover: the entries stay for the next relay)
    except JobQueueError:
        pass
    out = _Delivered()
    for pk, ds in deliveries.items():
        for d in ds:
            try:
                (reply,), acked = yield from _send(core, [deliver_call(core, pk, [d])])
                _add(out, pk, DELIVER.parse(reply))
                out.durable = out.durable and acked
            except ConnectionFailed:
                raise
            except JobQueueError as exc:
                log.error("dropped the delivery of %s to %s: %s", d.dependency_id,
                          d.waiting_id, exc)
    return out


def deliver_call(core: ClientCore, pk: PartitionKeys, deliveries: Sequence[Delivery]) -> Call:
    s = core.settings
    return DELIVER.call(pk, deliveries, s.dead_retention_ms, s.max_results_bytes,
                        s.done_retention_ms)


def _add(out: _Delivered, pk: PartitionKeys, reply: Delivered) -> None:
    out.counted += sum(reply.counted)
    if reply.finished:
        out.finished.add(pk)


def _send(core: ClientCore, calls: list[Call]) -> Steps[tuple[list[Any], bool]]:
    s = core.settings
    if not s.durable:
        replies: list[Any] = yield Scripts(calls)
        return replies, True
    got: tuple[list[Any], bool] = yield DurableScripts(
        calls, s.durable_replicas, s.durable_fsync, s.durable_timeout_ms
    )
    return got


def _cancels(
    core: ClientCore, orders: list[str], replies: list[Any]
) -> Steps[list[tuple[PartitionKeys, Call]]]:
    """The cancels the orders ask for: each order's dependencies not heard of, of its own
    workflow (a run created before it and waited on is not the workflow's to cancel), and
    waited on by no other run still waiting (a shared dependency another run needs)."""
    s = core.settings
    candidates: list[tuple[str, str, PartitionKeys, bool]] = []  # order, child, where, running
    flows: dict[str, str | None] = {}
    for i, order in enumerate(orders):
        deps, got, fields = replies[3 * i : 3 * i + 3]
        if isinstance(deps, Exception) or isinstance(got, Exception) or not deps:
            continue
        running, flow = fields if isinstance(fields, list) else (None, None)
        flows[order] = flow
        for child, spec in deps.items():
            if child in (got or {}):
                continue
            target = yield from _partition(core, parse_dep_spec(spec).queue, child, order)
            if target is not None:
                candidates.append((order, child, target, running == "1"))
    if not candidates:
        return []
    found = yield commands(
        *(cmd("hmget", t.run(c), "flow", "parents") for _, c, t, _ in candidates)
    )
    others: list[tuple[int, PartitionKeys, str]] = []
    keep: list[bool] = []
    for n, ((order, child, _, _), fields) in enumerate(zip(candidates, found, strict=True)):
        flow, parents = fields if isinstance(fields, list) else (None, None)
        keep.append(flow is not None and flow == flows.get(order))
        for queue, parent in _parents(parents):
            if parent != order:
                where = yield from _partition(core, queue, parent, child)
                if where is not None:
                    others.append((n, where, parent))
    if others:
        states = yield commands(*(cmd("hget", w.run(p), "state") for _, w, p in others))
        for (n, _, _), state in zip(others, states, strict=True):
            if state == "waiting":
                keep[n] = False
    return [
        (target, CANCEL.call(target, child, s.done_retention_ms,
                             f"cancelled: the run waiting on it ({order}) ended",
                             running=running))
        for (order, child, target, running), kept in zip(candidates, keep, strict=True)
        if kept
    ]


def relay_cascade_steps(core: ClientCore, keys: PartitionKeys, rounds: int = 20) -> Steps[int]:
    """Relay ``keys`` and the partitions it delivered to, until no outbox they hold has more
    (a cascade: a run dies, the run waiting on it dies, ...), at most ``rounds`` passes.
    Returns the entries relayed."""
    todo, total = [keys], 0
    for _ in range(rounds):
        if not todo:
            break
        nxt: dict[PartitionKeys, None] = {}
        for pk in todo:
            r = yield from relay_steps(core, pk)
            total += r.entries
            nxt.update(dict.fromkeys(r.touched))
            if r.entries == RELAY_BATCH:  # more may wait here
                nxt[pk] = None
        todo = list(nxt)
    return total


FLOW_TIDY_ENTRIES = 20  # flows index entries looked at per partition and sweep
AUDIT_RUNS = 50  # waiting runs looked at per partition and audit
AUDIT_READS = 5_000  # dependency records read per partition and audit, at most


def audit_waiting_steps(
    core: ClientCore, keys: PartitionKeys, start: int, min_age_ms: int
) -> Steps[tuple[int, int]]:
    """Deliver to the waiting runs of ``keys`` that waited at least ``min_age_ms`` the
    outcomes of dependencies that finished but that they never heard of: a delivery lost by
    a failover of the waiting run's master after the dependency's outbox entry was cleared,
    or an outbox entry lost by a failover of the dependency's master. AUDIT_RUNS waiting
    runs from rank ``start`` (the caller goes round the index). Returns (the next rank, the
    dependencies counted). A dependency whose record is gone is reported, not guessed at."""
    (now_pair,) = yield commands(cmd("time"))  # alone: a cluster pipeline refuses TIME
    (entries,) = yield commands(
        cmd("zrange", keys.waiting, start, start + AUDIT_RUNS - 1, withscores=True)
    )
    if isinstance(entries, Exception) or isinstance(now_pair, Exception):
        return 0, 0
    now = int(now_pair[0]) * 1000 + int(now_pair[1]) // 1000
    following = start + len(entries) if len(entries) == AUDIT_RUNS else 0
    old = [(m.decode() if isinstance(m, bytes) else m) for m, score in entries
           if score <= now - min_age_ms]
    if not old:
        return following, 0
    replies = yield commands(*(c for rid in old
                               for c in (cmd("hgetall", keys.deps(rid)),
                                         cmd("hkeys", keys.got(rid)))))
    unheard: list[tuple[str, str, DepSpec]] = []  # waiting run, dependency, its entry
    specs: dict[tuple[str, str], DepSpec] = {}  # (waiting run, dependency) -> its entry
    for i, rid in enumerate(old):
        deps, got = replies[2 * i], replies[2 * i + 1]
        if isinstance(deps, Exception) or isinstance(got, Exception):
            continue  # foreign data: deliver.lua reports it when it is delivered to
        heard = set(got or [])
        for dep, spec in (deps or {}).items():
            specs[(rid, dep)] = parse_dep_spec(spec)
            if dep not in heard:
                unheard.append((rid, dep, specs[(rid, dep)]))
        if len(unheard) >= AUDIT_READS:
            following = start + i + 1
            break
    states = yield from _states(core, [(rid, dep, d.queue) for rid, dep, d in unheard])
    found: list[Delivery] = []
    missing: list[tuple[str, str, DepSpec]] = []
    for (rid, dep, d), fields in zip(unheard, states, strict=True):
        if fields is None:
            continue
        state, result, error = fields
        if state in _OUTCOME:
            body = (result if result is not None else "null") if state == "done" else error
            found.append(Delivery(rid, dep, _OUTCOME[state] + (body or "")))
        elif state is None:
            missing.append((rid, dep, d))
    # A run added by a running step (ctx.add_to_flow) and never created: its adder ended
    # between telling the waiting run and creating it (a crash, an attempt that raised and
    # was not retried, a stale attempt). Nothing will create it: the waiting run hears of it
    # as cancelled. Any other missing dependency is reported, not guessed at.
    adders = [(rid, d.adder, specs[(rid, d.adder)].queue) for rid, _, d in missing
              if d.adder is not None and (rid, d.adder) in specs]
    adder_states = yield from _states(core, adders)
    ended = {(rid, adder) for (rid, adder, _), fields in zip(adders, adder_states, strict=True)
             if fields is not None and fields[0] in (*_OUTCOME, None)}
    for rid, dep, d in missing:
        if d.adder is not None and (rid, d.adder) in ended:
            found.append(Delivery(rid, dep, f"cnever created: the run that added it "
                                            f"({d.adder}) ended first"))
        else:
            log.warning("run %s of %s waits on %s of queue %r, which has no record (never "
                        "created, lost in a failover or deleted): cancel the run or create "
                        "its dependency again", rid, keys.tag, dep, d.queue)
    if not found:
        return following, 0
    counted = (yield from _deliver(core, {keys: found})).counted
    if counted:
        log.warning("delivered %d outcomes to waiting runs of %s that had not heard of them "
                    "(a delivery or an outbox entry lost in a failover?)", counted, keys.tag)
    return following, counted


STAGED_RUNS = 200  # waiting runs looked at per partition and audit for a lost commit


def settle_staged_steps(
    core: ClientCore, keys: PartitionKeys, min_age_ms: int, start: int = 0
) -> Steps[tuple[int, int, int]]:
    """Attempts to create a workflow written staged in ``keys`` at least ``min_age_ms`` ago
    whose creating process never finished them (see flow_commit.lua): released when their
    home records their commit, rolled back (flow_abort.lua, home first) otherwise. Looks at
    STAGED_RUNS entries of the staged index from rank ``start`` (the caller goes round it). Returns
    (the next rank, attempts released, attempts rolled back) here; one attempt's trouble
    (foreign data) is logged and the others go on."""
    (now_pair,) = yield commands(cmd("time"))  # alone: a cluster pipeline refuses TIME
    (entries,) = yield commands(
        cmd("zrange", keys.staged, start, start + STAGED_RUNS - 1, withscores=True)
    )
    if isinstance(entries, Exception) or isinstance(now_pair, Exception):
        return 0, 0, 0
    now = int(now_pair[0]) * 1000 + int(now_pair[1]) // 1000
    following = start + len(entries) if len(entries) == STAGED_RUNS else 0
    old = [m for m, score in entries if score <= now - min_age_ms]
    if not old:
        return following, 0, 0
    replies = yield commands(*(cmd("hmget", keys.run(rid), "flow", "staged") for rid in old))
    attempts = dict.fromkeys(
        (reply[0], reply[1]) for reply in replies
        if isinstance(reply, list) and reply[0] and reply[1]
    )
    # An entry whose record is gone or no longer staged (expired after it died, say): it
    # has nothing left to settle.
    stray = [rid for rid, reply in zip(old, replies, strict=True)
             if isinstance(reply, list) and not reply[1]]
    if stray:
        yield commands(cmd("zrem", keys.staged, *stray))
    released = rolled_back = 0
    for fid, staged in attempts:
        try:
            done = yield from _settle_attempt(core, keys, fid, staged)
        except ConnectionFailed:
            raise
        except JobQueueError as exc:
            log.error("settling workflow %s in %s failed: %s", fid, keys.tag, exc)
            continue
        released += done == "released"
        rolled_back += done == "rolled back"
    return following, released, rolled_back


def _settle_attempt(core: ClientCore, keys: PartitionKeys, fid: str, staged: str) -> Steps[str]:
    mark = parse_mark(staged)
    if mark is None:
        log.error("waiting runs of %s name a workflow attempt jobqueue did not write: %r",
                  keys.tag, staged)
        return ""
    home_keys = yield from _partition(core, mark[0], mark[1], f"of workflow {fid}")
    if home_keys is None:
        return ""
    s = core.settings
    ttl = max(s.done_retention_ms, s.dead_retention_ms)  # (the commit's record is kept)

    def commit_here() -> Steps[str]:
        yield Scripts([FLOW_COMMIT.call(keys, fid, staged, "", s.dead_retention_ms,
                                        s.max_results_bytes, ttl)])
        log.warning("released workflow %s in %s: its creator died after the commit", fid,
                    keys.tag)
        return "released"

    def abort_here() -> Steps[str]:
        if home_keys != keys:
            yield Scripts([FLOW_ABORT.call(keys, fid, staged, "")])
        log.warning("rolled back an attempt to create workflow %s in %s: its creator died "
                    "before the commit, or another attempt made it (nothing of it ran)", fid,
                    keys.tag)
        return "rolled back"

    (recorded,) = raised((yield commands(cmd("get", home_keys.flowmark(fid)))))
    if recorded == mark[2]:
        return (yield from commit_here())
    if recorded:  # another attempt committed the workflow: this one's runs go
        return (yield from abort_here())
    (reply,) = yield Scripts([FLOW_ABORT.call(home_keys, fid, staged, mark[1])])
    if FLOW_ABORT.parse(reply) is None:  # it committed meanwhile
        return (yield from commit_here())
    return (yield from abort_here())


def _states(
    core: ClientCore, runs: Sequence[tuple[str, str, str]]
) -> Steps[list[tuple[Any, Any, Any] | None]]:
    """(state, result, error) of each (waiting run, run, its queue), None for a run that
    cannot be read (a queue no command can use, foreign data)."""
    where = []
    for rid, dep, queue in runs:
        where.append((yield from _partition(core, queue, dep, rid)))
    reads = [(dep, k) for (_, dep, _), k in zip(runs, where, strict=True) if k is not None]
    replies = iter((yield commands(*(cmd("hmget", k.run(dep), "state", "result", "error")
                                     for dep, k in reads))) if reads else [])
    out: list[tuple[Any, Any, Any] | None] = []
    for k in where:
        reply = next(replies) if k is not None else None
        out.append(None if reply is None or isinstance(reply, Exception) else tuple(reply))
    return out


def tidy_flows_steps(core: ClientCore, partitions: Sequence[PartitionKeys]) -> Steps[int]:
    """Forget the flows whose records all expired (flow_tidy.lua), a few index entries per
    partition, in one round trip; returns how many were forgotten. A partition whose keys
    hold foreign data is reported and passed over."""
    calls = [FLOW_TIDY.call(pk, FLOW_TIDY_ENTRIES) for pk in partitions]
    if not calls:
        return 0
    try:
        replies = yield Scripts(calls)
    except ConnectionFailed:
        raise
    except JobQueueError:  # one partition's foreign data: the others one at a time
        replies = []
        for call in calls:
            try:
                replies += (yield Scripts([call]))
            except ConnectionFailed:
                raise
            except JobQueueError as exc:
                log.error("tidying the flows index failed: %s", exc)
    return sum(FLOW_TIDY.parse(r)[1] for r in replies)


def relay_until_quiet(core: Any, keys: PartitionKeys) -> int:
    """``relay_cascade_steps`` on a sync client."""
    relayed: int = core.run_steps(relay_cascade_steps(core, keys))
    return relayed


def purge_dead_steps(core: ClientCore, run_ids: Iterable[str], queue: str | None) -> Steps[int]:
    """A purge delivers what its partitions' outboxes hold first: a dead run others wait on
    whose outcome has not reached them yet would otherwise be deleted unheard."""
    ids = list(run_ids)
    located = yield from core._run_states(ids, queue)
    for keys in dict.fromkeys(s.keys for s in located if s.keys is not None):
        yield from relay_cascade_steps(core, keys)
    purged: int = yield from core._purge_dead(ids, queue)
    return purged
