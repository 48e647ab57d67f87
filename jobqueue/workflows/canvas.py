"""Composing runs: signatures (a task with its arguments, not yet enqueued) and the graphs
chains, groups, chords and general workflows make of them. Pure: no I/O; the client creates a
graph (jobqueue.workflows.create) and the worker's relay moves it on (jobqueue.workflows.relay).

A graph is a list of nodes; a node waits on other nodes of the graph (by index) or on runs
that already exist (by run id and queue), each edge with the policy that decides what the
dependency's death does (see POLICIES)."""

from __future__ import annotations

import graphlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Generic, Protocol, TypeVar

from jobqueue.errors import ConfigError
from jobqueue.store.runs import MAX_RESULTS_BYTES as MAX_RESULTS_BYTES  # (its home before)

R_co = TypeVar("R_co", covariant=True)  # what the step returns: a step is read only

# What a dependency that died (or was cancelled) does to the run waiting on it:
#   fail      the waiting run dies too, and its unfinished dependencies are cancelled
#   ignore    the waiting run still runs once all are finished; the failure is listed
#   continue  the waiting run runs now, without waiting for the rest
#   remove    as if the edge never was (not listed among the failures)
#   skip      the waiting run is cancelled (never runs); nothing else is
POLICIES = ("fail", "ignore", "continue", "remove", "skip")
# A batch's callbacks: the name of each in the batch's FlowHandle, the policy of its edges
# from the children, and whether it runs only when a child died.
BATCH_CALLBACKS = {
    "on_success": ("skip", False),  # every child done; cancelled at the first death
    "on_dead": ("continue", True),  # at the first death; cancelled when all are done
    "on_complete": ("ignore", False),  # every child finished, whatever the outcomes
}

# The most runs one workflow may create in one call, and the most dependencies of one run.
MAX_FLOW_RUNS = 100_000
MAX_DEPENDENCIES = 100_000


class ExistingRun(Protocol):
    """A run created before (a RunHandle, an AsyncRunHandle): a workflow may wait on it."""

    @property
    def run_id(self) -> str: ...

    @property
    def queue(self) -> str: ...


@dataclass(frozen=True)
class RunRef:
    """An existing run named by its id (``depends_on=["invoice-42"]``): found in ``queue``,
    else looked up in every queue when the workflow is created (refused when absent, or
    present in several queues)."""

    run_id: str
    queue: str | None = None


def dependency_target(target: object) -> ExistingRun | RunRef:
    """What ``depends_on`` takes: a run id (text) or a run handle (anything with a run id
    and a queue: RunHandle, AsyncRunHandle, Run)."""
    if isinstance(target, str):
        return RunRef(target)
    if _is_existing(target) or isinstance(target, RunRef):
        return target  # type: ignore[return-value]
    raise ConfigError(
        f"depends_on takes run ids and run handles, not {type(target).__name__}"
    )


def check_policy(policy: str) -> str:
    if policy not in POLICIES:
        raise ConfigError(f"on_failure must be one of {', '.join(POLICIES)}, not {policy!r}")
    return policy


@dataclass(frozen=True)
class Dependency:
    """An edge: what the run waits on (a node's name in its workflow, another Signature of it,
    or an existing run) and what that one's death does (a POLICIES entry)."""

    target: str | Signature[Any] | ExistingRun | RunRef
    policy: str = "fail"


@dataclass(frozen=True, eq=False)
class Signature(Generic[R_co]):
    """A task with its arguments, to run as a step of a workflow: ``task.s(*args,
    **kwargs)``, or ``task.receiving(*args, **kwargs)`` for a step that gets its
    dependencies' results first in its arguments (a chain step the previous step's result; a
    chord callback or a workflow step the list of its dependencies' results, in the order
    given, None for a failed one)."""

    task: Any  # the jobqueue.tasks.Task (this module sits below it)
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    receives: bool = False
    run_id: str | None = None
    queue: str | None = None
    dependencies: tuple[Dependency, ...] = ()
    cancel_running: bool = False

    def after(
        self, *targets: str | Signature[Any] | ExistingRun, on_failure: str = "fail"
    ) -> Signature[R_co]:
        """This step, waiting also on ``targets`` (node names or signatures of the same
        workflow, or runs created before), each with the policy ``on_failure``."""
        check_policy(on_failure)
        more = tuple(Dependency(t, on_failure) for t in targets)
        return replace(self, dependencies=self.dependencies + more)

    def with_options(
        self,
        *,
        run_id: str | None = None,
        queue: str | None = None,
        cancel_running: bool | None = None,
        depends_on: Sequence[str | ExistingRun] | None = None,
        on_failure: str = "fail",
    ) -> Signature[R_co]:
        """This step with its own run id (else the workflow's id and the step's name), queue
        (else its task's), or ``cancel_running=True``: when one of its dependencies dies under
        the ``fail`` policy, its running dependencies are cancelled too (their workers are
        fenced out), not only the pending ones. ``depends_on``: runs created before that it
        waits on too, by run id or handle, each with the policy ``on_failure``."""
        changes: dict[str, Any] = {}
        if depends_on is not None:
            check_policy(on_failure)
            if isinstance(depends_on, str):
                raise ConfigError("depends_on is a list of run ids or handles, not one text")
            more = tuple(Dependency(dependency_target(t), on_failure) for t in depends_on)
            changes["dependencies"] = self.dependencies + more
        if run_id is not None:
            changes["run_id"] = run_id
        if queue is not None:
            changes["queue"] = queue
        if cancel_running is not None:
            changes["cancel_running"] = cancel_running
        return replace(self, **changes)

    def __repr__(self) -> str:
        how = "receiving" if self.receives else "s"
        return f"{self.task.name}.{how}(*{self.args!r}, **{dict(self.kwargs)!r})"


