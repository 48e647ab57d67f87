"""Creating a workflow's runs (I/O-free steps, driven by either client; the graph comes from
jobqueue.workflows.canvas).

Everything is checked before the first write: the arguments of every step (as an enqueue
checks them), the graph (no cycle, every edge inside it), and every run created before that a
step waits on (it must exist, in the queue its handle names). Then the runs are written:

- in one script call when they all live in one queue partition and wait on no older run:
  all of them or none;
- otherwise the waiting runs of every partition first, then the older runs they wait on are
  told (attach.lua), then the runs that wait on nothing. A dependency that finishes thus
  always finds the run waiting on it, and no step runs before the runs waiting on it exist.
  A crash between these calls leaves a part of the workflow: creating it again with the same
  ``flow_id`` writes the rest (every run is created once, by its run id), and writes nothing
  when it is all there.

A running step adds runs to its flow (``ctx.add_to_flow``, a batch's children added from
inside one) in two steps: the runs waiting on it are told to wait on the new runs too
(extend.lua, refused by a run that no longer waits on it), then the new runs are created,
saying they are waited on. A crash between the two leaves the waiting runs waiting on runs
that do not exist: the step's attempt then fails (the worker does not commit a step whose add
raised), and its next attempt adds the same run ids again.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jobqueue.anomalies import is_wrong_type, score_ms
from jobqueue.client.core import ClientCore
from jobqueue.client.relay import relay_cascade_steps
from jobqueue.errors import ConfigError, CorruptData, FlowFinished, RunNotFound
from jobqueue.models import DependencyState
from jobqueue.payload import args_tail, encode_payload
from jobqueue.store.flows import ATTACH, EXTEND, FLOW_CREATE, Edge, NodeSpec, parse_dep_spec
from jobqueue.store.io import Scripts, Steps, cmd, commands
from jobqueue.store.keys import PartitionKeys, validate_run_id
from jobqueue.workflows.canvas import Graph, Node, Signature

_FLOW_ID_MAX = 200


@dataclass(frozen=True)
class Planned:
    """A step as it will be written: where, and its node spec."""

    queue: str
    keys: PartitionKeys
    spec: NodeSpec


@dataclass(frozen=True)
class CreatedFlow:
    flow_id: str
    runs: list[tuple[str, str, bool]]  # per step in order: run id, queue, created now


def new_flow_id(flow_id: str | None) -> str:
    if flow_id is None:
        return os.urandom(8).hex()
    if not isinstance(flow_id, str) or not flow_id or len(flow_id) > _FLOW_ID_MAX:
        raise ConfigError(f"flow_id must be a non-empty string of at most {_FLOW_ID_MAX}")
    return validate_run_id(flow_id)


def create_flow(core: ClientCore, graph: Graph, flow_id: str | None) -> Steps[CreatedFlow]:
    """``core``: a client (jobqueue.client.core.ClientCore)."""

    graph.check()
    fid = new_flow_id(flow_id)
    prepared = [_prepare(core, fid, node.name, node) for node in graph.nodes]
    ids = [spec.run_id for _, spec in prepared]
    if len(set(ids)) != len(ids):
        raise ConfigError("two steps of the workflow have the same run id")
    externals = list(
        dict.fromkeys(
            (t.run_id, t.queue)
            for node in graph.nodes
            for t, _ in node.waits_on
            if not isinstance(t, int)
        )
    )
    for run_id in [*ids, *(r for r, _ in externals)]:
        if '"' in run_id or "\\" in run_id:  # (the dependency lists are JSON, read by Lua)
            raise ConfigError(f"a workflow's run ids hold no quote or backslash: {run_id!r}")
    yield from _check_existing(core, externals, graph)  # before any write, a registration too
    for queue in dict.fromkeys(q for q, _ in prepared):
        yield from core._register_queue(queue)

    parents: dict[int | tuple[str, str], list[list[str]]] = {}
    for i, node in enumerate(graph.nodes):
        for target, _ in node.waits_on:
            key: int | tuple[str, str] = (
                target if isinstance(target, int) else (target.run_id, target.queue)
            )
            parents.setdefault(key, []).append([prepared[i][0], ids[i]])
    planned: list[Planned] = []
    for i, (node, (queue, spec)) in enumerate(zip(graph.nodes, prepared, strict=True)):
        spec.parents = _parents_text(parents.get(i, []))
        spec.deps = [
            Edge(ids[t], prepared[t][0], policy)
            if isinstance(t, int)
            else Edge(t.run_id, t.queue, policy)
            for t, policy in node.waits_on
        ]
        planned.append(Planned(queue, core.keys_for(queue, spec.run_id), spec))

    waiting = [p for p in planned if p.spec.deps]
    ready = [p for p in planned if not p.spec.deps]
    created: dict[str, bool] = {}
    if not externals and len({p.keys for p in planned}) == 1:
        yield from _create(core, planned, created)  # one call: all or nothing
    else:
        yield from _create(core, waiting, created)
        yield from _attach(core, externals, parents)
        yield from _create(core, ready, created)
    # A step whose run id existed already (shared with another workflow, or this one created
    # before) was left as it was: it is told of its new waiting runs as an older run is.
    existed = {
        (p.spec.run_id, p.queue): parents.get(i, [])
        for i, p in enumerate(planned)
        if not created[p.spec.run_id]
    }
    yield from _attach(core, list(existed), existed)
    # An older run that had finished went back to its outbox: relayed now, not at the next
    # sweep (its queue may have no worker).
    for keys in dict.fromkeys(core.keys_for(q, r) for r, q in [*externals, *existed]):
        yield from relay_cascade_steps(core, keys)
    return CreatedFlow(fid, [(p.spec.run_id, p.queue, created[p.spec.run_id]) for p in planned])


def add_to_flow_steps(
    core: ClientCore,
    adder_id: str,
    adder_queue: str,
    steps: Sequence[tuple[str, Signature[Any]]],
    fence: int | None = None,
) -> Steps[list[tuple[str, str, bool]]]:
    """Runs (``steps``: default run id and signature each) that the runs waiting on run
    ``adder_id`` wait on too, each with that run's edge policy. Returns per step its run id,
    queue and whether this call created it. FlowFinished when no run waits on the adder any
    more, or (given its attempt's ``fence``) when the adder does not run with that fence any
    more: a stale attempt adds nothing (nothing is written then)."""
    if not steps:
        raise ConfigError("add_to_flow needs at least one step")
    prepared: list[tuple[str, NodeSpec]] = []
    for default_id, sig in steps:
        if not isinstance(sig, Signature):
            raise ConfigError(
                f"add_to_flow takes signatures (task.s(...)), not {type(sig).__name__}"
            )
        if sig.receives or sig.dependencies:
            raise ConfigError(
                f"a run added to a flow waits on nothing: {sig!r} receives results or names "
                "dependencies"
            )
        node = Node(default_id, sig.with_options(run_id=sig.run_id or default_id))
        prepared.append(_prepare(core, "", default_id, node))
    ids = [spec.run_id for _, spec in prepared]
    if len(set(ids)) != len(ids):
        raise ConfigError("two runs added to the flow have the same run id")
    for run_id in ids:
        if '"' in run_id or "\\" in run_id:
            raise ConfigError(f"a workflow's run ids hold no quote or backslash: {run_id!r}")
    keys = core.keys_for(adder_queue, adder_id)
    (fields,) = yield commands(
        cmd("hmget", keys.run(adder_id), "parents", "flow", "state", "fence")
    )
    if is_wrong_type(fields):
        raise CorruptData(f"run {adder_id!r} in queue {adder_queue!r} is not a run record")
    if isinstance(fields, Exception):
        raise fields
    parents_text, flow, state, held = fields
    if fence is not None and (state != "running" or held != str(fence)):
        raise FlowFinished(
            f"this attempt no longer holds run {adder_id!r} (now {state or 'gone'}, fence "
            f"{held}): nothing was added"
        )
    try:
        waiting = [(q, r) for q, r in json.loads(parents_text or "[]")]
    except (TypeError, ValueError):
        raise CorruptData(f"run {adder_id!r} has a 'parents' field jobqueue did not write"
                          ) from None
    if not waiting:
        raise ConfigError(
            f"run {adder_id!r} is not a step that other runs wait on: there is no flow to add "
            "to (a batch's children and a workflow's steps are)"
        )
    for queue in dict.fromkeys(q for q, _ in prepared):
        yield from core._register_queue(queue)
    added = [(spec.run_id, queue) for queue, spec in prepared]
    by_partition: dict[PartitionKeys, list[tuple[str, str]]] = {}
    for queue, run_id in waiting:
        yield from core._register_queue(queue)
        by_partition.setdefault(core.keys_for(queue, run_id), []).append((queue, run_id))
    calls = [EXTEND.call(pk, adder_id, added, [r for _, r in ws])
             for pk, ws in by_partition.items()]
    replies = yield Scripts(calls)
    told = [w for ws, reply in zip(by_partition.values(), replies, strict=True)
            for w, ok in zip(ws, EXTEND.parse(reply), strict=True) if ok]
    if not told:
        raise FlowFinished(
            f"no run waits on run {adder_id!r} any more (its batch or workflow moved on, or "
            "this attempt is stale): nothing was added"
        )
    text = _parents_text([[q, r] for q, r in told])
    planned = []
    for queue, spec in prepared:
        spec.parents, spec.flow = text, flow or ""
        planned.append(Planned(queue, core.keys_for(queue, spec.run_id), spec))
    # The flow's own creation time for the flows index of a partition it reaches now, so
    # that listings order it by when it was created, not by when a step grew it.
    flow_at = None
    if flow:
        (score,) = yield commands(cmd("zscore", keys.flows, flow))
        flow_at = score_ms(score) if not isinstance(score, Exception) else None
    created: dict[str, bool] = {}
    yield from _create(core, planned, created, flow_at)
    # A run id that existed (a retried add, or one given that names another run): it is told
    # of its waiting runs as an older run is, and relayed at once if it finished.
    existed = {(p.spec.run_id, p.queue): [[q, r] for q, r in told]
               for p in planned if not created[p.spec.run_id]}
    yield from _attach(core, list(existed), existed)
    for pk in dict.fromkeys(core.keys_for(q, r) for r, q in existed):
        yield from relay_cascade_steps(core, pk)
    return [(p.spec.run_id, p.queue, created[p.spec.run_id]) for p in planned]


def _prepare(core: ClientCore, flow_id: str, name: str, node: Node) -> tuple[str, NodeSpec]:

    sig = node.signature
    run_id = sig.run_id if sig.run_id is not None else f"{flow_id}:{name}"
    args = tuple(sig.args)
    # A receiving step's first argument comes later: checked with a stand-in.
    checked = (None, *args) if node.receives else args
    queue, spec = core.prepare_args(sig.task, checked, dict(sig.kwargs), run_id, None, None,
                                    sig.queue)
    payload = spec.payload
    tail = ""
    if node.receives:
        payload = encode_payload(args, dict(sig.kwargs), core.settings.max_payload_bytes)
        tail = args_tail(payload, bool(args))
    return queue, NodeSpec(
        spec.run_id, spec.task, payload, spec.max_attempts, spec.lease_ms, spec.timeout_ms,
        flow=flow_id, receives=node.receives, args_tail=tail,
        cancel_running=sig.cancel_running, on_death_only=node.on_death_only,
    )


def _parents_text(parents: list[list[str]]) -> str:
    if not parents:
        return ""
    unique = [list(p) for p in dict.fromkeys(tuple(p) for p in parents)]
    return json.dumps(unique, separators=(",", ":"), ensure_ascii=False)


def _check_existing(
    core: ClientCore, externals: Sequence[tuple[str, str]], graph: Graph
) -> Steps[None]:

    if not externals:
        return
    known = yield from core._queues()
    for run_id, queue in externals:
        if queue not in known:
            raise RunNotFound(f"a step waits on run {run_id!r} in queue {queue!r}: no such queue")
    for queue in dict.fromkeys(q for _, q in externals):
        yield from core._register_queue(queue)  # (it exists: nothing is written)
    replies = yield commands(
        *(cmd("hget", core.keys_for(q, r).run(r), "state") for r, q in externals)
    )
    for (run_id, queue), reply in zip(externals, replies, strict=True):
        if is_wrong_type(reply):
            raise CorruptData(f"run {run_id!r} in queue {queue!r} is not a run record")
        if isinstance(reply, Exception):
            raise reply
        if not reply:
            raise RunNotFound(
                f"a step waits on run {run_id!r} in queue {queue!r}, which does not exist "
                "(never created, or expired after its retention)"
            )


def _create(
    core: ClientCore,
    planned: Sequence[Planned],
    created: dict[str, bool],
    flow_at: int | None = None,
) -> Steps[None]:

    by_partition: dict[PartitionKeys, list[Planned]] = {}
    for p in planned:
        by_partition.setdefault(p.keys, []).append(p)
    if not by_partition:
        return
    calls = [FLOW_CREATE.call(keys, [p.spec for p in ps], flow_at=flow_at)
             for keys, ps in by_partition.items()]
    replies = yield from core._run_calls(calls, [p.spec.run_id for p in planned])
    for ps, reply in zip(by_partition.values(), replies, strict=True):
        for p, made in zip(ps, FLOW_CREATE.parse(reply), strict=True):
            created[p.spec.run_id] = made


def _attach(
    core: ClientCore,
    externals: Sequence[tuple[str, str]],
    parents: Mapping[Any, list[list[str]]],
) -> Steps[None]:

    calls = []
    for run_id, queue in externals:
        for parent in parents.get((run_id, queue), []):
            text = json.dumps(parent, separators=(",", ":"), ensure_ascii=False)
            calls.append(ATTACH.call(core.keys_for(queue, run_id), text, [run_id]))
    if not calls:
        return
    replies = yield Scripts(calls)
    for call, reply in zip(calls, replies, strict=True):
        if not all(ATTACH.parse(reply)):
            raise RunNotFound(
                f"run {call.args[-1]!r} vanished before the workflow could wait on it"
            )


_HEARD = {"d": "done", "x": "dead", "c": "cancelled", "r": "removed"}


def dependencies_steps(
    core: ClientCore, run_id: str, queue: str | None
) -> Steps[list[DependencyState]]:
    """The dependencies of a run of a workflow, in the order given, with what the run heard
    of each (empty for a run that waits on none)."""
    keys = yield from core._located(run_id, queue)
    deps, got = yield commands(cmd("hgetall", keys.deps(run_id)), cmd("hgetall", keys.got(run_id)))
    if is_wrong_type(deps) or is_wrong_type(got):
        raise CorruptData(f"the dependency keys of run {run_id!r} hold foreign data")
    for reply in (deps, got):
        if isinstance(reply, Exception):
            raise reply
    ranked = []
    for child, spec in (deps or {}).items():
        d = parse_dep_spec(spec)
        ranked.append((d.index, child, d.policy, d.queue))
    out = []
    for _, child, policy, child_queue in sorted(ranked):
        heard = (got or {}).get(child)
        kind = _HEARD.get(heard[:1]) if heard else None
        body = heard[1:] if heard else None
        out.append(
            DependencyState(
                child, child_queue, policy, kind,
                result_json=body if kind == "done" else None,
                error=body if kind in ("dead", "cancelled") else None,
            )
        )
    return out
