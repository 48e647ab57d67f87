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
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from redis.connection import parse_url

from jobqueue.anomalies import is_wrong_type, score_ms
from jobqueue.client.core import ClientCore
from jobqueue.client.relay import relay_cascade_steps
from jobqueue.errors import (
    ConfigError,
    CorruptData,
    FlowAborted,
    FlowConflict,
    FlowFinished,
    JobQueueError,
    RunNotFound,
    ScriptError,
)
from jobqueue.models import DependencyState
from jobqueue.payload import args_tail, encode_payload
from jobqueue.store.connection import redact
from jobqueue.store.flows import (
    ATTACH,
    EXTEND,
    FLOW_ABORT,
    FLOW_COMMIT,
    FLOW_CREATE,
    Edge,
    NodeSpec,
    parse_dep_spec,
    parse_mark,
    stage_mark,
)
from jobqueue.store.io import Scripts, Steps, cmd, commands
from jobqueue.store.keys import PartitionKeys, validate_run_id
from jobqueue.workflows.canvas import Graph, Node, RunRef, Signature

log = logging.getLogger("jobqueue.client")

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
    yield from _resolve_refs(core, graph)
    _check_same_store(core, graph)
    prepared = [_prepare(core, fid, node.name, node) for node in graph.nodes]
    ids = [spec.run_id for _, spec in prepared]
    if len(set(ids)) != len(ids):
        raise ConfigError("two steps of the workflow have the same run id")
    externals: list[tuple[str, str]] = list(
        dict.fromkeys(
            (t.run_id, t.queue)
            for node in graph.nodes
            for t, _ in node.waits_on
            if not isinstance(t, int) and t.queue is not None
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
                target if isinstance(target, int) else (target.run_id, str(target.queue))
            )
            parents.setdefault(key, []).append([prepared[i][0], ids[i]])
    planned: list[Planned] = []
    for i, (node, (queue, spec)) in enumerate(zip(graph.nodes, prepared, strict=True)):
        spec.parents = _parents_text(parents.get(i, []))
        spec.deps = [
            Edge(ids[t], prepared[t][0], policy)
            if isinstance(t, int)
            else Edge(t.run_id, str(t.queue), policy)
            for t, policy in node.waits_on
        ]
        planned.append(Planned(queue, core.keys_for(queue, spec.run_id), spec))

    found, marks = yield from _found(core, planned, fid)
    before = CreatedFlow(fid, [(p.spec.run_id, p.queue, False) for p in planned])
    for p in planned:
        f = found.get(p.spec.run_id)
        if f is not None and f.flow != fid and p.spec.deps:
            raise FlowConflict(
                f"step {p.spec.run_id!r} waits on other runs, but a run with that id exists "
                f"already in queue {p.queue!r} ({f.state or 'no state'}, "
                f"{'of workflow ' + repr(f.flow) if f.flow else 'not in a workflow'}): it "
                "would never wait. Give the step a new run id; nothing was written"
            )
    shared = {p.spec.run_id for p in planned
              if p.spec.run_id in found and found[p.spec.run_id].flow != fid}
    new = [p for p in planned if p.spec.run_id not in shared]
    home_keys = new[0].keys if new else None
    if (home_keys is not None and marks.get(home_keys)) or any(
        f.flow == fid and not f.staged for f in found.values()
    ):
        # Created before (its commit recorded, or a run of it not staged): nothing is
        # written, not even to the runs it waits on, whatever expired since.
        return before
    # Runs staged by an earlier attempt whose creator died (or that another is making now):
    # undone first, home first (refused when that attempt did commit: then it exists).
    for old in dict.fromkeys(f.staged for f in found.values() if f.flow == fid and f.staged):
        if not (yield from _abort_attempt(core, fid, old, {p.keys for p in planned})):
            return before
    existed = {
        (p.spec.run_id, p.queue): parents.get(i, [])
        for i, p in enumerate(planned)
        if p.spec.run_id in shared
    }
    created: dict[str, bool] = {p.spec.run_id: False for p in planned}
    nonce = os.urandom(6).hex()
    try:
        if not externals and not shared and len({p.keys for p in new}) == 1:
            mark = (_mark_ttl_ms(core), nonce, fid)
            yield from _create(core, new, created, mark=mark)  # one call: all or nothing
        elif new:
            if not (yield from _create_staged(core, fid, new, externals, parents, existed,
                                              created, nonce)):
                return before
        else:  # every step existed before, outside it: they only learn of each other
            yield from _attach(core, externals, parents)
            yield from _attach(core, list(existed), existed)
    except ScriptError as exc:
        if "exists outside the workflow" in str(exc) or "staged by another attempt" in str(exc):
            raise FlowConflict(
                f"workflow {fid!r}: {str(exc).split('flow_create: ', 1)[-1]}"
            ) from None
        raise
    # An older run that had finished went back to its outbox: relayed now, not at the next
    # sweep (its queue may have no worker).
    for keys in dict.fromkeys(core.keys_for(q, r) for r, q in [*externals, *existed]):
        yield from relay_cascade_steps(core, keys)
    return CreatedFlow(fid, [(p.spec.run_id, p.queue, created[p.spec.run_id]) for p in planned])


def _mark_ttl_ms(core: ClientCore) -> int:
    """How long a workflow's commit is recorded: longer than any of its records lives (a
    record kept by the outbox included), and than its staged runs wait for the audit."""
    s = core.settings
    return max(s.done_retention_ms, s.dead_retention_ms) + round(
        2 * s.flow_stage_timeout_s * 1000 + 2 * s.flow_audit_s * 1000
    )


@dataclass(frozen=True)
class Found:
    """A step's run id that exists already: its record's workflow, staged home and state."""

    flow: str
    staged: str
    state: str


def _found(
    core: ClientCore, planned: Sequence[Planned], fid: str
) -> Steps[tuple[dict[str, Found], dict[PartitionKeys, str]]]:
    """The steps whose run ids exist already, and the workflow's commit as recorded in each
    of its partitions (only its home's counts), read in one round trip."""
    partitions = list(dict.fromkeys(p.keys for p in planned))
    replies = yield commands(
        *(cmd("hmget", p.keys.run(p.spec.run_id), "flow", "staged", "state") for p in planned),
        *(cmd("get", k.flowmark(fid)) for k in partitions),
    )
    out = {}
    for p, reply in zip(planned, replies, strict=False):
        if is_wrong_type(reply):
            raise CorruptData(
                f"run {p.spec.run_id!r} in queue {p.queue!r} is not a run record: the step "
                "cannot be created; nothing was written"
            )
        if isinstance(reply, Exception):
            raise reply
        flow, staged, state = reply
        if flow is not None or staged is not None or state is not None:
            out[p.spec.run_id] = Found(flow or "", staged or "", state or "")
    marks: dict[PartitionKeys, str] = {}
    for keys, reply in zip(partitions, replies[len(planned):], strict=True):
        if is_wrong_type(reply):
            raise CorruptData(f"{keys.flowmark(fid)} holds foreign data; nothing was written")
        if isinstance(reply, Exception):
            raise reply
        if reply:
            marks[keys] = str(reply)
    return out, marks


def _create_staged(
    core: ClientCore,
    fid: str,
    new: Sequence[Planned],
    externals: Sequence[tuple[str, str]],
    parents: Mapping[Any, list[list[str]]],
    existed: Mapping[tuple[str, str], list[list[str]]],
    created: dict[str, bool],
    nonce: str,
) -> Steps[bool]:
    """A workflow over several partitions (or waiting on older runs): every run written
    staged by this attempt (none can run), the older and shared runs told, then the commit,
    one write in the home's partition (the first new step's), then the release of its other
    partitions. A failure before the commit undoes what this attempt wrote; a process that
    dies before it leaves staged runs that the workers' audit rolls back (or, committed,
    releases). False when another attempt committed the workflow first (this one's runs are
    undone: it exists)."""
    home = new[0]
    staged = stage_mark(home.queue, home.spec.run_id, nonce)
    s = core.settings
    ttl = _mark_ttl_ms(core)
    try:
        yield from _create(core, new, created, staged=staged)
        yield from _attach(core, externals, parents)
        yield from _attach(core, list(existed), existed)
        (reply,) = yield from core._run_calls([FLOW_COMMIT.call(
            home.keys, fid, staged, home.spec.run_id, s.dead_retention_ms,
            s.max_results_bytes, ttl,
        )], [home.spec.run_id])
        outcome = FLOW_COMMIT.parse(reply)
        if outcome.refused == "other":
            yield from _abort_attempt(core, fid, staged, {p.keys for p in new})
            for p in new:
                created[p.spec.run_id] = False
            return False
        if not outcome.committed:
            raise FlowAborted(
                f"workflow {fid!r} was rolled back before its commit (by a worker's audit, "
                f"its creation taking longer than flow_stage_timeout_s, "
                f"{s.flow_stage_timeout_s:g} s, or by another creation of it): nothing of "
                "this attempt is left; create it again"
            )
    except Exception:  # (not GeneratorExit: a process that stops here leaves it to the audit)
        yield from _abort_attempt(core, fid, staged, {p.keys for p in new}, quiet=True)
        raise
    others = [k for k in dict.fromkeys(p.keys for p in new) if k != home.keys]
    if others:
        try:
            yield from core._run_calls(
                [FLOW_COMMIT.call(k, fid, staged, "", s.dead_retention_ms, s.max_results_bytes,
                                  ttl) for k in others],
                [p.spec.run_id for p in new if p.keys != home.keys],
            )
        except JobQueueError as exc:  # committed: the workers' audit releases them
            log.warning("workflow %s is committed, but releasing its runs in %d partitions "
                        "failed for now (%s): the workers' audit releases them", fid,
                        len(others), exc)
    return True


def _abort_attempt(
    core: ClientCore,
    fid: str,
    staged: str,
    partitions: Iterable[PartitionKeys],
    quiet: bool = False,
) -> Steps[bool]:
    """Undo an attempt to create ``fid`` (its mark ``staged``): at its home first, where the
    abort is decided, then in ``partitions``. False when that attempt committed (nothing is
    undone: the workflow exists). ``quiet``: a failure is logged (the workers' audit undoes
    what this could not), not raised."""
    mark = parse_mark(staged)
    if mark is None:
        raise CorruptData(f"a run of workflow {fid!r} is staged with {staged!r}, a mark "
                          "jobqueue did not write; nothing was written")
    home_keys = core.keys_for(mark[0], mark[1])
    try:
        (reply,) = yield Scripts([FLOW_ABORT.call(home_keys, fid, staged, mark[1])])
        if FLOW_ABORT.parse(reply) is None:
            return False
        others = [k for k in dict.fromkeys(partitions) if k != home_keys]
        if others:
            yield Scripts([FLOW_ABORT.call(k, fid, staged, "") for k in others])
    except Exception as exc:
        if not quiet:
            raise
        log.warning("undoing an attempt to create workflow %s failed (%s): the workers' audit "
                    "rolls it back", fid, exc)
    return True


def _resolve_refs(core: ClientCore, graph: Graph) -> Steps[None]:
    """A dependency named by run id alone: its queue, looked up (RunNotFound when no queue
    has it; refused when several do)."""
    for node in graph.nodes:
        for i, (target, policy) in enumerate(node.waits_on):
            if isinstance(target, RunRef) and target.queue is None:
                keys = yield from core._locate(target.run_id, None)
                if keys is None:
                    raise RunNotFound(
                        f"step {node.name!r} depends on run {target.run_id!r}, which exists in "
                        "no queue (never created, or expired); nothing was written"
                    )
                node.waits_on[i] = (RunRef(target.run_id, keys.queue), policy)


def _check_same_store(core: ClientCore, graph: Graph) -> None:
    """A handle of a client connected to another Redis names a run of another store:
    refused (its run id might exist here too, as another run)."""
    mine = store_of(core)
    for node in graph.nodes:
        for target, _ in node.waits_on:
            owner = getattr(target, "jq", None)
            if isinstance(target, int) or owner is None or owner is core:
                continue
            theirs = store_of(owner)
            if mine is not None and theirs is not None and theirs != mine:
                raise FlowConflict(
                    f"step {node.name!r} waits on run {target.run_id!r} of a client of another "
                    f"Redis ({theirs[1]}; this one: {mine[1]}): a workflow and its "
                    "dependencies live in one store; nothing was written"
                )


def store_of(client: object) -> tuple[object, str] | None:
    """Which Redis a client talks to, as far as it says: host, port and database (or socket
    and database; a fakeredis server by identity), from its connection pool, else from its
    URL; None when it cannot tell (a cluster is told by its URL). The second item is what a
    message shows."""
    connection = client.__dict__.get("_client") or client.__dict__.get("redis")
    kwargs = getattr(getattr(connection, "connection_pool", None), "connection_kwargs", None)
    url = getattr(client, "url", None)
    if not isinstance(kwargs, dict) and isinstance(url, str) and "+cluster" not in url:
        try:
            kwargs = parse_url(url)
        except ValueError:
            kwargs = None
    if isinstance(kwargs, dict):
        host = kwargs.get("host")
        host = "127.0.0.1" if host in ("localhost", "::1", "127.0.0.1") else host  # (loopback)
        where = (host, kwargs.get("port"), kwargs.get("path"),
                 int(kwargs.get("db") or 0), id(kwargs.get("server")))
        shown = kwargs.get("path") or f"{kwargs.get('host')}:{kwargs.get('port')}"
        return where, f"{shown} db {int(kwargs.get('db') or 0)}"
    return (url, redact(url)) if isinstance(url, str) and url else None


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
    staged: str = "",
    mark: tuple[int, str, str] | None = None,
) -> Steps[None]:

    by_partition: dict[PartitionKeys, list[Planned]] = {}
    for p in planned:
        by_partition.setdefault(p.keys, []).append(p)
    if not by_partition:
        return
    calls = [FLOW_CREATE.call(keys, [p.spec for p in ps], flow_at=flow_at, staged=staged,
                              mark=mark)
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
