"""Read-only views of workflows and batches: the newest flows with their progress (``flows``)
and one flow's runs and edges (``flow``), from each partition's flows index and its per-flow
sets of run ids (lua/flow_create.lua). Exact, not sampled: every run of a listed flow is
read, in pipelines of RECORD_CHUNK. A run whose record is gone counts as finished (a record
expires only after its run finished); a flow whose records all expired is forgotten by the
workers' tidy (lua/flow_tidy.lua) and until then listed with its runs ``expired``.

Foreign data (a key of another type) is an anomaly of the listing, as in
jobqueue.ops.queries."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from jobqueue.anomalies import Anomaly, Listing, checked, is_wrong_type, score_ms, unique
from jobqueue.client.base import NOT_A_RECORD
from jobqueue.client.sync import JobQueue
from jobqueue.ops.partitions import partitions_of
from jobqueue.ops.queries import PARTITION_CHUNK, RECORD_CHUNK, pipelined
from jobqueue.store.flows import parse_dep_spec
from jobqueue.store.keys import PartitionKeys

FINISHED = ("done", "dead", "cancelled", "expired")
# The order of a flow's states in listings.
FLOW_STATES = ("waiting", "pending", "running", "done", "dead", "cancelled", "expired")


@dataclass
class FlowSummary:
    """A workflow or batch: its runs counted by state (``expired``: finished, and its record
    gone after its retention), ``finished`` of ``runs`` (progress k/n)."""

    flow_id: str
    created_ms: int | None
    queues: list[str]
    runs: int
    finished: int
    states: dict[str, int]
    anomalies: tuple[Anomaly, ...] = ()

    @property
    def progress(self) -> str:
        return f"{self.finished}/{self.runs}"

    @property
    def failed(self) -> int:
        return self.states.get("dead", 0) + self.states.get("cancelled", 0)

    @property
    def done(self) -> bool:
        return self.finished == self.runs

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["anomalies"] = [a.to_dict() for a in self.anomalies]
        out["progress"] = self.progress
        return out


@dataclass(frozen=True)
class FlowRun:
    run_id: str
    queue: str
    task: str | None
    state: str  # a run state, or 'expired' (its record is gone)
    created_ms: int | None = None


@dataclass(frozen=True)
class FlowEdge:
    """``waiting`` waits on ``dependency`` (run ids), under ``policy``."""

    dependency: str
    waiting: str
    policy: str


@dataclass
class FlowDetail:
    summary: FlowSummary
    runs: list[FlowRun] = field(default_factory=list)
    edges: list[FlowEdge] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"flow": self.summary.to_dict(), "runs": [asdict(r) for r in self.runs],
                "edges": [asdict(e) for e in self.edges]}


def flows(jq: JobQueue, queue: str | None = None, limit: int = 20) -> Listing[FlowSummary]:
    """The ``limit`` newest flows with runs in ``queue`` (else in any queue), newest first,
    each with all its runs counted, in whatever queue they live."""
    parts, found = partitions_of(jq, queue)
    newest: dict[str, int | None] = {}
    full = False  # a partition gave all the limit asked: it may hold older ones
    for k, (reply,) in zip(parts, pipelined(
        jq, parts, lambda pipe, k: pipe.zrevrange(k.flows, 0, limit, withscores=True),
        PARTITION_CHUNK,
    ), strict=True):
        listed = checked(reply, k.flows, "sorted set", found, [])
        if len(listed) > limit:
            full, listed = True, listed[:limit]
        for fid, score in listed:
            # (created when its first run was, in whichever partition)
            at, before = score_ms(score), newest.get(fid)
            newest[fid] = at if before is None else before if at is None else min(at, before)
    chosen = sorted(newest, key=lambda f: (newest[f] or 0, f), reverse=True)[:limit]
    everywhere = parts if queue is None else partitions_of(jq, None)[0]
    rows = _summaries(jq, chosen, everywhere, newest, found)
    return Listing(rows, unique(found), full or len(newest) > limit)


def flow(jq: JobQueue, flow_id: str) -> FlowDetail | None:
    """One flow's runs (in creation order) and its edges, from every partition of every
    queue; None when no partition lists it."""
    parts, found = partitions_of(jq, None)
    members = _members(jq, [flow_id], parts, found)
    if not members.get(flow_id):
        return None
    runs, anomalies = _runs(jq, members[flow_id])
    times = [r.created_ms for r in runs if r.created_ms is not None]
    summary = _summary(flow_id, min(times) if times else None, runs, anomalies)
    records = [(k, r) for (k, r), run in zip(members[flow_id], runs, strict=True)
               if run.state != "expired"]
    runs.sort(key=lambda r: (r.created_ms or 0, r.run_id))
    edges: list[FlowEdge] = []
    for (k, rid), (reply,) in zip(records, pipelined(
        jq, records, lambda pipe, kr: pipe.hgetall(kr[0].deps(kr[1])), RECORD_CHUNK
    ), strict=True):
        for dep, spec in sorted(checked(reply, k.deps(rid), "hash", found, {}).items(),
                                key=lambda item: parse_dep_spec(item[1]).index):
            edges.append(FlowEdge(dep, rid, parse_dep_spec(spec).policy))
    summary.anomalies = tuple(unique([*summary.anomalies, *found]))
    return FlowDetail(summary, runs, edges)


# -- reading -----------------------------------------------------------------------------------


def _members(
    jq: JobQueue, flow_ids: Sequence[str], parts: Sequence[PartitionKeys], found: list[Anomaly]
) -> dict[str, list[tuple[PartitionKeys, str]]]:
    pairs = [(fid, k) for fid in flow_ids for k in parts]
    out: dict[str, list[tuple[PartitionKeys, str]]] = {fid: [] for fid in flow_ids}
    for (fid, k), (reply,) in zip(pairs, pipelined(
        jq, pairs, lambda pipe, fk: pipe.smembers(fk[1].flow(fk[0])), PARTITION_CHUNK
    ), strict=True):
        out[fid] += [(k, rid) for rid in sorted(checked(reply, k.flow(fid), "set", found, set()))]
    return out


def _runs(
    jq: JobQueue, members: Sequence[tuple[PartitionKeys, str]]
) -> tuple[list[FlowRun], list[Anomaly]]:
    anomalies: list[Anomaly] = []
    runs = []
    for (k, rid), (reply,) in zip(members, pipelined(
        jq, members, lambda pipe, kr: pipe.hmget(kr[0].run(kr[1]), "state", "task", "created"),
        RECORD_CHUNK,
    ), strict=True):
        if is_wrong_type(reply):
            anomalies.append(Anomaly(k.run(rid), NOT_A_RECORD))
            runs.append(FlowRun(rid, k.queue, None, "dead"))  # as claim.lua would bury it
            continue
        if isinstance(reply, Exception):
            raise reply
        state, task, created = reply
        runs.append(FlowRun(rid, k.queue, task, state if state in FLOW_STATES else "expired",
                            int(created) if created and created.isdigit() else None))
    return runs, anomalies


def _summary(
    flow_id: str, created: int | None, runs: Sequence[FlowRun], anomalies: Sequence[Anomaly]
) -> FlowSummary:
    states = dict.fromkeys(FLOW_STATES, 0)
    for r in runs:
        states[r.state] += 1
    return FlowSummary(
        flow_id,
        created,
        sorted({r.queue for r in runs}),
        len(runs),
        sum(states[s] for s in FINISHED),
        states,
        tuple(anomalies),
    )


def _summaries(
    jq: JobQueue,
    chosen: Sequence[str],
    parts: Sequence[PartitionKeys],
    created: dict[str, int | None],
    found: list[Anomaly],
) -> list[FlowSummary]:
    members = _members(jq, chosen, parts, found)
    rows = []
    for fid in chosen:
        runs, anomalies = _runs(jq, members[fid])
        rows.append(_summary(fid, created.get(fid), runs, anomalies))
    return rows
