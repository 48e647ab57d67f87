"""Spans to OpenTelemetry (the ``otel`` extra: opentelemetry-api; the app sets up the SDK and
its exporter).

``jq.use(OpenTelemetryMiddleware())`` on the queue that enqueues and on the one the worker
runs (the same app object, usually):

* ``before_enqueue`` records a PRODUCER span ``enqueue <task>`` (a child of whatever span is
  current in the caller, a web request's say) and puts its W3C trace context into the run's
  meta (``traceparent``, and ``tracestate`` when there is one);
* ``before_run`` starts a CONSUMER span ``run <task>`` whose parent is that enqueue span (read
  back from ``ctx.meta``), current while the task's code runs, so the task's own spans nest
  under it; ``after_run`` ends it, with the exception recorded and an error status when the
  code raised (a cancel's CancelledError: the error status only).

Attributes: ``jobqueue.run_id``, ``jobqueue.task``, ``jobqueue.queue``, and on the run span
``jobqueue.attempt`` and ``jobqueue.fence``. The enqueue span covers the hook, not the Redis
write that follows it (the hooks run before anything is written).
"""

from __future__ import annotations

import contextvars
from typing import Any

from opentelemetry import context, trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, TracerProvider
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from jobqueue.context import RunContext
from jobqueue.hooks import EnqueueRequest, Middleware

_PROPAGATOR = TraceContextTextMapPropagator()
# The run span and the context token of the run executing here (a thread, or an asyncio task:
# before_run and after_run run in the same one).
_current: contextvars.ContextVar[tuple[Span, Any] | None] = contextvars.ContextVar(
    "jobqueue_otel_run", default=None
)


class OpenTelemetryMiddleware(Middleware):
    def __init__(self, tracer_provider: TracerProvider | None = None) -> None:
        self.tracer = trace.get_tracer("jobqueue", tracer_provider=tracer_provider)

    def before_enqueue(self, request: EnqueueRequest) -> None:
        attributes = {
            "jobqueue.run_id": request.run_id,
            "jobqueue.task": request.task,
            "jobqueue.queue": request.queue,
        }
        with self.tracer.start_as_current_span(
            f"enqueue {request.task}", kind=SpanKind.PRODUCER, attributes=attributes
        ):
            carrier: dict[str, str] = {}
            _PROPAGATOR.inject(carrier)
        request.meta.update(carrier)

    def before_run(self, ctx: RunContext) -> None:
        parent = _PROPAGATOR.extract(dict(ctx.meta))
        span = self.tracer.start_span(
            f"run {ctx.task}",
            context=parent,
            kind=SpanKind.CONSUMER,
            attributes={
                "jobqueue.run_id": ctx.run_id,
                "jobqueue.task": ctx.task,
                "jobqueue.queue": ctx.queue,
                "jobqueue.attempt": ctx.attempt,
                "jobqueue.fence": ctx.fence,
            },
        )
        token = context.attach(trace.set_span_in_context(span))
        _current.set((span, token))

    def after_run(self, ctx: RunContext, error: BaseException | None) -> None:
        current = _current.get()
        if current is None:  # before_run failed: nothing to end
            return
        _current.set(None)
        span, token = current
        if error is not None:
            if isinstance(error, Exception):  # not a cancel's CancelledError
                span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
        span.end()
        context.detach(token)
