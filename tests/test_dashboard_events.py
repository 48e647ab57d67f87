"""The dashboard's live side: the events page, the server-sent event stream it and every
other page follow (each event's id the cursor to resume right after it, as a browser's
Last-Event-ID does), and the pages' pointer to their stream."""

from __future__ import annotations

import json
import re
from html import unescape
from typing import Any

import pytest
from starlette.testclient import TestClient

from jobqueue.client.sync import JobQueue
from jobqueue.dashboard.app import create_app

pytestmark = pytest.mark.real_only


@pytest.fixture
def jq(redis_client: Any) -> JobQueue:
    q = JobQueue(redis_client)
    q.declare_task("report")
    return q


@pytest.fixture
def client(jq: JobQueue) -> TestClient:
    return TestClient(create_app(jq, events_stream_s=1.0))


def live_url(page: str) -> str:
    found = re.search(r'data-live="([^"]+)"', page)
    assert found, "the page has no live stream"
    return unescape(found.group(1))


def read_stream(client: TestClient, url: str, headers: dict[str, str] | None = None
                ) -> list[tuple[str, dict[str, Any]]]:
    """The (id, event) pairs of one stream, until it ends (events_stream_s)."""
    out: list[tuple[str, dict[str, Any]]] = []
    with client.stream("GET", url, headers=headers or {}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        current: dict[str, str] = {}
        for line in response.iter_lines():
            if line.startswith(("id: ", "data: ")):
                key, _, value = line.partition(": ")
                current[key] = value
            elif not line and "data" in current:
                out.append((current["id"], json.loads(current["data"])))
                current = {}
    return out


def test_the_events_page_lists_the_newest_events_with_their_runs(
    jq: JobQueue, client: TestClient
) -> None:
    handle = jq.enqueue(jq.resolve_task("report").with_options(run_id="r-1"))
    page = client.get("/events").text
    assert "created" in page and f"/run?id={handle.run_id}" in page
    assert client.get("/events?kind=claimed").text.count("<tr class=") == 0


def test_a_page_follows_its_stream_from_where_the_log_was_as_it_was_read(
    jq: JobQueue, client: TestClient
) -> None:
    jq.enqueue(jq.resolve_task("report").with_options(run_id="before"))
    url = live_url(client.get("/runs").text)
    jq.enqueue(jq.resolve_task("report").with_options(run_id="after"))
    got = read_stream(client, url)
    assert [(ev["kind"], ev["run_id"]) for _, ev in got] == [("created", "after")]


def test_the_stream_resumes_after_the_last_event_id_the_browser_sends_back(
    jq: JobQueue, client: TestClient
) -> None:
    for i in range(3):
        jq.enqueue(jq.resolve_task("report").with_options(run_id=f"r{i}"))
    got = read_stream(client, "/events/stream?since=0")
    assert [ev["run_id"] for _, ev in got] == ["r0", "r1", "r2"]
    again = read_stream(client, "/events/stream", headers={"Last-Event-ID": got[0][0]})
    assert [ev["run_id"] for _, ev in again] == ["r1", "r2"]


def test_a_run_pages_stream_gives_that_runs_events_only(
    jq: JobQueue, client: TestClient
) -> None:
    jq.enqueue(jq.resolve_task("report").with_options(run_id="mine"))
    url = live_url(client.get("/run?id=mine").text)
    assert "run=mine" in url
    jq.enqueue(jq.resolve_task("report").with_options(run_id="other"))
    jq.cancel("mine")
    assert [(ev["kind"], ev["run_id"]) for _, ev in read_stream(client, url)] == [
        ("cancelled", "mine")
    ]


@pytest.mark.parametrize("path", ["/queues", "/leases", "/flows", "/workers"])
def test_a_page_that_reloads_itself_does_so_only_without_javascript(
    client: TestClient, path: str
) -> None:
    """With JavaScript the page follows its stream; a timed reload (meta refresh) would send
    a keyboard or screen reader user back to the top every few seconds (WCAG 2.2.1)."""
    page = client.get(path).text
    live_url(page)
    head = page[: page.index("</head>")]
    assert 'http-equiv="refresh"' in head
    assert 'http-equiv="refresh"' not in re.sub(r"<noscript>.*?</noscript>", "", head, flags=re.S)


@pytest.mark.parametrize("query", ["since=garbage", "kind=nope", "queue=bad%20name"])
def test_a_bad_stream_request_is_refused_with_a_clear_400(client: TestClient, query: str) -> None:
    response = client.get(f"/events/stream?{query}")
    assert response.status_code == 400 and response.text


def test_the_pages_run_only_the_dashboards_own_script(client: TestClient) -> None:
    response = client.get("/queues")
    assert "script-src 'self'" in response.headers["content-security-policy"]
    scripts = re.findall(r"<script([^>]*)>(.*?)</script>", response.text, re.S)
    assert scripts and all('src="/static/live.js"' in a and not body.strip()
                           for a, body in scripts)
    assert client.get("/static/live.js").status_code == 200
