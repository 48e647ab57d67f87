"""The clients' public methods for workflows (docs/workflows.md): chains, groups, chords,
named workflows and batches, a run's dependencies, and relaying finished runs to those waiting
on them. ``WorkflowMethods`` is a base of ``JobQueue`` and ``AsyncWorkflowMethods`` of
``AsyncJobQueue``; the steps are ``flows``' and ``relay``'. The typed ``chain`` overloads give
the handle the last step's result type."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar, overload

from jobqueue.client.drivers import AsyncDriver, SyncDriver
from jobqueue.client.flows import dependencies_steps
from jobqueue.client.relay import relay_cascade_steps, relay_until_quiet
from jobqueue.handles import (
    AsyncFlowHandle,
    FlowHandle,
)
from jobqueue.models import DependencyState
from jobqueue.workflows.canvas import (
    Signature,
    batch_graph,
    chain_graph,
    chord_graph,
    group_graph,
    workflow_graph,
)

R = TypeVar("R")


class WorkflowMethods(SyncDriver):
    """JobQueue's workflows."""

    @overload
    def chain(
        self,
        s1: Signature[R],
        /,
        *,
        on_failure: str = ...,
        flow_id: str | None = ...,
    ) -> FlowHandle[R]: ...

    @overload
    def chain(
        self,
        s1: Signature[Any],
        s2: Signature[R],
        /,
        *,
        on_failure: str = ...,
        flow_id: str | None = ...,
    ) -> FlowHandle[R]: ...

    @overload
    def chain(
        self,
        s1: Signature[Any],
        s2: Signature[Any],
        s3: Signature[R],
        /,
        *,
        on_failure: str = ...,
        flow_id: str | None = ...,
    ) -> FlowHandle[R]: ...

    @overload
    def chain(
        self,
        s1: Signature[Any],
        s2: Signature[Any],
        s3: Signature[Any],
        s4: Signature[R],
        /,
        *,
        on_failure: str = ...,
        flow_id: str | None = ...,
    ) -> FlowHandle[R]: ...

    @overload
    def chain(
        self,
        s1: Signature[Any],
        s2: Signature[Any],
        s3: Signature[Any],
        s4: Signature[Any],
        s5: Signature[R],
        /,
        *,
        on_failure: str = ...,
        flow_id: str | None = ...,
    ) -> FlowHandle[R]: ...

    @overload
    def chain(
        self,
        s1: Signature[Any],
        s2: Signature[Any],
        s3: Signature[Any],
        s4: Signature[Any],
        s5: Signature[Any],
        s6: Signature[R],
        /,
        *,
        on_failure: str = ...,
        flow_id: str | None = ...,
    ) -> FlowHandle[R]: ...

    @overload
    def chain(
        self, *steps: Signature[Any], on_failure: str = ..., flow_id: str | None = ...
    ) -> FlowHandle[Any]: ...

    def chain(
        self, *steps: Signature[Any], on_failure: str = "fail", flow_id: str | None = None
    ) -> FlowHandle[Any]:
        """Steps one after another: each waits on the one before it (a ``receiving`` step
        gets its result). ``on_failure``: what a step's death does to the next (see
        :data:`jobqueue.workflows.POLICIES`; ``fail``: the rest of the chain dies too). With
        ``flow_id`` (else random) the run ids are ``<flow_id>:<index>``, and creating the
        same chain again writes nothing."""
        return self._create_flow(chain_graph(steps, on_failure), flow_id)

    def group(
        self, steps: Sequence[Signature[R]], *, flow_id: str | None = None
    ) -> FlowHandle[R]:
        """Steps side by side (``results()`` waits for them all)."""
        return self._create_flow(group_graph(steps), flow_id)

    def chord(
        self,
        header: Sequence[Signature[Any]],
        callback: Signature[R],
        *,
        on_failure: str = "fail",
        flow_id: str | None = None,
    ) -> FlowHandle[R]:
        """The header's steps side by side, then ``callback`` once each finished, exactly
        once (a ``receiving`` callback gets their results as a list, in order)."""
        return self._create_flow(chord_graph(header, callback, on_failure), flow_id)

    def workflow(
        self, steps: Mapping[str, Signature[Any]], *, flow_id: str | None = None
    ) -> FlowHandle[Any]:
        """Named steps, each waiting on what its ``.after(...)`` names: other steps, or runs
        created before (their handles). The run ids are ``<flow_id>:<name>``."""
        return self._create_flow(workflow_graph(steps), flow_id)

    def batch(
        self,
        children: Sequence[Signature[Any]],
        *,
        on_success: Signature[Any] | None = None,
        on_dead: Signature[Any] | None = None,
        on_complete: Signature[Any] | None = None,
        batch_id: str | None = None,
    ) -> FlowHandle[Any]:
        """Children side by side, and callbacks that each run once: ``on_success`` when
        every child is done (it is cancelled at the first death), ``on_dead`` at the first
        child that dies or is cancelled (cancelled once all are done), ``on_complete`` when
        every child finished, whatever the outcomes. A running child may add more children
        (``ctx.add_to_flow``). A ``receiving`` callback gets the children's results as a list
        (None for a failed one). The handle names the callbacks (``batch["on_complete"]``);
        run ids are ``<batch_id>:<index>`` and ``<batch_id>:<callback>``."""
        callbacks = {"on_success": on_success, "on_dead": on_dead, "on_complete": on_complete}
        return self._create_flow(batch_graph(children, callbacks), batch_id)

    def dependencies(self, run_id: str, queue: str | None = None) -> list[DependencyState]:
        """See :meth:`RunHandle.dependencies`."""
        return self.run_steps(dependencies_steps(self, run_id, queue))

    def relay(self, queue: str) -> int:
        """Carry the outboxes of a queue's partitions to the runs waiting on their finished
        runs now (workers do it after their commits and every few seconds); returns the
        entries relayed."""
        self.run_steps(self._register_queue(queue))
        return sum(relay_until_quiet(self, keys) for keys in self.all_partition_keys(queue))


