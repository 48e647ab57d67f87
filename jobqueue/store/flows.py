"""The contracts of the workflow scripts (one queue partition each): creating a workflow's
runs (flow_create), attaching existing runs as dependencies (attach), adding runs to waiting
runs in the name of one of their unfinished dependencies (extend), forgetting flows whose
records all expired (flow_tidy), delivering finished
dependencies to the runs waiting on them (deliver) and clearing relayed outbox entries
(relayed). See docs/design.md, "Workflows"."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from jobqueue.store.contract import Contract, NowArg, Wire, now_arg
from jobqueue.store.keys import PartitionKeys

POLICIES = ("fail", "ignore", "continue", "remove", "skip")


@dataclass(frozen=True, slots=True)
class DepSpec:
    """A waiting run's entry for one dependency in jq:{q#p}:deps:<run_id>:
    '<index>|<policy>|<queue>', and '|<adder>' for a run added by a running step
    (extend.lua)."""

    index: int
    policy: str
    queue: str
    adder: str | None = None


def parse_dep_spec(spec: Any) -> DepSpec:
    """A deps entry as jobqueue writes it; anything else reads as index 0, policy fail."""
    parts = str(spec).split("|", 3)
    index = int(parts[0]) if parts[0].isdigit() else 0
    policy = parts[1] if len(parts) > 1 else "fail"
    queue = parts[2] if len(parts) > 2 else ""
    return DepSpec(index, policy, queue, parts[3] if len(parts) > 3 and parts[3] else None)


@dataclass(slots=True)
class Edge:
    """A dependency of a waiting run: the run it waits on, where that run lives, and what its
    death does (one of POLICIES)."""

    run_id: str
    queue: str
    policy: str = "fail"


@dataclass(slots=True)
class NodeSpec:
    """One run of a workflow as flow_create writes it."""

    run_id: str
    task: str
    payload: str
    max_attempts: int = 3
    lease_ms: int = 0
    timeout_ms: int = 0
    parents: str = ""  # JSON list of [queue, run_id] of the runs waiting on this one
    flow: str = ""
    receives: str = ""  # '', 'one' or 'all'
    args_tail: str = ""  # the payload's text after the results (see deliver.lua)
    cancel_running: bool = False
    on_death_only: bool = False  # runs only when a dependency died (a batch's on_dead)
    deps: list[Edge] = field(default_factory=list)


def _flow_create(
    pk: PartitionKeys,
    nodes: Sequence[NodeSpec],
    now: NowArg = None,
    flow_at: int | None = None,
    staged: str = "",
    mark: tuple[int, str, str] | None = None,
) -> Wire:
    """``flow_at``: the flow's creation time for its flows index entry (None: now);
    ``staged``: this attempt's mark (``stage_mark``) to write every run staged (see
    flow_commit.lua), '' to make them ready at once; ``mark``: (ttl_ms, nonce, flow_id) to
    record the commit of a creation made whole in this call."""
    tail: list[str | int] = []
    for n in nodes:
        tail += [
            n.run_id, n.task, n.payload, n.max_attempts, n.lease_ms, n.timeout_ms, n.parents,
            n.flow, n.receives, n.args_tail, int(n.cancel_running), int(n.on_death_only),
            len(n.deps),
        ]
        for e in n.deps:
            tail += [e.run_id, e.policy, e.queue]
    return Wire(pk, {"now": now_arg(now), "prefix": pk.prefix,
                     "flow_at": "" if flow_at is None else int(flow_at), "staged": staged,
                     "mark": "" if mark is None else f"{int(mark[0])} {mark[1]} {mark[2]}"},
                tail)


def _parse_created(reply: Sequence[Any]) -> list[bool]:
    return [int(x) == 1 for x in reply[1:]]


FLOW_CREATE = Contract(
    "flow_create",
    build=_flow_create,
    parse=_parse_created,
)


def _attach(
    pk: PartitionKeys, parent: str, run_ids: Sequence[str], now: NowArg = None
) -> Wire:
    """``parent``: the JSON text ["queue","run_id"] of the waiting run."""
    return Wire(pk, {"now": now_arg(now), "prefix": pk.prefix, "parent": parent}, run_ids)


def _parse_flags(reply: Sequence[Any]) -> list[bool]:
    return [int(x) == 1 for x in reply]


ATTACH = Contract(
    "attach",
    build=_attach,
    parse=_parse_flags,
)


def _extend(
    pk: PartitionKeys,
    adder: str,
    added: Sequence[tuple[str, str]],
    waiting: Sequence[str],
    now: NowArg = None,
) -> Wire:
    """``added``: (run_id, queue) of each new dependency; ``waiting``: the runs to extend."""
    tail: list[str | int] = []
    for run_id, queue in added:
        tail += [run_id, queue]
    tail += list(waiting)
    return Wire(pk, {"now": now_arg(now), "prefix": pk.prefix, "adder": adder,
                     "n": len(added)}, tail)


EXTEND = Contract(
    "extend",
    build=_extend,
    parse=_parse_flags,
)


@dataclass(frozen=True, slots=True)
class Delivery:
    """A finished dependency for a waiting run: outcome 'd' + result JSON (done), 'x' +
    error (dead) or 'c' + reason (cancelled)."""

    waiting_id: str
    dependency_id: str
    outcome: str


def _deliver(
    pk: PartitionKeys,
    deliveries: Sequence[Delivery],
    dead_retention_ms: int,
    max_bytes: int,
    retention_ms: int,
    now: NowArg = None,
) -> Wire:
    tail: list[str | int] = []
    for d in deliveries:
        tail += [d.waiting_id, d.dependency_id, d.outcome]
    return Wire(
        pk,
        {
            "now": now_arg(now),
            "prefix": pk.prefix,
            "dead_retention_ms": dead_retention_ms,
            "max_bytes": max_bytes,
            "retention_ms": retention_ms,
        },
        tail,
    )


class Delivered(NamedTuple):
    counted: list[bool]  # per delivery: counted now (False: heard of before, or not waited)
    finished: int  # waiting runs that died or were cancelled: new outbox entries


def _parse_delivered(reply: Sequence[Any]) -> Delivered:
    return Delivered([int(x) == 1 for x in reply[:-1]], int(reply[-1]))


DELIVER = Contract(
    "deliver",
    build=_deliver,
    parse=_parse_delivered,
)


def _flow_tidy(pk: PartitionKeys, n: int, now: NowArg = None) -> Wire:
    return Wire(pk, {"now": now_arg(now), "prefix": pk.prefix, "n": n})


def _parse_tidied(reply: Sequence[Any]) -> tuple[int, int]:
    """(index entries looked at, flows forgotten)."""
    return int(reply[0]), int(reply[1])


FLOW_TIDY = Contract(
    "flow_tidy",
    build=_flow_tidy,
    parse=_parse_tidied,
)


def _relayed(
    pk: PartitionKeys,
    entries: Sequence[tuple[str, float] | tuple[str, float, int | None]],
    retention_ms: int,
    dead_retention_ms: int,
    now: NowArg = None,
) -> Wire:
    """``entries``: member, the version read and the length in bytes of the record's
    'parents' delivered to (None, or left out: not checked)."""
    tail: list[str | int] = []
    for member, version, *told in entries:
        tail += [member, int(version), "" if not told or told[0] is None else int(told[0])]
    return Wire(
        pk,
        {
            "now": now_arg(now),
            "prefix": pk.prefix,
            "retention_ms": retention_ms,
            "dead_retention_ms": dead_retention_ms,
        },
        tail,
    )


RELAYED = Contract(
    "relayed",
    build=_relayed,
    parse=int,
)

def stage_mark(queue: str, run_id: str, nonce: str) -> str:
    """An attempt's mark, as its staged runs' 'staged' field holds it (flow_create.lua): the
    workflow's home run, and the attempt's nonce (letters and digits)."""
    return json.dumps([queue, run_id, nonce], separators=(",", ":"), ensure_ascii=False)


def parse_mark(text: object) -> tuple[str, str, str] | None:
    """(home queue, home run id, nonce) of a 'staged' field jobqueue wrote, else None."""
    try:
        queue, run_id, nonce = json.loads(str(text))
    except (TypeError, ValueError):
        return None
    if all(isinstance(x, str) for x in (queue, run_id, nonce)) and nonce.isalnum():
        return queue, run_id, nonce
    return None


def _flow_commit(
    pk: PartitionKeys,
    flow_id: str,
    staged: str,
    home_run: str,
    dead_retention_ms: int,
    max_bytes: int,
    mark_ttl_ms: int,
    now: NowArg = None,
) -> Wire:
    """``home_run``: the home run's id in its own partition (the commit), else ''."""
    return Wire(pk, {"now": now_arg(now), "prefix": pk.prefix, "flow_id": flow_id,
                     "staged": staged, "home_run": home_run,
                     "dead_retention_ms": dead_retention_ms, "max_bytes": max_bytes,
                     "mark_ttl_ms": mark_ttl_ms})


