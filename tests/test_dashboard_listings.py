"""The dashboard's run listings page through every run: counts, next and first page links
that keep the filters, filters by task, error, time and a part of the run id, and bulk
actions on a whole filter behind a confirmation that states the count."""

from __future__ import annotations

import re
from html import unescape

import pytest
from starlette.testclient import TestClient
from test_listing import MIN, enqueue, finish

from jobqueue.client.sync import JobQueue
from jobqueue.dashboard.app import create_app
from jobqueue.store.runs import CLAIM

pytestmark = pytest.mark.real_only


@pytest.fixture
def client(jq: JobQueue) -> TestClient:
    jq.declare_task("report", max_attempts=1)
    jq.declare_task("mail", max_attempts=1)
    return TestClient(create_app(jq), follow_redirects=False)


def listed(page: str) -> list[str]:
    return re.findall(r'<a href="/run\?id=([^&"]+)&amp;queue=', page)


def next_url(page: str) -> str | None:
    found = re.search(r'<a href="([^"]+)" rel="next"', page)
    return unescape(found.group(1)) if found else None


def token(client: TestClient, page: str = "/runs") -> str:
    found = re.search(r'name="csrf_token" value="([^"]+)"', client.get(page).text)
    assert found
    return found.group(1)


def test_a_cancelled_run_of_a_queue_is_listed(jq: JobQueue, client: TestClient) -> None:
    enqueue(jq, ["c1"])
    jq.cancel("c1")
    finish(jq, [f"d{i}" for i in range(60)], jq.server_time_ms() + MIN)
    page = client.get("/runs", params={"state": "cancelled", "queue": "default"}).text
    assert listed(page) == ["c1"]


def test_a_part_of_an_existing_run_id_lists_it(jq: JobQueue, client: TestClient) -> None:
    finish(jq, [f"d{i}" for i in range(60)], jq.server_time_ms())
    enqueue(jq, ["invoice-2026-12-04"])
    assert listed(client.get("/runs", params={"q": "invoice-2026"}).text) == [
        "invoice-2026-12-04"
    ]


def test_the_pages_of_a_listing_show_every_run_once_and_keep_the_filters(
    jq: JobQueue, client: TestClient
) -> None:
    finish(jq, [f"x{i:03d}" for i in range(120)], jq.server_time_ms(), fail=True)
    finish(jq, ["m1"], jq.server_time_ms(), fail=True, task="mail")
    url: str | None = "/dead?task=report&limit=50"
    seen: list[str] = []
    while url:
        page = client.get(url).text
        seen += listed(page)
        url = next_url(page)
        assert url is None or "task=report" in url
    assert sorted(seen) == [f"x{i:03d}" for i in range(120)]


def test_a_listing_states_its_count(jq: JobQueue, client: TestClient) -> None:
    finish(jq, [f"x{i}" for i in range(7)], jq.server_time_ms(), fail=True)
    page = client.get("/dead", params={"limit": "25"}).text
    assert "7 shown of 7" in page and 'rel="next"' not in page


def test_the_dead_page_is_not_cut_at_500(jq: JobQueue, client: TestClient) -> None:
    finish(jq, [f"x{i:03d}" for i in range(501)], jq.server_time_ms(), fail=True)
    page = client.get("/dead", params={"limit": "500"}).text
    assert len(listed(page)) == 500 and "500 shown of 501" in page
    assert len(listed(client.get(next_url(page) or "").text)) == 1


def test_filters_by_error_and_time_hold(jq: JobQueue, client: TestClient) -> None:
    now = jq.server_time_ms()
    finish(jq, ["old"], now - 3_600_000, fail=True, error="Timeout")
    finish(jq, ["new"], now, fail=True, error="Timeout")
    finish(jq, ["other"], now, fail=True, error="KeyError")
    assert listed(client.get("/dead", params={"error": "timeout", "since": "10m"}).text) == [
        "new"
    ]


def test_a_bad_filter_is_a_400_that_says_why(client: TestClient) -> None:
    for params in ({"since": "yesterday"}, {"cursor": "junk"}, {"state": "sleeping"},
                   {"limit": "x"}):
        reply = client.get("/runs", params=params)
        assert reply.status_code == 400 and "Traceback" not in reply.text


def test_a_bulk_retry_of_a_filter_states_the_count_then_retries_every_page(
    jq: JobQueue, client: TestClient
) -> None:
    now = jq.server_time_ms()
    finish(jq, [f"m{i:03d}" for i in range(130)], now, fail=True, task="mail")
    finish(jq, ["r1"], now, fail=True)
    form = {"csrf_token": token(client), "op": "retry", "state": "dead", "task": "mail",
            "next": "/dead"}
    confirm = client.post("/actions/bulk", data=form)
    assert confirm.status_code == 200 and "<strong>130</strong>" in confirm.text
    assert {jq.get_run("m000").state, jq.get_run("r1").state} == {"dead"}  # nothing yet
    fields = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">',
                             confirm.text))
    done = client.post("/actions/bulk", data=fields)
    assert done.status_code == 303 and done.headers["location"] == "/dead"
    assert {jq.get_run(f"m{i:03d}").state for i in range(130)} == {"pending"}
    assert jq.get_run("r1").state == "dead"


def test_a_bulk_cancel_takes_only_runs_it_can_cancel(jq: JobQueue, client: TestClient) -> None:
    finish(jq, ["d1"], jq.server_time_ms(), fail=True)
    enqueue(jq, ["p1", "p2"])
    form = {"csrf_token": token(client), "op": "cancel"}
    confirm = client.post("/actions/bulk", data=form)
    assert "<strong>2</strong>" in confirm.text
    fields = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">',
                             confirm.text))
    client.post("/actions/bulk", data=fields)
    assert [jq.get_run(r).state for r in ("p1", "p2", "d1")] == ["cancelled", "cancelled", "dead"]


def test_a_bulk_delete_needs_the_confirming_post(jq: JobQueue, client: TestClient) -> None:
    finish(jq, ["d1", "d2"], jq.server_time_ms(), fail=True)
    form = {"csrf_token": token(client), "op": "purge", "state": "dead"}
    assert "<strong>2</strong>" in client.post("/actions/bulk", data=form).text
    assert jq.find_run("d1") is not None
    client.post("/actions/bulk", data={**form, "confirm": "yes"})
    assert jq.find_run("d1") is None and jq.find_run("d2") is None


def test_a_bulk_action_without_the_csrf_token_is_refused(
    jq: JobQueue, client: TestClient
) -> None:
    finish(jq, ["d1"], jq.server_time_ms(), fail=True)
    reply = client.post("/actions/bulk", data={"op": "purge", "confirm": "yes"})
    assert reply.status_code == 403 and jq.find_run("d1") is not None


def test_a_bulk_cancel_of_a_listing_ordered_newest_first_takes_the_running_runs_too(
    jq: JobQueue, client: TestClient
) -> None:
    enqueue(jq, ["p1"])
    jq.scripts.run(CLAIM.call(jq.keys_for("default", "p1"), 1, "w", 30_000, 60_000))
    enqueue(jq, ["p2"])
    form = {"csrf_token": token(client), "op": "cancel", "order": "desc"}
    assert "<strong>2</strong>" in client.post("/actions/bulk", data=form).text