@dataclass
class Node:
    """One run of a graph: its signature, its name in the graph, what it waits on (indexes of
    other nodes, or existing runs) and how it receives results ('', 'one' or 'all')."""

    name: str
    signature: Signature[Any]
    waits_on: list[tuple[int | ExistingRun | RunRef, str]] = field(default_factory=list)
    receives: str = ""
    on_death_only: bool = False


@dataclass
class Graph:
    nodes: list[Node]

    def check(self) -> None:
        """Every edge inside the graph, no cycle, bounded sizes (ConfigError otherwise)."""
        if not self.nodes:
            raise ConfigError("a workflow needs at least one step")
        if len(self.nodes) > MAX_FLOW_RUNS:
            raise ConfigError(f"a workflow creates at most {MAX_FLOW_RUNS} runs in one call")
        sorter: graphlib.TopologicalSorter[int] = graphlib.TopologicalSorter()
        for i, node in enumerate(self.nodes):
            if len(node.waits_on) > MAX_DEPENDENCIES:
                raise ConfigError(
                    f"step {node.name!r} waits on {len(node.waits_on)} runs; at most "
                    f"{MAX_DEPENDENCIES}"
                )
            inner = [t for t, _ in node.waits_on if isinstance(t, int)]
            if i in inner:
                raise ConfigError(f"step {node.name!r} waits on itself")
            seen: set[object] = set()
            for target, _ in node.waits_on:
                key = edge_key(target)
                if key in seen:
                    what = self.nodes[target].name if isinstance(target, int) else target.run_id
                    raise ConfigError(
                        f"step {node.name!r} waits on {what!r} twice: name each dependency "
                        "once, with the one policy it is to have"
                    )
                seen.add(key)
            sorter.add(i, *inner)
        try:
            sorter.prepare()
        except graphlib.CycleError as exc:
            names = " -> ".join(self.nodes[i].name for i in exc.args[1])
            raise ConfigError(f"a workflow's dependencies form a cycle: {names}") from None


def _is_existing(target: object) -> bool:
    return isinstance(getattr(target, "run_id", None), str) and isinstance(
        getattr(target, "queue", None), str
    )


def chain_graph(steps: Sequence[Signature[Any]], on_failure: str = "fail") -> Graph:
    """Each step waits on the one before it; a receiving step gets its result."""
    check_policy(on_failure)
    sigs = _signatures(steps, "chain")
    if sigs and sigs[0].receives:
        raise ConfigError("a chain's first step has no result to receive: use task.s(...)")
    nodes = [Node(str(i), s, receives="one" if s.receives else "") for i, s in enumerate(sigs)]
    for i in range(1, len(nodes)):
        nodes[i].waits_on.append((i - 1, on_failure))
    _add_declared(nodes)
    return Graph(nodes)


def group_graph(steps: Sequence[Signature[Any]]) -> Graph:
    """Runs side by side, none waiting on another."""
    nodes = [Node(str(i), s) for i, s in enumerate(_signatures(steps, "group"))]
    _add_declared(nodes)
    return Graph(nodes)


