"""The sentry and otel middleware (jobqueue.integrations), with a real worker: Sentry through
a capturing transport (no network), OpenTelemetry through the SDK's in-memory exporter."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

import pytest
import sentry_sdk
from helpers import finished, make_worker, running
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from sentry_sdk.envelope import Envelope
from sentry_sdk.transport import Transport

from jobqueue.client.sync import JobQueue
from jobqueue.integrations.otel import OpenTelemetryMiddleware
from jobqueue.integrations.sentry import SentryMiddleware

# What this module checks does not depend on the backend: run on the real server only
# (real_only, tests/conftest.py); the scripts and the client API are tested on fakeredis too.
pytestmark = pytest.mark.real_only

# -- Sentry ----------------------------------------------------------------------------------


class Captured(Transport):
    envelopes: ClassVar[list[Envelope]] = []

    def capture_envelope(self, envelope: Envelope) -> None:
        Captured.envelopes.append(envelope)


@pytest.fixture
def sentry_events() -> Iterator[None]:
    """Sentry on, sending to Captured.envelopes."""
    Captured.envelopes = []
    sentry_sdk.init(dsn="https://public@sentry.invalid/1", transport=Captured,
                    default_integrations=False)
    try:
        yield
    finally:
        sentry_sdk.get_client().close()
        sentry_sdk.init()  # no DSN: off again for the other tests


def captured_events() -> list[dict[str, Any]]:
    sentry_sdk.flush()
    return [item.payload.json for env in Captured.envelopes for item in env.items
            if item.type == "event" and item.payload.json is not None]


def test_a_failed_attempt_is_sent_to_sentry_with_the_run_tags(
    fast_jq: JobQueue, sentry_events: None
) -> None:
    fast_jq.use(SentryMiddleware())

    @fast_jq.task(max_attempts=1)
    def explode() -> None:
        raise ValueError("sentry boom")

    with running(make_worker(fast_jq)):
        run = finished(fast_jq, fast_jq.enqueue(explode.with_options(run_id="r1")).run_id)
    (event,) = captured_events()
    (exc,) = event["exception"]["values"]
    assert (exc["type"], exc["value"]) == ("ValueError", "sentry boom")
    assert exc["stacktrace"]["frames"][-1]["function"] == "explode"
    assert {k: v for k, v in event["tags"].items() if k.startswith("jobqueue.")} == {
        "jobqueue.run_id": "r1", "jobqueue.task": "explode", "jobqueue.queue": "default",
        "jobqueue.attempt": "1", "jobqueue.max_attempts": "1",
        "jobqueue.fence": str(run.fence),
    }


def test_a_successful_run_sends_nothing_to_sentry(
    fast_jq: JobQueue, sentry_events: None
) -> None:
    fast_jq.use(SentryMiddleware())

    @fast_jq.task
    def fine() -> int:
        return 1

    with running(make_worker(fast_jq)):
        finished(fast_jq, fast_jq.enqueue(fine).run_id)
    assert captured_events() == []


# -- OpenTelemetry ---------------------------------------------------------------------------


@pytest.fixture
def spans() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def test_the_run_span_is_the_child_of_the_enqueue_span_through_meta(
    fast_jq: JobQueue, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = spans
    fast_jq.use(OpenTelemetryMiddleware(provider))
    tracer = provider.get_tracer("app")
    inner: list[Any] = []

    @fast_jq.task
    def job() -> None:
        with tracer.start_as_current_span("inside the task") as span:
            inner.append(span)

    with running(make_worker(fast_jq)):
        with tracer.start_as_current_span("web request"):
            handle = fast_jq.enqueue(job.with_options(run_id="r1"))
        finished(fast_jq, handle.run_id)
    by_name = {s.name: s for s in exporter.get_finished_spans()}
    request, enqueue, run = by_name["web request"], by_name["enqueue job"], by_name["run job"]
    assert enqueue.parent is not None and enqueue.parent.span_id == request.context.span_id
    assert run.parent is not None and run.parent.span_id == enqueue.context.span_id
    assert run.context.trace_id == request.context.trace_id
    assert by_name["inside the task"].parent.span_id == run.context.span_id
    assert (enqueue.kind, run.kind) == (SpanKind.PRODUCER, SpanKind.CONSUMER)
    assert run.attributes is not None and run.attributes["jobqueue.run_id"] == "r1"
    assert run.attributes["jobqueue.attempt"] == 1
    assert "traceparent" in handle.refresh().meta


def test_a_failed_run_span_records_the_exception(
    fast_jq: JobQueue, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = spans
    fast_jq.use(OpenTelemetryMiddleware(provider))

    @fast_jq.task(max_attempts=1)
    async def explode() -> None:
        raise RuntimeError("otel boom")

    with running(make_worker(fast_jq)):
        finished(fast_jq, fast_jq.enqueue(explode).run_id)
    (run,) = [s for s in exporter.get_finished_spans() if s.name == "run explode"]
    assert run.status.status_code is StatusCode.ERROR
    assert [e.name for e in run.events] == ["exception"]
    assert run.events[0].attributes is not None
    assert run.events[0].attributes["exception.message"] == "otel boom"


def test_without_a_current_span_the_enqueue_span_starts_the_trace(
    jq: JobQueue, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = spans
    jq.declare_task("report")
    jq.use(OpenTelemetryMiddleware(provider))
    assert trace.get_current_span() is trace.INVALID_SPAN
    jq.enqueue(jq.resolve_task("report").with_options(run_id="r1"))
    (enqueue,) = exporter.get_finished_spans()
    assert enqueue.parent is None
    assert jq.get_run("r1").meta["traceparent"].split("-")[1] == (
        f"{enqueue.context.trace_id:032x}")
