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
from dataclasses import dataclass
from typing import Any

from jobqueue.client.core import ClientCore
from jobqueue.store.flows import DELIVER, RELAYED, Delivery
from jobqueue.store.io import Scripts, Steps, cmd, commands
from jobqueue.store.keys import PartitionKeys
from jobqueue.store.runs import CANCEL
from jobqueue.store.scripts import Call
from jobqueue.workflows.canvas import MAX_RESULTS_BYTES

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
                  cmd("hget", keys.run(o), "cancel_running")]
    replies = list((yield commands(*reads))) if reads else []

    deliveries: dict[PartitionKeys, list[Delivery]] = {}
    for run_id, fields in zip(runs, replies[: len(runs)], strict=True):
        if isinstance(fields, Exception) or not fields or fields[0] not in _OUTCOME:
            continue  # no record, not one, or running again (requeued): nothing to tell
        state, result, error, parents = fields
        outcome = _OUTCOME[state] + (
            (result if result is not None else "null") if state == "done" else (error or "")
        )
        for queue, parent in _parents(parents):
            yield from core._register_queue(queue)
            target = core.keys_for(queue, parent)
            deliveries.setdefault(target, []).append(Delivery(parent, run_id, outcome))

    cancels: list[Call] = []
    cancelled_in: list[PartitionKeys] = []
    at = len(runs)
    s = core.settings
    for order in orders:
        deps, got, running = replies[at : at + 3]
        at += 3
        if isinstance(deps, Exception) or isinstance(got, Exception):
            continue
        for child, spec in (deps or {}).items():
            if child in (got or {}):
                continue
            queue = str(spec).split("|", 2)[-1]
            yield from core._register_queue(queue)
            reason = f"cancelled: the run waiting on it ({order}) ended"
            target = core.keys_for(queue, child)
            cancels.append(CANCEL.call(target, child, s.done_retention_ms, reason,
                                       running=running == "1"))
            cancelled_in.append(target)

    calls = [
        DELIVER.call(pk, ds, s.dead_retention_ms, MAX_RESULTS_BYTES)
        for pk, ds in deliveries.items()
    ]
    delivered = 0
    if calls:
        results = yield Scripts(calls)
        delivered = sum(sum(DELIVER.parse(r)) for r in results)
    cancelled = 0
    if cancels:
        results = yield Scripts(cancels)
        cancelled = sum(1 for r in results if CANCEL.parse(r).changed)
    done = RELAYED.call(keys, entries, s.done_retention_ms, s.dead_retention_ms)
    (removed,) = yield Scripts([done])
    # A run told or cancelled may have finished and gone to its own outbox.
    touched = tuple(dict.fromkeys([*deliveries, *cancelled_in]))
    return Relayed(RELAYED.parse(removed), delivered, cancelled, touched)


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


def relay_until_quiet(core: Any, keys: PartitionKeys) -> int:
    """``relay_cascade_steps`` on a sync client."""
    relayed: int = core.run_steps(relay_cascade_steps(core, keys))
    return relayed