class FlowCommit(NamedTuple):
    """flow_commit's answer: committed (with the runs released), or refused: 'aborted' (this
    attempt was undone) or 'other' (another attempt committed the workflow)."""

    committed: bool
    released: int = 0
    refused: str = ""


def _parse_committed(reply: Sequence[Any]) -> FlowCommit:
    if int(reply[0]) == 1:
        return FlowCommit(True, int(reply[1]))
    return FlowCommit(False, refused=str(reply[1]))


FLOW_COMMIT = Contract(
    "flow_commit",
    build=_flow_commit,
    parse=_parse_committed,
)


def _flow_abort(
    pk: PartitionKeys, flow_id: str, staged: str, home_run: str, now: NowArg = None
) -> Wire:
    return Wire(pk, {"now": now_arg(now), "prefix": pk.prefix, "flow_id": flow_id,
                     "staged": staged, "home_run": home_run})


def _parse_aborted(reply: Sequence[Any]) -> int | None:
    """The runs deleted, or None: committed already (in the home's partition)."""
    return int(reply[1]) if int(reply[0]) == 1 else None


FLOW_ABORT = Contract(
    "flow_abort",
    build=_flow_abort,
    parse=_parse_aborted,
)

CONTRACTS = (
    FLOW_CREATE, ATTACH, EXTEND, DELIVER, RELAYED, FLOW_TIDY, FLOW_COMMIT, FLOW_ABORT
)