def chord_graph(
    header: Sequence[Signature[Any]], callback: Signature[Any], on_failure: str = "fail"
) -> Graph:
    """The header's runs side by side, then the callback once they all finished; a receiving
    callback gets their results as a list, in the header's order."""
    check_policy(on_failure)
    nodes = [Node(str(i), s) for i, s in enumerate(_signatures(header, "chord"))]
    if not isinstance(callback, Signature):
        raise ConfigError("a chord's callback is a signature: task.s(...) or task.receiving()")
    last = Node(str(len(nodes)), callback, receives="all" if callback.receives else "")
    last.waits_on = [(i, on_failure) for i in range(len(nodes))]
    nodes.append(last)
    _add_declared(nodes)
    return Graph(nodes)


def batch_graph(
    children: Sequence[Signature[Any]], callbacks: Mapping[str, Signature[Any] | None]
) -> Graph:
    """The children side by side (more may be added by a running child, see
    ``RunContext.add_to_flow``), and each callback given (BATCH_CALLBACKS: on_success,
    on_dead, on_complete) waiting on all of them; a receiving callback gets their results
    as a list, in order (None for a failed one)."""
    nodes = [Node(str(i), s) for i, s in enumerate(_signatures(children, "batch"))]
    if not nodes:
        raise ConfigError("a batch needs at least one child (a running child can add more)")
    given = {name: cb for name, cb in callbacks.items() if cb is not None}
    if not given:
        raise ConfigError("a batch needs a callback: on_success, on_dead or on_complete")
    for name in BATCH_CALLBACKS:  # this order: on_complete, when given, comes last
        callback = given.pop(name, None)
        if callback is None:
            continue
        if not isinstance(callback, Signature):
            raise ConfigError(f"a batch's {name} is a signature: task.s(...) or "
                              "task.receiving(...)")
        policy, on_death_only = BATCH_CALLBACKS[name]
        node = Node(name, callback, receives="all" if callback.receives else "",
                    on_death_only=on_death_only)
        node.waits_on = [(i, policy) for i in range(len(children))]
        nodes.append(node)
    if given:
        raise ConfigError(f"a batch's callbacks are {', '.join(BATCH_CALLBACKS)}, not "
                          f"{', '.join(map(repr, given))}")
    _add_declared(nodes)
    return Graph(nodes)


def workflow_graph(steps: Mapping[str, Signature[Any]]) -> Graph:
    """Named steps; each waits on what its ``after(...)`` names. A receiving step gets the list
    of its dependencies' results."""
    if not isinstance(steps, Mapping):
        raise ConfigError("a workflow's steps are a mapping of name to signature")
    for name in steps:
        if not isinstance(name, str) or not name:
            raise ConfigError(f"a step's name is a non-empty string, not {name!r}")
    nodes = [Node(name, s) for name, s in zip(steps, _signatures(list(steps.values()),
                                                                  "workflow"), strict=True)]
    for node in nodes:
        if node.signature.receives:
            node.receives = "all"
    _add_declared(nodes)
    for node in nodes:
        if node.receives and not node.waits_on:
            raise ConfigError(
                f"step {node.name!r} receives results but waits on nothing: give it "
                ".after(...), or make it with task.s(...)"
            )
    return Graph(nodes)


def edge_key(target: int | ExistingRun | RunRef) -> int | tuple[str, str | None]:
    """What makes two edges of a step the same edge."""
    if isinstance(target, int):
        return target
    return (target.run_id, target.queue)


def _signatures(steps: Sequence[Signature[Any]], what: str) -> list[Signature[Any]]:
    steps = list(steps)
    for s in steps:
        if not isinstance(s, Signature):
            raise ConfigError(
                f"a {what}'s steps are signatures (task.s(...) or task.receiving(...)), "
                f"not {type(s).__name__}"
            )
    return steps


def _add_declared(nodes: list[Node]) -> None:
    """The edges the signatures declare with ``after(...)``."""
    by_name = {n.name: i for i, n in enumerate(nodes)}
    by_signature = {id(n.signature): i for i, n in enumerate(nodes)}
    for node in nodes:
        for dep in node.signature.dependencies:
            target = dep.target
            if isinstance(target, str):
                if target not in by_name:
                    raise ConfigError(f"step {node.name!r} waits on {target!r}: no such step")
                node.waits_on.append((by_name[target], dep.policy))
            elif isinstance(target, Signature):
                if id(target) not in by_signature:
                    raise ConfigError(
                        f"step {node.name!r} waits on {target!r}, which is not a step of "
                        "this workflow"
                    )
                node.waits_on.append((by_signature[id(target)], dep.policy))
            elif _is_existing(target) or isinstance(target, RunRef):
                node.waits_on.append((target, dep.policy))
            else:
                raise ConfigError(
                    f"step {node.name!r} waits on {target!r}: a step's name, a signature of "
                    "the workflow or a run handle"
                )
