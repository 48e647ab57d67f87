"""Model-based test of workflows (docs/workflows.md): seeded random interleavings against the
real server, each step checked against a small pure-Python reference model of what every
run of the graph must become.

Each seed (a ``random.Random(seed)``) creates small random graphs through the public
client (``jq.workflow`` with ``.after(..., on_failure=policy)`` per edge, ``jq.chain``,
``jq.chord``; some steps ``receiving``, some ``cancel_running``, in two queues, some waiting
on runs created before: plain runs and earlier workflows' steps, finished or not; some sharing
a run id with a run created before), then does what workers, clients and crashes do, in
random order:

- claim (the claim script, all that is due in one queue partition, as a worker with free
  slots does), complete a run, fail it (retried, or to death);
- let leases expire (the clock jumps) and claim again: the run is taken back with a new
  fence, or buried past its last attempt;
- commit again with a stale fence (refused, nothing changes);
- cancel a run (``jq.cancel``: pending, waiting or running; finished ones are refused);
- relay: ``jq.relay(queue)`` (every partition's outbox, the cascade until quiet), one relay
  pass alone, a relay that dies before clearing its outbox entries (its deliveries and
  cancels made, the entries left: the next relay delivers them again), or a slow one that
  stops there while other steps (other relays too) go on, then clears what it read;
- requeue a finished run that waits on nothing (``jq.requeue(force=True)``) and run it again;
  a workflow step that waited on others is refused.

Worker steps go through the store's script contracts (``CLAIM``, ``COMPLETE``, ``FAIL``) on
an explicit clock an hour ahead of the server's (so that every run released by a relay, on
the server's clock, is due), moving on by 1 ms a step (see ``World.tick``), as
tests/test_model_stateful.py does; everything else through the public client. The model
follows docs/workflows.md ("When a dependency dies: the policies", "Exactly once") and the
relay as docs/design.md ("Workflows") describes it: what each outbox entry tells, to whom,
which runs an order cancels (its own workflow's unfinished dependencies that no other waiting
run waits on; running ones only with ``cancel_running``), and that a relayed entry goes only
at the version read. It follows the passes the relay made, as a spy on each pass saw them
(which partitions a cascade relays in which round is the relay's business; that it leaves no
entry it led to is checked), and borrows the order of an outbox's entries (their versions come
from the clocks), whose members it checks. So a seed takes the same steps at every run, but
where two entries written in the same millisecond of the server's clock would be read in
another order had they been written a millisecond apart (none of the seeds here did, in
repeated runs idle and under load).

After every step it checks that Redis agrees: every run's state, attempt, error and result,
``left`` (and that it is the number of dependencies not heard of), the set of dependencies it
heard of with their outcomes (``got``: a delivery counts once, by membership), the payload a
``receiving`` step was released with (its dependencies' results in the order given, ``None``
for a failed one, removed ones left out), each partition's indexes (waiting, due, leases,
dead, done), its outbox and its count of released runs (no run released twice); and, for the
runs the step changed, the public reads (``handle.refresh()``, ``handle.dependencies()``).
Each seed ends by running everything to its end: no run may be left waiting. The seeds
together must have gone through each case that matters (a death and a cancel under each
policy, a delivery made again, a relay that died, each kind of cascade cancel, ...): a change
of the generator that stops reaching one fails the test.

``test_the_model_catches_a_broken_script`` runs the same seeds with a script broken in-process
(deliver counting with a counter instead of set membership, complete losing the outbox
entry, deliver ignoring the edge's policy) and shows the model finds each.

Reproduce a seed: ``JOBQUEUE_WORKFLOW_SEEDS=17 .venv/bin/pytest tests/test_model_workflows.py
-k reference``; a failure names its seed and ends with the trace of the steps that led to it.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis
from helpers import resume, until_relayed

import jobqueue.client.relay as relay
from jobqueue.client.sync import JobQueue
from jobqueue.errors import OperationRefused
from jobqueue.handles import RunHandle
from jobqueue.store.embedded import EmbeddedServer
from jobqueue.store.io import Request, Steps, cmd, commands
from jobqueue.store.keys import PartitionKeys
from jobqueue.store.runs import CLAIM, COMPLETE, FAIL
from jobqueue.store.scripts import Script, scripts
from jobqueue.workflows import POLICIES as ALL_POLICIES

QUEUES = ("default", "side")
# The four policies of docs/workflows.md (others the library may add are not generated).
POLICIES = ("fail", "ignore", "continue", "remove")
assert set(POLICIES) <= set(ALL_POLICIES)
TASKS = {"once": 1, "twice": 2}  # task name -> max_attempts
LEASES = (5_000, 20_000)
CLOCK_AHEAD_MS = 3_600_000  # the workers' clock: ahead of the server's, so every run is due
MAX_RUNS = 24  # per seed
STEPS = 45  # random steps per seed, then the drain
DRAIN_ROUNDS = 60
SEEDS = range(60)
OUTCOME = {"done": "d", "dead": "x", "cancelled": "c"}
HEARD = {"d": "done", "x": "dead", "c": "cancelled", "r": "removed"}
UNFINISHED = ("pending", "running", "waiting")


class Discrepancy(AssertionError):
    """Redis disagrees with the model (or a reply with what the model expected)."""


@dataclass
class ModelRun:
    run_id: str
    queue: str
    flow: str | None
    max_attempts: int
    deps: list[tuple[str, str, str]]  # (run id, policy, queue) in the order given
    receives: str  # '', 'one' (a chain step) or 'all'
    args: list[Any]
    cancel_running: bool
    state: str
    parents: list[tuple[str, str]] = field(default_factory=list)  # (queue, run id)
    got: dict[str, str] = field(default_factory=dict)  # dependency -> outcome heard
    left: int = 0
    attempt: int = 0
    fence: int | None = None  # the fence of its latest claim; None once cancelled
    lease_until: int | None = None
    result: str | None = None  # JSON
    error: str | None = None
    releases: int = 0
    payload: Any = None  # what a receiving step was released with (decoded)

    def snapshot(self) -> tuple[Any, ...]:
        return (self.state, self.left, tuple(sorted(self.got.items())), self.attempt)


@dataclass(frozen=True)
class Holding:
    """What a worker believes it holds after a claim: possibly stale by now."""

    run_id: str
    fence: int


def refusal(m: ModelRun, fence: int) -> str | None:
    """Why a fenced commit is refused (lua/lib/fences.lua refusal), None when accepted."""
    if m.state == "cancelled":
        return "cancelled"
    if m.fence != fence:
        return "fenced"
    if m.state in ("done", "dead"):
        return "finished"
    if m.state != "running":
        return "not-running"
    return None


class Spy:
    """Records each relay pass (the partition and its outbox's members, in order) before the
    pass reads them: the model follows the order, and checks the members."""

    def __init__(self) -> None:
        self.passes: list[tuple[PartitionKeys, list[str]]] = []
        self.original = relay.relay_steps

    def relay_steps(self, core: Any, keys: PartitionKeys) -> Steps[Any]:
        (entries,) = yield commands(cmd("zrange", keys.outbox, 0, -1))
        self.passes.append((keys, list(entries)))
        return (yield from self.original(core, keys))


class World:
    """One seed: the client, the model, and the steps."""

    def __init__(self, url: str, seed: int, spy: Spy, events: Counter[str]) -> None:
        self.rng = random.Random(seed)
        self.spy = spy
        self.events = events  # the cases the seeds went through (COVERED)
        self.client = redis.Redis.from_url(url, decode_responses=True)
        self.client.flushall()
        self.jq = JobQueue(self.client)
        self.tasks: dict[str, Any] = {}
        for name, attempts in TASKS.items():
            def step(*xs: Any) -> None:
                return None

            step.__name__ = step.__qualname__ = name
            self.tasks[name] = self.jq.task(name=name, max_attempts=attempts)(step)
        self.pk: dict[str, PartitionKeys] = {}
        for q in QUEUES:
            self.jq.register_queue(q)
            (self.pk[q],) = self.jq.all_partition_keys(q)
        self.now = self.start = self.jq.server_time_ms() + CLOCK_AHEAD_MS
        self.retention = self.jq.settings.done_retention_ms
        self.dead_retention = self.jq.settings.dead_retention_ms
        self.runs: dict[str, ModelRun] = {}
        self.handles: dict[str, RunHandle[Any]] = {}
        self.outbox: dict[str, dict[str, int]] = {q: {} for q in QUEUES}
        self.released = dict.fromkeys(QUEUES, 0)
        self.last_fence = dict.fromkeys(QUEUES, 0)
        self.holdings: list[Holding] = []
        self.version = 0
        self.counter = 0
        self.flows = 0
        self.trace: list[str] = []
        self.read: dict[str, int] = {}  # the entries the last relay pass read, and versions
        # A relay pass stopped before it clears its entries (a slow relay: other steps go on
        # meanwhile, another relay too): its queue, its steps, the request it stopped at and
        # what it read.
        self.slow: tuple[str, Steps[Any], Request, dict[str, int]] | None = None

    def close(self) -> None:
        if self.slow is not None:
            self.slow[1].close()
        self.client.close()

    def note(self, text: str) -> None:
        self.trace.append(text)

    def next(self) -> int:
        self.counter += 1
        return self.counter

    # -- the model's outbox, deliver, cancel and relay ------------------------------------

    def to_outbox(self, queue: str, member: str) -> None:
        self.version += 1
        self.outbox[queue][member] = self.version

    def finished(self, m: ModelRun, state: str, *, result: str | None = None,
                 error: str | None = None) -> None:
        """A run ends (done, dead, cancelled): to its outbox when runs wait on it."""
        m.state, m.result, m.error, m.lease_until = state, result, error, None
        if m.parents:
            self.to_outbox(m.queue, m.run_id)

    def model_cancel(self, run_id: str, reason: str, running: bool) -> tuple[bool, str]:
        m = self.runs[run_id]
        was = m.state
        if not (was in ("pending", "waiting") or (was == "running" and running)):
            return False, was
        m.fence = None  # a new fence, which no worker holds
        self.finished(m, "cancelled", error=reason)
        if was == "waiting":
            self.to_outbox(m.queue, "!" + run_id)
        return True, was

    def model_deliver(self, queue: str, deliveries: list[tuple[str, str, str]]) -> None:
        """lua/deliver.lua: each (waiting run, dependency, outcome) in order."""
        plans: dict[str, dict[str, Any]] = {}
        for wid, dep, outcome in deliveries:
            m = self.runs[wid]
            assert m.queue == queue
            w = plans.get(wid)
            if w is None:
                w = plans[wid] = {"open": m.state == "waiting", "die": None, "release": False,
                                  "new": {}, "left": m.left}
            if not w["open"] or w["die"] or w["release"]:
                self.events["delivered to a run no longer waiting"] += 1
                continue
            policies = {d: p for d, p, _ in m.deps}
            if dep not in policies or dep in m.got or dep in w["new"]:
                self.events["delivered again, not counted"] += 1
                continue
            kind, policy = outcome[0], policies[dep]
            self.events[f"{HEARD[kind]} under {policy}"] += 1
            if kind == "d":
                w["new"][dep] = outcome
            elif policy == "remove":
                w["new"][dep] = "r"
            else:
                w["new"][dep] = outcome
                why = (f"dependency {dep}" + (" was cancelled: " if kind == "c" else " died: ")
                       + outcome[1:][:300])
                if policy == "continue":
                    w["release"] = True
                elif policy != "ignore":
                    w["die"] = why
            w["left"] = max(w["left"] - 1, 0)
        for wid, w in plans.items():
            m = self.runs[wid]
            if not w["open"]:
                continue
            m.got.update(w["new"])
            m.left = w["left"]
            if w["die"]:
                self.events["died of a dependency"] += 1
                self.finished(m, "dead", error=w["die"])
                self.to_outbox(queue, "!" + wid)
            elif w["release"] or m.left == 0:
                m.state = "pending"
                m.releases += 1
                self.events["released early (continue)" if m.left else "released"] += 1
                if m.receives:
                    self.events["released with results"] += 1
                assert m.releases == 1, f"the model released {wid} twice"
                self.released[queue] += 1
                if m.receives:
                    results = []
                    for d, _, _ in m.deps:
                        heard = m.got.get(d)
                        if heard == "r":
                            continue
                        results.append(json.loads(heard[1:]) if heard and heard[0] == "d"
                                       else None)
                    value = results if m.receives == "all" else (results or [None])[0]
                    m.payload = {"args": [value, *m.args], "kwargs": {}}

    def model_pass(self, queue: str, clear: bool = True) -> None:
        """One relay pass (jobqueue/client/relay.py relay_steps) over ``queue``'s outbox, in
        the order the spy saw. ``clear=False``: a pass that stops before clearing the entries
        it read (self.read: what it read)."""
        assert self.spy.passes, f"the model expected a relay pass of {queue}; none was made"
        keys, order = self.spy.passes.pop(0)
        assert keys == self.pk[queue], f"relay pass of {keys.queue}, the model expected {queue}"
        assert set(order) == set(self.outbox[queue]), (
            f"outbox of {queue}: redis {sorted(order)}, model {sorted(self.outbox[queue])}"
        )
        read = {member: self.outbox[queue][member] for member in order}
        entries = [m for m in order if not m.startswith("!")]
        orders = [m[1:] for m in order if m.startswith("!")]
        deliveries: dict[str, list[tuple[str, str, str]]] = {}
        for run_id in entries:  # what each finished run tells its parents, read now
            m = self.runs[run_id]
            if m.state not in OUTCOME:
                self.events["outbox entry of a run running again"] += 1
                continue  # running again (requeued): nothing to tell
            body = (m.result or "null") if m.state == "done" else (m.error or "")
            for parent_queue, parent in m.parents:
                deliveries.setdefault(parent_queue, []).append(
                    (parent, run_id, OUTCOME[m.state] + body))
        # The orders' cancels, decided on what is read before the deliveries.
        cancels: list[tuple[str, str, str, bool]] = []
        for o in orders:
            om = self.runs[o]
            for child, _, child_queue in om.deps:
                if child in om.got:
                    continue
                cm = self.runs[child]
                keep = cm.flow is not None and cm.flow == om.flow
                for _, p in cm.parents:
                    if p != o and self.runs[p].state == "waiting":
                        keep = False  # another waiting run still needs it
                self.events["kept by the cascade" if not keep else "cascade candidate"] += 1
                if keep:
                    cancels.append((o, child, child_queue, om.cancel_running))
        for target, ds in deliveries.items():
            self.model_deliver(target, ds)
        for o, child, _, running in cancels:
            was = self.runs[child].state
            changed, _ = self.model_cancel(
                child, f"cancelled: the run waiting on it ({o}) ended", running)
            if changed:
                self.events[f"cascade cancelled a {was} run"] += 1
            elif was == "running":
                self.events["cascade left a running run"] += 1
        if clear:
            self.model_relayed(queue, read)
        self.read = read

    def model_relayed(self, queue: str, read: dict[str, int]) -> None:
        """lua/relayed.lua: each entry read goes, if still at the version read."""
        for member, version in read.items():
            now = self.outbox[queue].get(member)
            if now == version:
                del self.outbox[queue][member]
            elif now is not None:
                self.events["an entry written again while relayed stays"] += 1

    def model_cascade(self, first: str, mark: int) -> None:
        """The passes of a cascade (relay_cascade_steps, from ``first``'s partition: then the
        partitions its passes wrote entries to, until none has more), each checked and
        followed by the model; then no outbox may hold an entry written since ``mark`` (the
        step's start): a cascade relays every entry it leads to. (Which partitions it relays
        in which round is the relay's business: the model follows the passes it made.)"""
        made = len(self.spy.passes)
        assert made and self.spy.passes[0][0] == self.pk[first], (
            f"a cascade from {first}: passes {[(k.queue, o) for k, o in self.spy.passes]}"
        )
        while self.spy.passes:
            self.model_pass(self.spy.passes[0][0].queue)
        if made < 20:  # (not cut by the bound of 20 rounds)
            left = sorted((q, m) for q, box in self.outbox.items() for m, v in box.items()
                          if v > mark)
            assert not left, f"the cascade from {first} left entries it led to: {left}"

    def passes_done(self) -> None:
        assert not self.spy.passes, f"relay passes the model did not expect: {self.spy.passes}"

    # -- steps -----------------------------------------------------------------------------

    def signature(self, task: str, name: str, receives: bool, queue: str,
                  cancel_running: bool) -> Any:
        t = self.tasks[task]
        sig = t.receiving(name) if receives else t.s(name)
        return sig.with_options(queue=queue, cancel_running=cancel_running)

    def create_flow(self) -> None:
        rng = self.rng
        fid = f"f{self.flows}"
        self.flows += 1
        shape = rng.choice(("workflow", "workflow", "workflow", "chain", "chord"))
        n = rng.randint(2, 5)
        queues = [rng.choice(QUEUES) for _ in range(n)]
        tasks = [rng.choice(list(TASKS)) for _ in range(n)]
        running = [rng.random() < 0.3 for _ in range(n)]
        # Per node: its name, how it receives, its edges (a node's index or an older run's
        # id, with the policy), and (workflows) the older run whose id it shares, if any.
        names: list[str]
        receives: list[str]
        edges: list[list[tuple[int | str, str]]]
        shared: dict[int, str] = {}
        if shape == "workflow":
            names = [f"n{i}" for i in range(n)]
            edges = []
            for i in range(n):
                k = min(i, rng.choice((0, 1, 1, 2, 3)))
                edges.append([(t, rng.choice(POLICIES)) for t in rng.sample(range(i), k)])
            # A step waiting on nothing may share its run id with a run created before
            # (one waiting on nothing either): it is not created again, only told of the
            # runs of this workflow that wait on it.
            roots = sorted(r for r, m in self.runs.items() if not m.deps)
            for i in range(n):
                if not edges[i] and roots and rng.random() < 0.2:
                    shared[i] = rng.choice(roots)
                    roots.remove(shared[i])
                    queues[i] = self.runs[shared[i]].queue
            older = sorted(set(self.runs) - set(shared.values()))
            for i in range(n):
                if older and i not in shared and rng.random() < 0.2:
                    edges[i].append((rng.choice(older), rng.choice(POLICIES)))
            receives = ["all" if e and rng.random() < 0.6 else "" for e in edges]
            sigs = {}
            for i in range(n):
                sig = self.signature(tasks[i], names[i], bool(receives[i]), queues[i],
                                     running[i])
                if i in shared:
                    sig = sig.with_options(run_id=shared[i])
                for t, policy in edges[i]:
                    target = names[t] if isinstance(t, int) else self.handles[t]
                    sig = sig.after(target, on_failure=policy)
                sigs[names[i]] = sig
            flow = self.jq.workflow(sigs, flow_id=fid)
        elif shape == "chain":
            policy = rng.choice(POLICIES)
            names = [str(i) for i in range(n)]
            receives = ["one" if i and rng.random() < 0.6 else "" for i in range(n)]
            edges = [[(i - 1, policy)] if i else [] for i in range(n)]
            flow = self.jq.chain(*(
                self.signature(tasks[i], names[i], bool(receives[i]), queues[i], running[i])
                for i in range(n)
            ), on_failure=policy, flow_id=fid)
        else:
            policy = rng.choice(POLICIES)
            names = [str(i) for i in range(n)]
            receives = [""] * (n - 1) + ["all" if rng.random() < 0.6 else ""]
            edges = [[] for _ in range(n - 1)] + [[(i, policy) for i in range(n - 1)]]
            header = [self.signature(tasks[i], names[i], False, queues[i], running[i])
                      for i in range(n - 1)]
            last = self.signature(tasks[-1], names[-1], bool(receives[-1]), queues[-1],
                                  running[-1])
            flow = self.jq.chord(header, last, on_failure=policy, flow_id=fid)
        ids = [shared.get(i, f"{fid}:{name}") for i, name in enumerate(names)]
        self.note(f"create {shape} {fid}: " + "; ".join(
            f"{ids[i]}@{queues[i]}{'/recv' if receives[i] else ''}"
            f"{'/cr' if running[i] else ''}{' (shared)' if i in shared else ''} after "
            + ",".join(f"{ids[t] if isinstance(t, int) else t}:{p}" for t, p in edges[i])
            for i in range(n)))
        assert [(r.run_id, r.queue, r.created) for r in flow.runs] == [
            (ids[i], queues[i], i not in shared) for i in range(n)
        ]
        # The model: the new runs, and the parents of each run waited on (each node that
        # waits on it, in order).
        new_parents: dict[str, list[tuple[str, str]]] = {}
        externals: list[str] = []
        for i in range(n):
            if i not in shared:
                self.runs[ids[i]] = ModelRun(
                    ids[i], queues[i], fid, TASKS[tasks[i]], [], receives[i], [names[i]],
                    running[i], "waiting" if edges[i] else "pending")
                self.handles[ids[i]] = flow.runs[i]
        for i in range(n):
            m = self.runs[ids[i]]
            for t, policy in edges[i]:
                dep = ids[t] if isinstance(t, int) else t
                m.deps.append((dep, policy, self.runs[dep].queue))
                if isinstance(t, str) and t not in externals:
                    externals.append(t)
                if (queues[i], ids[i]) not in new_parents.setdefault(dep, []):
                    new_parents[dep].append((queues[i], ids[i]))
            if i not in shared:
                m.left = len(m.deps)
        for i in range(n):
            if i not in shared:
                self.runs[ids[i]].parents = list(new_parents.get(ids[i], []))
        # The older runs waited on, then the shared steps, are told (attach.lua), once per
        # new parent: a finished one goes back to its outbox. Then their partitions are
        # relayed.
        told = [*externals, *(shared[i] for i in sorted(shared))]
        mark = self.version
        for older_id in told:
            em = self.runs[older_id]
            if older_id in shared.values():
                self.events["a step shared with a run created before"] += 1
            for parent in new_parents.get(older_id, []):
                if parent not in em.parents:
                    em.parents.append(parent)
                if em.state in OUTCOME:
                    self.events["attached a finished run"] += 1
                    self.to_outbox(em.queue, older_id)
        if told:
            self.model_cascade(self.runs[told[0]].queue, mark)
        # What flow_create wrote for the dependencies.
        for i in range(n):
            m = self.runs[ids[i]]
            if m.deps and i not in shared:
                deps_hash = self.client.hgetall(self.pk[m.queue].deps(m.run_id))
                assert deps_hash == {d: f"{j}|{p}|{q}" for j, (d, p, q) in enumerate(m.deps)}

    def enqueue(self) -> None:
        q, task = self.rng.choice(QUEUES), self.rng.choice(list(TASKS))
        run_id = f"solo{self.next()}"
        self.note(f"enqueue {run_id}@{q} ({task})")
        h = self.tasks[task].with_options(queue=q, run_id=run_id).enqueue("solo")
        assert h.created
        self.runs[run_id] = ModelRun(run_id, q, None, TASKS[task], [], "", ["solo"], False,
                                     "pending")
        self.handles[run_id] = h

    def tick(self) -> int:
        """The workers' clock at a worker's step: 1 ms later than at the one before. (Time
        passes; and an outbox entry's version is the millisecond it was written in, or one
        more than the entry it replaced: an entry cleared and written again in the same
        millisecond takes the version a slower relay read for the one before, and that
        relay's ``relayed`` then removes it unrelayed. On a clock that stands still, seeds
        with a slow relay hit that within a few hundred.)"""
        self.now += 1
        return self.now

    def claim(self, queue: str) -> None:
        lease = self.rng.choice(LEASES)
        owner = self.rng.choice(("w1", "w2"))
        self.tick()
        self.note(f"claim {queue} at +{self.now - self.start} ms, lease {lease}")
        call = CLAIM.call(self.pk[queue], 100, owner, lease, self.dead_retention, now=self.now)
        result = CLAIM.parse(self.jq.scripts.run(call))
        take = []
        for m in self.runs.values():
            if m.queue != queue:
                continue
            if m.state == "pending":
                take.append(m.run_id)
            elif m.state == "running" and (m.lease_until or 0) <= self.now:
                if m.attempt >= m.max_attempts:  # its last attempt's lease expired: dead
                    self.events["buried by a claim"] += 1
                    self.finished(m, "dead", error=f"lease expired on attempt {m.attempt} of "
                                  f"{m.max_attempts} (worker died or stalled)")
                else:
                    self.events["lease taken back"] += 1
                    take.append(m.run_id)
        assert sorted(c.run_id for c in result.runs) == sorted(take), (
            f"claimed {sorted(c.run_id for c in result.runs)}, the model expected {sorted(take)}"
        )
        for c in result.runs:
            m = self.runs[c.run_id]
            m.state, m.attempt, m.lease_until = "running", m.attempt + 1, self.now + lease
            assert c.fence > self.last_fence[queue], "a claim's fence did not grow"
            self.last_fence[queue] = m.fence = c.fence
            assert c.attempt == m.attempt, (c, m)
            self.holdings.append(Holding(c.run_id, c.fence))
        self.holdings = self.holdings[-40:]

    def current(self) -> list[Holding]:
        return [h for h in self.holdings
                if self.runs[h.run_id].state == "running" and self.runs[h.run_id].fence == h.fence]

    def complete(self, h: Holding) -> None:
        m = self.runs[h.run_id]
        result = json.dumps(f"{h.run_id}#{self.next()}")
        self.note(f"complete {h.run_id} fence +{h.fence - self.start * 1000} -> {result}")
        call = COMPLETE.call(self.pk[m.queue], [(h.run_id, h.fence, result)], self.retention,
                             now=self.tick())
        (out,) = COMPLETE.parse(self.jq.scripts.run(call))
        why = refusal(m, h.fence)
        self.events[f"complete refused: {why}" if why else "completed"] += 1
        assert (out.accepted, out.status) == (why is None, why or "done"), (out, why)
        if why is None:
            # The waiting runs of its own partition hear of it in the commit's own call; the
            # others through the outbox (then the relay tells them all, the first again).
            # (An outbox entry of an earlier life not relayed yet keeps it in the outbox.)
            here = [(q, r) for q, r in m.parents if q == m.queue]
            remote = len(here) < len(m.parents) or m.run_id in self.outbox[m.queue]
            assert out.relay == remote, f"{h.run_id}: relay flag {out.relay}"
            m.state, m.result, m.error, m.lease_until = "done", result, None, None
            if remote:
                self.to_outbox(m.queue, m.run_id)
            if here:
                self.events["counted in the commit's call"] += 1
                self.model_deliver(m.queue, [(r, m.run_id, "d" + result) for _, r in here])

    def fail(self, h: Holding, retry: int | None) -> None:
        m = self.runs[h.run_id]
        error = f"boom {self.next()}"
        self.note(f"fail {h.run_id} fence +{h.fence - self.start * 1000} retry {retry}: {error}")
        call = FAIL.call(self.pk[m.queue], h.run_id, h.fence, error, retry, self.dead_retention,
                         now=self.tick())
        out = FAIL.parse(self.jq.scripts.run(call))
        why = refusal(m, h.fence)
        if why is not None:
            assert (out.accepted, out.status) == (False, why), (out, why)
        elif retry is not None and m.attempt < m.max_attempts:
            assert (out.accepted, out.status) == (True, "retry"), out
            m.state, m.lease_until, m.error = "pending", None, error
        else:
            assert (out.accepted, out.status, out.relay) == (True, "dead", bool(m.parents)), out
            self.finished(m, "dead", error=error)

    def cancel(self, run_id: str) -> None:
        m = self.runs[run_id]
        reason = f"stop {self.next()}"
        self.note(f"cancel {run_id} (model: {m.state}): {reason}")
        mark = self.version
        changed, was = self.model_cancel(run_id, reason, running=True)
        try:
            got = self.jq.cancel(run_id, m.queue, reason)
        except OperationRefused:
            assert not changed, f"cancel of {run_id} refused; the model cancelled it ({was})"
            return
        assert changed and got == was, (got, was, changed)
        self.model_cascade(m.queue, mark)

    def requeue(self, run_id: str) -> None:
        m = self.runs[run_id]
        self.note(f"requeue {run_id} (model: {m.state})")
        refused = m.state in UNFINISHED or bool(m.deps)
        try:
            was = self.jq.requeue(run_id, m.queue, force=True)
        except OperationRefused:
            assert refused, f"requeue of {run_id} refused; the model requeued it"
            return
        assert not refused and was == m.state, (was, m.state)
        self.events[f"requeued a {was} run{' waited on' if m.parents else ''}"] += 1
        m.state, m.attempt, m.result, m.error = "pending", 0, None, None

    def relay(self, queue: str) -> None:
        self.note(f"relay {queue}")
        mark = self.version
        self.jq.relay(queue)
        self.model_cascade(queue, mark)

    def relay_pass(self, queue: str, how: str) -> None:
        """One relay pass: whole, dying before it clears its entries ('crash'), or stopped
        there until ``slow_relay_ends`` ('slow')."""
        self.note(f"relay pass {queue}" + {"whole": "", "crash": " (dies before clearing its "
                  "outbox)", "slow": " (slow: stops before clearing its outbox)"}[how])
        steps = relay.relay_steps(self.jq, self.pk[queue])
        if how == "whole":
            self.jq.run_steps(steps)
            self.model_pass(queue)
            return
        stopped = self.jq.run_steps(until_relayed(steps))
        self.model_pass(queue, clear=False)
        if stopped is None:  # an empty outbox: the pass ended before clearing anything
            return
        if how == "crash":
            steps.close()
            self.events["relay died with entries"] += 1
        else:
            self.slow = (queue, steps, stopped, self.read)

    def slow_relay_ends(self) -> None:
        assert self.slow is not None
        queue, steps, request, read = self.slow
        self.slow = None
        self.note(f"the slow relay pass of {queue} clears its outbox entries")
        self.jq.run_steps(resume(steps, request))
        self.model_relayed(queue, read)
        self.events["a slow relay cleared its entries"] += 1

    def advance(self) -> None:
        ms = self.rng.choice((1, 1_000, LEASES[0] + 1, LEASES[1] + 1))
        self.note(f"clock +{ms}")
        self.now += ms

    def step(self) -> None:
        rng = self.rng
        current = self.current()
        stale = [h for h in self.holdings if h not in current]
        finished = [r for r, m in self.runs.items() if m.state not in UNFINISHED]
        roots = [r for r in finished if not self.runs[r].deps]
        # A run the slow relay read, to run again before that relay clears its entry.
        again = [r for r in roots if self.slow is not None and r in self.slow[3]]
        choices: list[tuple[float, str]] = [
            (3 if len(self.runs) < MAX_RUNS - 5 else 0, "create"),
            (0.7 if len(self.runs) < MAX_RUNS else 0, "enqueue"),
            (4, "claim"),
            (7 if current else 0, "complete"),
            (3 if current else 0, "fail"),
            (1.5 if current else 0, "expire"),
            (1 if stale else 0, "stale"),
            (1.5 if self.runs else 0, "cancel"),
            (3, "relay"),
            (1.5, "pass"),
            (2, "crash"),
            (2.5 if self.slow is None else 0, "slow"),
            (0 if self.slow is None else 0.7, "slow-ends"),
            (1.5 if roots else 0, "requeue"),
            (0.3 if finished else 0, "requeue-any"),
            (4 if again else 0, "requeue-read"),
            (0.5, "advance"),
        ]
        what = rng.choices([n for _, n in choices], [w for w, _ in choices])[0]
        queue = rng.choice(QUEUES)
        if what == "create":
            self.create_flow()
        elif what == "enqueue":
            self.enqueue()
        elif what == "claim":
            self.claim(queue)
        elif what == "complete":
            self.complete(rng.choice(current))
        elif what == "fail":
            self.fail(rng.choice(current), rng.choice((None, 0)))
        elif what == "expire":
            self.now += max(LEASES) + 1
            self.note("clock past every lease")
            self.claim(self.runs[rng.choice(current).run_id].queue)
        elif what == "stale":
            h = rng.choice(stale)
            if rng.random() < 0.7:
                self.complete(h)
            else:
                self.fail(h, rng.choice((None, 0)))
        elif what == "cancel":
            pool = [r for r, m in self.runs.items() if m.state in UNFINISHED]
            self.cancel(rng.choice(pool if pool and rng.random() < 0.9 else sorted(self.runs)))
        elif what == "relay":
            self.relay(queue)
        elif what in ("pass", "crash", "slow"):
            self.relay_pass(queue, {"pass": "whole"}.get(what, what))
        elif what == "slow-ends":
            self.slow_relay_ends()
        elif what == "requeue":
            self.requeue(rng.choice(roots))
        elif what == "requeue-read":
            self.requeue(rng.choice(again))
        elif what == "requeue-any":
            self.requeue(rng.choice(finished))
        else:
            self.advance()
        self.passes_done()

    def drain(self) -> None:
        """Run everything to its end: relay, claim, complete, until no run is unfinished and
        every outbox is empty."""
        if self.slow is not None:
            self.slow_relay_ends()
        for _ in range(DRAIN_ROUNDS):
            if not any(m.state in UNFINISHED for m in self.runs.values()) and not any(
                self.outbox.values()
            ):
                return
            self.now += max(LEASES) + 1  # leases of runs held by nobody any more expire
            for q in QUEUES:
                self.relay(q)
                self.passes_done()
                self.claim(q)
            for h in self.current():
                self.complete(h)
            self.check()
        raise AssertionError(
            "runs left unfinished: "
            + ", ".join(f"{r} {m.state}" for r, m in self.runs.items() if m.state in UNFINISHED)
        )

    # -- checks ----------------------------------------------------------------------------

    def check(self, public: set[str] | None = None, failed: bool = False) -> None:
        """Redis against the model: every run and every partition's indexes, in one round
        trip; the public reads for the runs in ``public`` (and ``failed_children()``)."""
        ids = list(self.runs)
        pipe = self.client.pipeline(transaction=False)
        for r in ids:
            m, keys = self.runs[r], self.pk[self.runs[r].queue]
            pipe.hgetall(keys.run(r))
            pipe.pttl(keys.run(r))
            if m.deps:
                pipe.hgetall(keys.got(r))
                pipe.hkeys(keys.deps(r))
                pipe.pttl(keys.deps(r))
                pipe.pttl(keys.got(r))
        for q in QUEUES:
            keys = self.pk[q]
            pipe.zrange(keys.outbox, 0, -1)
            pipe.zrange(keys.waiting, 0, -1)
            pipe.zrange(keys.due, 0, -1)
            pipe.zrange(keys.leases, 0, -1, withscores=True)
            pipe.zrange(keys.dead, 0, -1)
            pipe.zrange(keys.done, 0, -1)
            pipe.hget(keys.stats, "released")
        replies = iter(pipe.execute())
        for r in ids:
            m = self.runs[r]
            h, ttl = next(replies), next(replies)
            got, deps, deps_ttl, got_ttl = ({}, [], -2, -2)
            if m.deps:
                got, deps, deps_ttl, got_ttl = (next(replies) for _ in range(4))
            where = f"run {r} (model {m.state}, left {m.left}, got {m.got})"
            assert h.get("state") == m.state, f"{where}: redis says {h.get('state')}"
            assert int(h.get("attempt", 0)) == m.attempt, f"{where}: attempt {h.get('attempt')}"
            if m.state in ("dead", "cancelled"):
                assert h.get("error") == m.error, f"{where}: error {h.get('error')!r}"
            if m.state == "done":
                assert h.get("result") == m.result, f"{where}: result {h.get('result')!r}"
            parents = json.loads(h["parents"]) if h.get("parents") else []
            assert [tuple(p) for p in parents] == m.parents, f"{where}: parents {parents}"
            # A finished record stays until its outcome is relayed, then expires.
            unrelayed = m.state in UNFINISHED or r in self.outbox[m.queue]
            assert (ttl == -1) == unrelayed and ttl != -2, f"{where}: pttl {ttl}"
            if not m.deps:
                continue
            # Heard of by membership: the same dependencies, with the outcomes first heard.
            assert got == m.got, f"{where}: redis got {got}"
            assert int(h["left"]) == m.left, f"{where}: redis left {h['left']}"
            if m.state == "waiting":
                assert int(h["left"]) == len(set(deps) - set(got)), f"{where}: {h}, {got}"
            if m.receives and m.releases:
                assert json.loads(h["payload"]) == m.payload, (
                    f"{where}: released with {h['payload']}, the model says {m.payload}"
                )
            # Its dependency keys expire once it is released, or its order is carried out.
            live = m.state == "waiting" or "!" + r in self.outbox[m.queue]
            assert (deps_ttl == -1) == live and deps_ttl != -2, f"{where}: deps pttl {deps_ttl}"
            if m.got:
                assert (got_ttl == -1) == live and got_ttl != -2, f"{where}: pttl {got_ttl}"
            else:
                assert got_ttl == -2, f"{where}: got pttl {got_ttl}"
        for q in QUEUES:
            outbox, waiting, due, leases, dead, done, released = (next(replies) for _ in range(7))
            mine = {s: {r for r, m in self.runs.items() if m.queue == q and m.state == s}
                    for s in ("waiting", "pending", "running", "dead", "done", "cancelled")}
            assert set(outbox) == set(self.outbox[q]), (
                f"outbox of {q}: redis {sorted(outbox)}, model {sorted(self.outbox[q])}"
            )
            assert set(waiting) == mine["waiting"], f"{q} waiting: {waiting}"
            assert set(due) == mine["pending"], f"{q} due: {due}"
            assert {r: int(s) for r, s in leases} == {
                r: self.runs[r].lease_until for r in mine["running"]
            }, f"{q} leases: {leases}"
            assert set(dead) == mine["dead"], f"{q} dead: {dead}"
            assert set(done) == mine["done"] | mine["cancelled"], f"{q} done: {done}"
            assert int(released or 0) == self.released[q], (
                f"{q}: redis released {released} runs, the model {self.released[q]}"
            )
        for r in sorted(public or ()):
            self.check_public(r, failed)

    def check_public(self, run_id: str, failed: bool) -> None:
        m, handle = self.runs[run_id], self.handles[run_id]
        run = handle.refresh()
        assert run.state == m.state, f"{run_id}: get_run says {run.state}, the model {m.state}"
        if not m.deps:
            assert handle.dependencies() == []
            return
        assert run.dependencies_left == m.left, f"{run_id}: left {run.dependencies_left}"
        seen = [(d.run_id, d.queue, d.policy, d.outcome, d.result_json, d.error)
                for d in handle.dependencies()]
        expected = []
        for dep, policy, q in m.deps:
            heard = m.got.get(dep)
            kind = HEARD[heard[0]] if heard else None
            body = heard[1:] if heard else None
            expected.append((dep, q, policy, kind, body if kind == "done" else None,
                             body if kind in ("dead", "cancelled") else None))
        assert seen == expected, f"{run_id}: dependencies() {seen}, the model {expected}"
        if failed:
            listed = [d.run_id for d in handle.failed_children()]
            assert listed == [d for d, _, _ in m.deps if m.got.get(d, " ")[0] in "xc"], (
                f"{run_id}: failed_children() {listed}"
            )


def run_seed(url: str, seed: int, spy: Spy, events: Counter[str] | None = None) -> None:
    world = World(url, seed, spy, Counter() if events is None else events)
    try:
        for _ in range(STEPS):
            before = {r: m.snapshot() for r, m in world.runs.items()}
            world.step()
            changed = {r for r, m in world.runs.items() if before.get(r) != m.snapshot()}
            world.check(public=changed)
        world.drain()
        world.check(public=set(world.runs), failed=True)
        assert all(m.releases <= 1 and m.state not in UNFINISHED for m in world.runs.values())
    except AssertionError as exc:
        trace = "\n  ".join(world.trace[-60:])
        raise Discrepancy(f"seed {seed}: {exc}\nsteps (last 60):\n  {trace}") from exc
    finally:
        spy.passes.clear()
        world.close()


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> Iterator[Spy]:
    s = Spy()
    monkeypatch.setattr(relay, "relay_steps", s.relay_steps)
    yield s


def seeds() -> list[int]:
    given = os.environ.get("JOBQUEUE_WORKFLOW_SEEDS")
    return [int(s) for s in given.split(",")] if given else list(SEEDS)


# The cases the seeds must go through, each at least once (World.events).
COVERED = (
    *(f"{kind} under {policy}" for kind in ("done", "dead", "cancelled") for policy in POLICIES),
    "died of a dependency",
    "released early (continue)",
    "released with results",
    "delivered again, not counted",
    "delivered to a run no longer waiting",
    "relay died with entries",
    "a slow relay cleared its entries",
    "an entry written again while relayed stays",
    "attached a finished run",
    "a step shared with a run created before",
    "cascade cancelled a pending run",
    "cascade cancelled a waiting run",
    "cascade cancelled a running run",
    "cascade left a running run",
    "kept by the cascade",
    "buried by a claim",
    "lease taken back",
    "complete refused: fenced",
    "complete refused: cancelled",
    "complete refused: finished",
    "complete refused: not-running",
    "outbox entry of a run running again",
    "requeued a done run waited on",
    "requeued a dead run waited on",
    "requeued a cancelled run waited on",
    "counted in the commit's call",
)


def test_workflows_follow_the_reference_model(real_server: EmbeddedServer, spy: Spy) -> None:
    events: Counter[str] = Counter()
    for seed in seeds():
        run_seed(real_server.url, seed, spy, events)
    if "JOBQUEUE_WORKFLOW_SEEDS" not in os.environ:
        missed = [case for case in COVERED if not events[case]]
        assert not missed, f"no seed went through: {missed}"


MUTANTS = {
    # deliver.lua counting deliveries instead of the dependencies heard of: a dependency
    # delivered again (a relay that died before clearing its outbox, a requeued run that
    # ran again, a finished run attached to a new workflow) lowers 'left' again
    "deliver-counts-with-a-counter": (
        "deliver",
        " or w.got[dep] or read('HGET', w.got_key, dep)",
        "",
    ),
    # complete.lua counting a completion toward a waiting run of its own partition without the
    # membership check (a run completed in one life, then requeued and completed again)
    "complete-counts-with-a-counter": (
        "complete",
        " or w.got[dep] or read('HGET', w.got_key, dep)",
        "",
    ),
    # complete.lua not listing a finished run in its outbox: the runs waiting on it never
    # hear of it
    "complete-loses-the-outbox-entry": (
        "complete",
        "r.outbox = outbox_entry(KEYS[8], run, run_id, now)",
        "r.outbox = nil",
    ),
    # deliver.lua treating every edge as 'ignore'
    "deliver-ignores-the-policy": (
        "deliver",
        "local policy = string.match(spec, '^%d+|(%a+)|') or 'fail'",
        "local policy = 'ignore'",
    ),
}


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_the_model_catches_a_broken_script(
    mutant: str, real_server: EmbeddedServer, spy: Spy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model is not vacuous: with a script broken this way, one of the seeds fails (the
    first failing seed ends the test)."""
    name, old, new = MUTANTS[mutant]
    good = scripts()[name]
    source, plain = good.source.replace(old, new), good.plain.replace(old, new)
    assert source != good.source, f"the mutant's line is not in {name}.lua any more"
    broken = Script(
        name, source, hashlib.sha1(source.encode()).hexdigest(),
        plain, hashlib.sha1(plain.encode()).hexdigest(),
    )
    monkeypatch.setitem(scripts(), name, broken)
    with pytest.raises(Discrepancy):
        for seed in SEEDS:
            run_seed(real_server.url, seed, spy)