class AsyncWorkflowMethods(AsyncDriver):
    """AsyncJobQueue's workflows."""

    @overload
    async def chain(
        self,
        s1: Signature[R],
        /,
        *,
        on_failure: str = ...,
        flow_id: str | None = ...,
    ) -> AsyncFlowHandle[R]: ...

    @overload
    async def chain(
        self,
        s1: Signature[Any],
        s2: Signature[R],
        /,
        *,
        on_failure: str = ...,
        flow_id: str | None = ...,
    ) -> AsyncFlowHandle[R]: ...

    @overload
    async def chain(
        self,
        s1: Signature[Any],
        s2: Signature[Any],
        s3: Signature[R],
        /,
        *,
        on_failure: str = ...,
        flow_id: str | None = ...,
    ) -> AsyncFlowHandle[R]: ...

    @overload
    async def chain(
        self,
        s1: Signature[Any],
        s2: Signature[Any],
        s3: Signature[Any],
        s4: Signature[R],
        /,
        *,
        on_failure: str = ...,
        flow_id: str | None = ...,
    ) -> AsyncFlowHandle[R]: ...

    @overload
    async def chain(
        self,
        s1: Signature[Any],
        s2: Signature[Any],
        s3: Signature[Any],
        s4: Signature[Any],
        s5: Signature[R],
        /,
        *,
        on_failure: str = ...,
        flow_id: str | None = ...,
    ) -> AsyncFlowHandle[R]: ...

    @overload
    async def chain(
        self,
        s1: Signature[Any],
        s2: Signature[Any],
        s3: Signature[Any],
        s4: Signature[Any],
        s5: Signature[Any],
        s6: Signature[R],
        /,
        *,
        on_failure: str = ...,
        flow_id: str | None = ...,
    ) -> AsyncFlowHandle[R]: ...

    @overload
    async def chain(
        self, *steps: Signature[Any], on_failure: str = ..., flow_id: str | None = ...
    ) -> AsyncFlowHandle[Any]: ...

    async def chain(
        self, *steps: Signature[Any], on_failure: str = "fail", flow_id: str | None = None
    ) -> AsyncFlowHandle[Any]:
        """See :meth:`JobQueue.chain`."""
        return await self._create_flow(chain_graph(steps, on_failure), flow_id)

    async def group(
        self, steps: Sequence[Signature[R]], *, flow_id: str | None = None
    ) -> AsyncFlowHandle[R]:
        """See :meth:`JobQueue.group`."""
        return await self._create_flow(group_graph(steps), flow_id)

    async def chord(
        self,
        header: Sequence[Signature[Any]],
        callback: Signature[R],
        *,
        on_failure: str = "fail",
        flow_id: str | None = None,
    ) -> AsyncFlowHandle[R]:
        """See :meth:`JobQueue.chord`."""
        return await self._create_flow(chord_graph(header, callback, on_failure), flow_id)

    async def workflow(
        self, steps: Mapping[str, Signature[Any]], *, flow_id: str | None = None
    ) -> AsyncFlowHandle[Any]:
        """See :meth:`JobQueue.workflow`."""
        return await self._create_flow(workflow_graph(steps), flow_id)

    async def batch(
        self,
        children: Sequence[Signature[Any]],
        *,
        on_success: Signature[Any] | None = None,
        on_dead: Signature[Any] | None = None,
        on_complete: Signature[Any] | None = None,
        batch_id: str | None = None,
    ) -> AsyncFlowHandle[Any]:
        """See :meth:`JobQueue.batch`."""
        callbacks = {"on_success": on_success, "on_dead": on_dead, "on_complete": on_complete}
        return await self._create_flow(batch_graph(children, callbacks), batch_id)

    async def dependencies(
        self, run_id: str, queue: str | None = None
    ) -> list[DependencyState]:
        """See :meth:`JobQueue.dependencies`."""
        return await self.run_steps(dependencies_steps(self, run_id, queue))

    async def relay(self, queue: str) -> int:
        """See :meth:`JobQueue.relay`."""
        await self.run_steps(self._register_queue(queue))
        total = 0
        for keys in self.all_partition_keys(queue):
            total += await self.run_steps(relay_cascade_steps(self, keys))
        return total

