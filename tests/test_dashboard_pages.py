"""Dashboard pages show what the CLI's data functions return, escaped; actions change Redis."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
import redis
from helpers import claim_one, server_time_past
from markupsafe import escape
from starlette.testclient import TestClient

from jobqueue.client.sync import JobQueue
from jobqueue.dashboard import app as dashboard_app
from jobqueue.dashboard.app import create_app
from jobqueue.store.embedded import EmbeddedServer
from jobqueue.store.keys import WORKERS_KEY
from jobqueue.store.runs import COMPLETE, FAIL

# What this module checks does not depend on the backend: run on the real server only
# (real_only, tests/conftest.py); the scripts and the client API are tested on fakeredis too.
pytestmark = pytest.mark.real_only

FORM = {"content-type": "application/x-www-form-urlencoded"}
EVIL = '<script>alert("pwned")</script>'


@pytest.fixture
def client(jq: JobQueue) -> TestClient:
    jq.declare_task("report", max_attempts=1)
    return TestClient(create_app(jq), follow_redirects=False)


def claim_fence(jq: JobQueue, run_id: str, lease_ms: int = 30_000) -> int:
    """Claim the one due run (tests keep a single one due at a time); its fence."""
    keys = jq.keys_for("default", run_id)
    run = claim_one(jq.scripts, keys, owner="w-1", lease_ms=lease_ms, retention_ms=60_000)
    assert run.run_id == run_id
    return run.fence


def claim_expiring(jq: JobQueue, run_id: str) -> int:
    """Claim with a 1 ms lease, and let it pass: an expired lease nobody reclaimed yet."""
    fence = claim_fence(jq, run_id, lease_ms=1)
    server_time_past(jq, jq.server_time_ms() + 1)  # (the claim read the clock before)
    return fence


def kill(jq: JobQueue, run_id: str, error: str = "boom") -> None:
    jq.enqueue(jq.resolve_task("report").with_options(run_id=run_id))
    fence = claim_fence(jq, run_id)
    keys = jq.keys_for("default", run_id)
    jq.scripts.run(FAIL.call(keys, run_id, fence, error, None, 60_000))


def post(client: TestClient, action: str, page: str, **fields: str) -> str:
    token = re.search(r'name="csrf_token" value="([^"]+)"', client.get(page).text)
    assert token
    reply = client.post(f"/actions/{action}", data={"csrf_token": token.group(1), **fields})
    assert reply.status_code == 303
    return reply.headers["location"]


def totals_shown(page: str) -> dict[str, int]:
    return {name: int(n) for name, n in
            re.findall(r"<dt>(\w+)</dt><dd>(?:<a [^>]*>)?(\d+)", page)}  # fmt: skip


def test_the_home_page_totals_every_queue(jq: JobQueue, client: TestClient) -> None:
    report = jq.resolve_task("report")
    jq.enqueue(report.with_options(run_id="done"))
    keys = jq.keys_for("default", "done")
    jq.scripts.run(COMPLETE.call(keys, [("done", claim_fence(jq, "done"), "null")], 60_000))
    jq.declare_task("flaky", max_attempts=3)
    jq.enqueue(jq.resolve_task("flaky").with_options(run_id="flaky"))
    keys = jq.keys_for("default", "flaky")
    jq.scripts.run(FAIL.call(keys, "flaky", claim_fence(jq, "flaky"), "boom", 60_000, 60_000))
    kill(jq, "gone")  # a failed attempt too
    jq.enqueue(report.with_options(run_id="busy"))
    claim_fence(jq, "busy")
    jq.enqueue(report.with_options(run_id="after-busy", depends_on=["busy"]))
    jq.enqueue(report.with_options(run_id="now"))
    jq.enqueue(report.with_options(run_id="mail-now", queue="emails"))
    jq.enqueue(report.with_options(run_id="mail-later", queue="emails", delay=600))
    page = client.get("/").text
    assert totals_shown(page) == {"processed": 1, "failed": 2, "busy": 1, "enqueued": 2,
                                  "scheduled": 2, "waiting": 1, "dead": 1}  # fmt: skip
    assert "Over 2 queue(s)" in page


def test_the_home_page_shows_what_redis_says_of_itself(
    redis_client: Any, client: TestClient
) -> None:
    info = redis_client.info()
    page = client.get("/").text
    (row,) = re.findall(r"<tbody>(.*?)</tbody>", page.split('id="servers"')[1], re.S)
    cells = [c.strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
    assert cells[1].endswith(" " + (info.get("valkey_version") or info["redis_version"]))
    assert cells[2] == info["used_memory_human"] or cells[2].endswith(("K", "M"))
    assert cells[3] == ("no limit" if not info["maxmemory"] else info["maxmemory_human"])
    assert cells[4] == info["maxmemory_policy"]
    assert int(cells[5]) >= 1 and cells[6] == str(info["evicted_keys"])


def test_a_redis_user_refused_info_sees_why_on_the_home_page(
    jq: JobQueue, redis_client: Any, real_server: EmbeddedServer
) -> None:
    redis_client.acl_setuser("no-info", enabled=True, passwords=["+pw"], keys=["*"],
                             channels=["*"], commands=["+@all", "-info"])  # fmt: skip
    try:
        limited = redis.Redis.from_url(real_server.url, username="no-info", password="pw",
                                       decode_responses=True)  # fmt: skip
        page = TestClient(create_app(JobQueue(limited), sample_every_s=None)).get("/")
        limited.close()
    finally:
        redis_client.acl_deluser("no-info")
    assert page.status_code == 200
    assert re.search(r'<td colspan="7" class="warn">INFO: [^<]*permissions', page.text)


def test_the_queues_page_is_still_there_for_the_links_to_it(client: TestClient) -> None:
    assert client.get("/queues").status_code == 200
    assert '<a href="/queues">Queues</a>' in client.get("/").text


def test_queues_page_shows_totals_and_three_charts_per_active_queue(
    jq: JobQueue, client: TestClient
) -> None:
    jq.enqueue(jq.resolve_task("report").with_options(run_id="r1"))
    jq.enqueue(jq.resolve_task("report").with_options(run_id="r2", delay=600))
    page = client.get("/queues").text
    row = re.search(r'<tr>\s*<td><a href="/queue\?name=default">default</a>.*?</tr>', page, re.S)
    assert row
    cells = re.findall(r'<td class="num[^"]*">(?:<a [^>]*>)?(\d+)', row.group(0))
    assert cells[:3] == ["1", "1", "1"]  # partitions, due now, later
    for chart in ("throughput", "depth", "lateness"):
        assert f'id="chart-{chart}-default"' in page


def test_an_idle_queue_is_listed_without_charts_which_are_a_click_away(
    jq: JobQueue, client: TestClient
) -> None:
    jq.enqueue(jq.resolve_task("report").with_options(run_id="r1"))
    jq.register_queue("quiet")
    page = client.get("/queues").text
    assert '<a href="/queue?name=quiet">quiet</a>' in page.split('id="queues"')[1]
    assert 'id="chart-depth-quiet"' not in page and 'id="chart-depth-default"' in page
    idle = re.search(r'<p class="note" id="idle">.*?</p>', page, re.S)
    assert idle and '<a href="/queue?name=quiet">quiet</a>' in idle.group(0)
    own = client.get("/queue?name=quiet").text
    for chart in ("throughput", "depth", "lateness", "depth-week", "lateness-week"):
        assert f'id="chart-{chart}-quiet"' in own


@pytest.mark.parametrize(("query", "status"), [("?name=nope", 404), ("?name=bad%20name", 400),
                                               ("", 400)])  # fmt: skip
def test_a_queue_page_naming_no_usable_queue_says_so(
    client: TestClient, query: str, status: int
) -> None:
    reply = client.get("/queue" + query)
    assert reply.status_code == status and reply.text


def group_rows(page: str) -> dict[str, list[str]]:
    """The queue page's groups table: each group as shown -> its other cells' text."""
    table = re.search(r'<table id="groups-table">.*?</table>', page, re.S)
    assert table, "no groups table"
    rows = {}
    for row in re.findall(r"<tr[^>]*>(.*?)</tr>", table.group(0), re.S)[1:]:  # the head left out
        cells = [re.sub(r"<[^>]+>", "", cell).strip()
                 for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]  # fmt: skip
        rows[cells[0]] = cells[1:]
    return rows


def in_group(jq: JobQueue, group: str, *run_ids: str) -> None:
    for run_id in run_ids:
        jq.enqueue(jq.resolve_task("report").with_options(run_id=run_id, limit_key=group))


def test_the_queue_page_says_fair_shares_are_off_until_they_are_turned_on(
    jq: JobQueue, client: TestClient
) -> None:
    jq.register_queue("default")
    assert "Fair shares <strong>off</strong>" in client.get("/queue?name=default").text
    jq.set_fair_shares("default")
    assert "Fair shares <strong>on</strong>" in client.get("/queue?name=default").text


def test_the_queue_page_lists_each_groups_weight_max_size_pause_and_runs(
    jq: JobQueue, client: TestClient
) -> None:
    jq.set_fair_shares("default")
    jq.set_group("default", "a", weight=3, max_size=50)
    jq.pause_group("default", "b")
    in_group(jq, "a", "a1", "a2")
    claim_fence(jq, "a1")
    rows = group_rows(client.get("/queue?name=default").text)
    # weight, max size, paused, waiting, running, served
    assert rows == {"a": ["3", "50", "no", "1", "1", "1"],
                    "b": ["1", "-", "paused", "0", "0", "0"]}  # fmt: skip


def test_the_queue_page_names_the_group_of_the_runs_without_a_limit_key(
    jq: JobQueue, client: TestClient
) -> None:
    jq.set_fair_shares("default")
    jq.enqueue(jq.resolve_task("report").with_options(run_id="r1"))
    rows = group_rows(client.get("/queue?name=default").text)
    assert rows == {"(no limit_key)": ["1", "-", "no", "1", "0", "0"]}


def test_a_queue_without_groups_says_so(jq: JobQueue, client: TestClient) -> None:
    jq.register_queue("default")
    page = client.get("/queue?name=default").text
    assert 'id="groups-table"' not in page and "No groups" in page


def test_group_names_are_escaped_on_the_queue_page(jq: JobQueue, client: TestClient) -> None:
    jq.set_fair_shares("default")
    in_group(jq, EVIL, "r1")
    page = client.get("/queue?name=default").text
    assert EVIL not in page and str(escape(EVIL)) in page


def test_the_queue_page_shows_the_busiest_groups_and_says_how_many_more_there_are(
    jq: JobQueue, client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dashboard_app, "GROUPS_SHOWN", 2)
    jq.set_fair_shares("default")
    in_group(jq, "quiet", "q1")
    in_group(jq, "busy", "b1", "b2", "b3")
    in_group(jq, "middle", "m1", "m2")
    page = client.get("/queue?name=default").text
    assert set(group_rows(page)) == {"busy", "middle"}
    note = re.search(r'<p class="note" id="groups-left-out">(.*?)</p>', page, re.S)
    assert note and note.group(1).startswith("1 more group is not shown")


def test_a_queue_page_reads_no_other_queues_groups(
    jq: JobQueue, client: TestClient, redis_client: Any
) -> None:
    jq.register_queue("default")
    jq.register_queue("other")
    redis_client.set("jq:{other#0}:gconf", "foreign")  # any read of it would be an anomaly
    assert 'id="anomalies"' in client.get("/queue?name=other").text
    assert 'id="anomalies"' not in client.get("/queue?name=default").text


def test_run_ids_payloads_and_errors_are_escaped(jq: JobQueue, client: TestClient) -> None:
    jq.declare_task("report", max_attempts=1)
    kill(jq, EVIL, error=EVIL)
    listing = client.get("/runs").text + client.get("/dead").text
    detail = client.get("/run", params={"id": EVIL}).text
    for page in (listing, detail):
        assert EVIL not in page
        assert str(escape(EVIL)) in page


def test_payload_shown_on_the_detail_page_is_escaped(jq: JobQueue, client: TestClient) -> None:
    jq.enqueue(jq.resolve_task("report").with_options(run_id="r1"), EVIL, note="</pre><b>x</b>")
    page = client.get("/run", params={"id": "r1"}).text
    assert "<b>x</b>" not in page and EVIL not in page
    assert "&lt;/pre&gt;&lt;b&gt;x&lt;/b&gt;" in page


def test_runs_page_filters_by_state(jq: JobQueue, client: TestClient) -> None:
    kill(jq, "gone")
    jq.enqueue(jq.resolve_task("report").with_options(run_id="still-due"))
    page = client.get("/runs", params={"state": "dead"}).text
    assert ">gone<" in page and ">still-due<" not in page


def test_runs_page_filters_by_job(jq: JobQueue, client: TestClient) -> None:
    jq.enqueue(jq.resolve_task("report").with_options(run_id="nightly@2026-11-29T01:00:00Z"))
    jq.enqueue(jq.resolve_task("report").with_options(run_id="other@2026-11-29T01:00:00Z"))
    page = client.get("/runs", params={"job": "nightly"}).text
    assert "nightly@" in page and "other@" not in page


def test_searching_an_exact_run_id_opens_its_page(jq: JobQueue, client: TestClient) -> None:
    jq.enqueue(jq.resolve_task("report").with_options(run_id="invoice/42 #1"))
    reply = client.get("/runs", params={"q": "invoice/42 #1"})
    assert reply.status_code == 303
    assert reply.headers["location"] == "/run?id=invoice%2F42%20%231&queue=default"
    assert "invoice/42 #1" in client.get(reply.headers["location"]).text


def test_searching_part_of_a_run_id_lists_the_runs_containing_it(
    jq: JobQueue, client: TestClient
) -> None:
    jq.enqueue(jq.resolve_task("report").with_options(run_id="invoice-42"))
    jq.enqueue(jq.resolve_task("report").with_options(run_id="receipt-7"))
    page = client.get("/runs", params={"q": "voice"}).text
    assert "invoice-42" in page and "receipt-7" not in page


def test_run_page_shows_the_history_of_attempts(jq: JobQueue, client: TestClient) -> None:
    jq.declare_task("report", max_attempts=2)
    jq.enqueue(jq.resolve_task("report").with_options(run_id="r1"))
    first = claim_expiring(jq, "r1")
    second = claim_fence(jq, "r1")  # reclaimed: attempt 2
    page = client.get("/run", params={"id": "r1"}).text
    history = re.search(r'<table id="history">.*?</table>', page, re.S)
    assert history
    events = re.findall(r"<td>([a-z][^<]*)</td>", history.group(0))
    timeline = jq.get_run("r1").timeline()  # what `jobqueue show` prints, in the same order
    assert events == [text for _, text in timeline]
    assert events[0] == "created" and events[-1].startswith(f"claimed fence={second} attempt=2")
    assert any(e.startswith(f"lease expired fence={first}") for e in events)
    assert ">2/2<" in page and f"fence</th><td>{second}<" in page  # the current attempt, fence


def test_an_unknown_run_says_so_with_a_404(client: TestClient) -> None:
    reply = client.get("/run", params={"id": "nope"})
    assert reply.status_code == 404 and "No run &#39;nope&#39;" in reply.text


def test_a_running_runs_page_shows_its_claim(jq: JobQueue, client: TestClient) -> None:
    jq.enqueue(jq.resolve_task("report").with_options(run_id="busy"))
    fence = claim_fence(jq, "busy")
    page = client.get("/run", params={"id": "busy"}).text
    assert "No history kept." not in page
    assert f"claimed fence={fence} attempt=1 owner=w-1" in page


def test_the_run_page_shows_the_instants_in_history_lines_as_times(
    jq: JobQueue, client: TestClient
) -> None:
    jq.declare_task("report", max_attempts=3)
    jq.enqueue(jq.resolve_task("report").with_options(run_id="flaky"))
    fence = claim_fence(jq, "flaky")
    keys = jq.keys_for("default", "flaky")
    reply = jq.scripts.run(FAIL.call(keys, "flaky", fence, "boom", 60_000, 60_000))
    retry_at = FAIL.parse(reply).retry_at_ms
    assert retry_at is not None
    page = client.get("/run", params={"id": "flaky"}).text
    assert str(retry_at) not in page.split('<table id="history">')[1]
    shown = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(retry_at / 1000))
    assert f"retry at {shown} UTC" in page


def test_leases_page_highlights_expired_leases(jq: JobQueue, client: TestClient) -> None:
    jq.enqueue(jq.resolve_task("report").with_options(run_id="alive"))
    claim_fence(jq, "alive")
    jq.enqueue(jq.resolve_task("report").with_options(run_id="stuck"))
    claim_expiring(jq, "stuck")
    page = client.get("/leases").text
    rows = re.findall(r'<tr class="(expired|)">\s*<td><a[^>]*>([^<]+)</a>', page)
    assert sorted(rows) == [("", "alive"), ("expired", "stuck")]


def test_workers_page_lists_the_registry(jq: JobQueue, client: TestClient) -> None:
    now = jq.server_time_ms()
    info = {
        "id": "host-a:12:ab",
        "host": "host-a",
        "pid": 12,
        "queues": ["default"],
        "concurrency": 8,
        "in_flight": 3,
        "started_ms": now,
        "last_seen_ms": now,
    }
    jq.redis.hset(WORKERS_KEY, "host-a:12:ab", json.dumps(info))
    page = client.get("/workers").text
    assert "host-a:12:ab" in page and "3/8" in page and "STALE" not in page


def test_retry_button_puts_a_dead_run_back_to_pending(jq: JobQueue, client: TestClient) -> None:
    kill(jq, "r1")
    assert post(client, "retry", "/dead", run_id="r1", queue="default", next="/dead") == "/dead"
    assert jq.get_run("r1").state == "pending"
    page = client.get("/dead").text
    assert "retried 1 run(s)" in page and "No dead runs." in page


def test_purge_deletes_dead_runs_only(jq: JobQueue, client: TestClient) -> None:
    kill(jq, "dead-1")
    jq.enqueue(jq.resolve_task("report").with_options(run_id="alive"))
    post(client, "purge", "/dead", run_id="dead-1", confirm="yes")
    assert jq.find_run("dead-1") is None
    assert "purged 1 of 1 dead run(s)" in client.get("/dead").text
    post(client, "purge", "/run?id=alive", run_id="alive", confirm="yes")
    assert jq.get_run("alive").state == "pending"
    assert "purged 0 of 1 dead run(s)" in client.get("/dead").text


def hidden_fields(page: str) -> list[tuple[str, str]]:
    return re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', page)


def test_purge_first_shows_what_would_go_and_deletes_nothing(
    jq: JobQueue, client: TestClient
) -> None:
    kill(jq, "dead-1")
    kill(jq, "dead-2")
    token = re.search(r'name="csrf_token" value="([^"]+)"', client.get("/dead").text)
    assert token
    data = {"csrf_token": token.group(1), "run_id": ["dead-1", "dead-2"], "next": "/dead"}
    reply = client.post("/actions/purge", data=data)
    assert reply.status_code == 200
    assert "Purge 2 dead run(s) for good?" in reply.text
    assert "<li>dead-1</li>" in reply.text and "<li>dead-2</li>" in reply.text
    assert {jq.get_run(r).state for r in ("dead-1", "dead-2")} == {"dead"}

    # The page's button re-posts the same selection with confirm=yes: then they go.
    fields = hidden_fields(reply.text)
    assert ("confirm", "yes") in fields and ("next", "/dead") in fields
    done = client.post("/actions/purge", content=urlencode(fields),
                       headers={"content-type": "application/x-www-form-urlencoded"})  # fmt: skip
    assert done.status_code == 303 and done.headers["location"] == "/dead"
    assert jq.find_run("dead-1") is None and jq.find_run("dead-2") is None


def test_purge_confirmation_escapes_run_ids(jq: JobQueue, client: TestClient) -> None:
    kill(jq, "dead-1")  # the page carries a form, hence a token, only when a run is dead
    token = re.search(r'name="csrf_token" value="([^"]+)"', client.get("/dead").text)
    assert token
    evil = "<script>alert(1)</script>"
    reply = client.post("/actions/purge", data={"csrf_token": token.group(1), "run_id": evil})
    assert reply.status_code == 200
    assert evil not in reply.text and "&lt;script&gt;" in reply.text


def test_purge_without_a_valid_csrf_token_shows_no_confirmation(client: TestClient) -> None:
    reply = client.post("/actions/purge", data={"csrf_token": "forged", "run_id": "x"})
    assert reply.status_code == 403


def test_bulk_retry_takes_every_selected_run(jq: JobQueue, client: TestClient) -> None:
    for rid in ("a", "b", "c"):
        kill(jq, rid)
    token = re.search(r'name="csrf_token" value="([^"]+)"', client.get("/dead").text)
    assert token
    body = f"csrf_token={token.group(1)}&run_id=a&run_id=c"
    assert client.post("/actions/retry", content=body, headers=FORM).status_code == 303
    assert [jq.get_run(r).state for r in "abc"] == ["pending", "dead", "pending"]


def test_run_again_on_a_done_runs_page_requeues_it(jq: JobQueue, client: TestClient) -> None:
    jq.enqueue(jq.resolve_task("report").with_options(run_id="d1"))
    fence = claim_fence(jq, "d1")
    keys = jq.keys_for("default", "d1")
    jq.scripts.run(COMPLETE.call(keys, [("d1", fence, "null")], 60_000))
    page = "/run?id=d1&queue=default"
    assert "run again" in client.get(page).text
    post(client, "retry", page, run_id="d1", queue="default")
    assert jq.get_run("d1").state == "pending"


def test_a_refused_action_is_reported_not_raised(jq: JobQueue, client: TestClient) -> None:
    kill(jq, "r1")
    post(client, "cancel", "/dead", run_id="r1")
    assert "cancel refused" in client.get("/dead").text
    assert jq.get_run("r1").state == "dead"


def test_schedule_buttons_pause_resume_and_trigger(jq: JobQueue, client: TestClient) -> None:
    jq.schedule("nightly", "report", cron="0 1 * * *", tz="Europe/Paris")
    page = client.get("/schedules").text
    assert "nightly" in page and "0 1 * * *" in page and "Europe/Paris" in page
    post(client, "pause", "/schedules", job_id="nightly")
    info = jq.get_schedule("nightly")
    assert info is not None and info.definition.paused
    assert "<strong>paused</strong>" in client.get("/schedules").text
    post(client, "resume", "/schedules", job_id="nightly")
    info = jq.get_schedule("nightly")
    assert info is not None and not info.definition.paused
    post(client, "trigger", "/schedules", job_id="nightly")
    (run,) = [r for r in jq.redis.zrange("jq:{default#0}:due", 0, -1) if r.startswith("nightly@")]
    assert run.startswith("nightly@manual-")
    assert "created nightly@manual-" in client.get("/schedules").text


def test_a_queue_filter_naming_no_queue_is_a_404_that_says_so(
    jq: JobQueue, client: TestClient
) -> None:
    jq.enqueue(jq.resolve_task("report").with_options(run_id="r1"))
    reply = client.get("/runs?queue=defualt")
    assert reply.status_code == 404
    assert "no queue 'defualt'" in reply.text


def test_a_run_id_in_two_queues_asks_for_the_queue(jq: JobQueue, client: TestClient) -> None:
    jq.enqueue(jq.resolve_task("report").with_options(run_id="twin"))
    jq.enqueue(jq.resolve_task("report").with_options(run_id="twin", queue="emails"))
    reply = client.get("/run?id=twin")
    assert reply.status_code == 409 and "name the queue" in reply.text
    assert client.get("/run?id=twin&queue=emails").status_code == 200


# -- a phone's screen --------------------------------------------------------------------------

STYLESHEET = Path(__file__).resolve().parent.parent / "jobqueue/dashboard/static/style.css"
PAGES = ["/", "/queues", "/queue?name=default", "/runs", "/run?id=r1", "/leases", "/flows",
         "/schedules", "/dead", "/workers", "/events"]  # fmt: skip


@pytest.mark.parametrize("page", PAGES)
def test_every_page_is_laid_out_for_the_device_width_with_the_stylesheet_only(
    jq: JobQueue, client: TestClient, page: str
) -> None:
    jq.enqueue(jq.resolve_task("report").with_options(run_id="r1"))
    text = client.get(page).text
    assert '<meta name="viewport" content="width=device-width, initial-scale=1">' in text
    assert not re.search(r"<style|\sstyle=", text)  # the CSP's style-src 'self': no inline style


@pytest.mark.parametrize("page", ["/", "/queues", "/queue?name=default", "/run?id=r1",
                                  "/leases", "/schedules", "/events"])  # fmt: skip
def test_a_pages_tables_scroll_inside_their_own_box(
    jq: JobQueue, client: TestClient, page: str
) -> None:
    jq.enqueue(jq.resolve_task("report").with_options(run_id="r1"))
    claim_fence(jq, "r1")  # a lease to list
    jq.schedule("nightly", "report", every=3600)
    text = client.get(page).text
    tables = re.findall(r"(.{0,40})<table", text, re.S)
    assert tables and all(before.rstrip().endswith('<div class="scroll">') for before in tables)


def rules(css: str) -> dict[str, str]:
    """selector -> declarations (comments left out)."""
    css = re.sub(r"/\*.*?\*/", "", css, flags=re.S)
    return {sel.strip(): body for sel, body in re.findall(r"([^{}]+)\{([^{}]*)\}", css)}


def test_on_a_phone_the_navigation_wraps_and_a_wide_table_scrolls_not_the_page() -> None:
    css = STYLESHEET.read_text()
    phone = re.search(r"@media \(max-width: 640px\) \{(.*?)\n\}", css, re.S)
    assert phone, "no rules for narrow screens"
    wide = rules(css.replace(phone.group(0), ""))
    assert "flex-wrap: wrap" in wide["nav"]
    assert "overflow-x: auto" in wide[".scroll"]
    narrow = rules(phone.group(1))
    # the tables of pages that have no .scroll box scroll inside themselves
    assert "overflow-x: auto" in narrow["main > table, main > form > table"]
    assert "flex-basis: 100%" in narrow["nav .clock"]  # the clock takes a line of its own


def test_the_run_page_gives_its_times_for_the_browsers_zone_and_its_durations(
    jq: JobQueue, client: TestClient
) -> None:
    jq.declare_task("report", max_attempts=2)
    jq.enqueue(jq.resolve_task("report").with_options(run_id="r1"))
    claim_expiring(jq, "r1")
    claim_fence(jq, "r1")
    run = jq.get_run("r1")
    page = client.get("/run", params={"id": "r1"}).text
    created = re.search(r'<time datetime="([^"]+)">([^<]+)</time>', page)
    assert created and created.group(1).endswith("+00:00") and created.group(2).endswith(" UTC")
    assert "<th>waited</th>" in page and "<th>ran</th>" in page and "so far" in page
    history = re.search(r'<table id="history">.*?</table>', page, re.S)
    assert history
    gaps = re.findall(r'<td class="num">([^<]*)</td>', history.group(0))
    assert len(gaps) == len(run.timeline()) and gaps[0] == ""
    assert all(g.endswith("s") or g.endswith("m") or g.endswith("h") for g in gaps[1:])


def test_the_run_page_links_the_runs_waiting_on_it(jq: JobQueue, client: TestClient) -> None:
    jq.declare_task("mail")
    first = jq.resolve_task("report").with_options(run_id="first")
    jq.chain(first.s(), jq.resolve_task("mail").with_options(run_id="then").s())
    page = client.get("/run", params={"id": "first"}).text
    assert re.search(r"<th>waited on by</th><td><a href=\"/run\?id=then&amp;queue=default\">",
                     page)
    assert "<th>waits on</th><td>1 run(s)" in client.get("/run", params={"id": "then"}).text


def test_the_workers_page_names_the_runs_each_worker_holds(
    jq: JobQueue, client: TestClient
) -> None:
    now = jq.server_time_ms()
    info = {"id": "w-1", "host": "h", "pid": 1, "queues": ["default"], "concurrency": 8,
            "in_flight": 1, "started_ms": now, "last_seen_ms": now}
    jq.redis.hset(WORKERS_KEY, "w-1", json.dumps(info))
    jq.enqueue(jq.resolve_task("report").with_options(run_id="busy"))
    claim_fence(jq, "busy")  # owner w-1
    row = re.search(r"<tr[^>]*>\s*<td><a href=\"/leases\?worker=w-1\">.*?</tr>",
                    client.get("/workers").text, re.S)
    assert row and 'href="/run?id=busy&amp;queue=default"' in row.group(0)
