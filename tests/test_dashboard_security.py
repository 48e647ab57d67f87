"""Dashboard security: CSRF on every POST, optional Basic or token auth, Host checks, and the
command's refusal to serve a non-loopback address without auth."""

from __future__ import annotations

import base64
import re
import sys
from typing import Any

import pytest
import redis
from click.testing import CliRunner
from redis.backoff import NoBackoff
from redis.retry import Retry
from starlette.testclient import TestClient

from jobqueue.cli import main
from jobqueue.cli.dashboard import is_loopback
from jobqueue.client.sync import JobQueue
from jobqueue.dashboard.app import create_app
from jobqueue.dashboard.security import SESSION_COOKIE, TOKEN_COOKIE, Credentials
from jobqueue.store.embedded import EmbeddedServer
from jobqueue.store.runs import CLAIM, FAIL

# What this module checks does not depend on the backend: run on the real server only
# (real_only, tests/conftest.py); the scripts and the client API are tested on fakeredis too.
pytestmark = pytest.mark.real_only

FORM = {"content-type": "application/x-www-form-urlencoded"}


def dead_run(jq: JobQueue, run_id: str) -> None:
    jq.declare_task("report", max_attempts=1)
    jq.enqueue(jq.resolve_task("report").with_options(run_id=run_id))
    keys = jq.keys_for("default", run_id)
    claim = CLAIM.parse(jq.scripts.run(CLAIM.call(keys, 1, "w", 30_000, 60_000)))
    jq.scripts.run(FAIL.call(keys, run_id, claim.runs[0].fence, "boom", None, 60_000))
    assert jq.get_run(run_id).state == "dead"


def csrf_token(client: TestClient, path: str = "/dead") -> str:
    page = client.get(path)
    assert page.status_code == 200
    match = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
    assert match, "the page carries no CSRF field"
    return match.group(1)


@pytest.fixture
def client(jq: JobQueue) -> TestClient:
    return TestClient(create_app(jq), follow_redirects=False)


def test_a_page_sets_an_httponly_strict_session_cookie(client: TestClient) -> None:
    cookie = client.get("/queues").headers["set-cookie"]
    assert cookie.startswith(f"{SESSION_COOKIE}=")
    assert "httponly" in cookie.lower() and "samesite=strict" in cookie.lower()


def test_pages_forbid_framing_and_every_script_but_the_dashboards_own(
    client: TestClient,
) -> None:
    headers = client.get("/queues").headers
    assert headers["x-frame-options"] == "DENY"
    policy = headers["content-security-policy"]
    assert "frame-ancestors 'none'" in policy and "default-src 'none'" in policy
    # its own file (static/live.js) only: no inline script, no eval, no other origin
    assert "script-src 'self';" in policy and "unsafe" not in policy


def test_post_with_the_session_token_runs_the_action(jq: JobQueue, client: TestClient) -> None:
    dead_run(jq, "r1")
    token = csrf_token(client)
    reply = client.post(
        "/actions/retry", content=f"csrf_token={token}&run_id=r1&next=/dead", headers=FORM
    )
    assert reply.status_code == 303 and reply.headers["location"] == "/dead"
    assert jq.get_run("r1").state == "pending"


def test_post_without_a_token_is_refused_with_403(jq: JobQueue, client: TestClient) -> None:
    dead_run(jq, "r1")
    csrf_token(client)  # the session cookie exists; only the field is missing
    reply = client.post("/actions/retry", content="run_id=r1", headers=FORM)
    assert reply.status_code == 403
    assert jq.get_run("r1").state == "dead"


def test_post_with_a_forged_token_is_refused(jq: JobQueue, client: TestClient) -> None:
    dead_run(jq, "r1")
    csrf_token(client)
    reply = client.post("/actions/retry", content="csrf_token=abc&run_id=r1", headers=FORM)
    assert reply.status_code == 403
    assert jq.get_run("r1").state == "dead"


def test_a_token_from_another_session_is_refused(jq: JobQueue) -> None:
    dead_run(jq, "r1")
    app = create_app(jq)
    other = csrf_token(TestClient(app))
    victim = TestClient(app, follow_redirects=False)
    csrf_token(victim)
    reply = victim.post("/actions/retry", content=f"csrf_token={other}&run_id=r1", headers=FORM)
    assert reply.status_code == 403


def test_a_post_without_a_session_cookie_is_refused(jq: JobQueue, client: TestClient) -> None:
    dead_run(jq, "x")
    token = csrf_token(client)
    client.cookies.clear()
    reply = client.post("/actions/retry", content=f"csrf_token={token}&run_id=x", headers=FORM)
    assert reply.status_code == 403


def test_a_post_from_another_origin_is_refused(jq: JobQueue, client: TestClient) -> None:
    dead_run(jq, "r1")
    token = csrf_token(client)
    reply = client.post(
        "/actions/retry",
        content=f"csrf_token={token}&run_id=r1",
        headers={**FORM, "origin": "http://evil.example"},
    )
    assert reply.status_code == 403
    assert jq.get_run("r1").state == "dead"


def test_tokens_do_not_survive_a_restart_of_the_dashboard(jq: JobQueue) -> None:
    dead_run(jq, "x")
    old = TestClient(create_app(jq), follow_redirects=False)
    token = csrf_token(old)
    restarted = TestClient(create_app(jq), follow_redirects=False)
    restarted.cookies.set(SESSION_COOKIE, old.cookies[SESSION_COOKIE])
    reply = restarted.post("/actions/retry", content=f"csrf_token={token}&run_id=x", headers=FORM)
    assert reply.status_code == 403


def test_after_an_action_only_a_local_path_is_followed(jq: JobQueue, client: TestClient) -> None:
    dead_run(jq, "x")
    token = csrf_token(client)
    for target in ("https://evil.example/", "//evil.example/x", "/\\evil.example"):
        reply = client.post(
            "/actions/retry", content=f"csrf_token={token}&run_id=x&next={target}", headers=FORM
        )
        assert reply.headers["location"] == "/"


def test_get_cannot_change_anything(jq: JobQueue, client: TestClient) -> None:
    dead_run(jq, "r1")
    assert client.get("/actions/retry?run_id=r1").status_code == 405
    assert jq.get_run("r1").state == "dead"


def basic(user: str, password: str) -> dict[str, str]:
    return {"authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def test_basic_auth_is_required_when_configured(jq: JobQueue) -> None:
    app = create_app(jq, credentials=Credentials.parse_basic("ops:s3cret"))
    client = TestClient(app)
    refused = client.get("/queues")
    assert refused.status_code == 401
    assert refused.headers["www-authenticate"].startswith("Basic")
    assert client.get("/queues", headers=basic("ops", "wrong")).status_code == 401
    assert client.get("/queues", headers=basic("ops", "s3cret")).status_code == 200


def test_auth_guards_actions_too(jq: JobQueue) -> None:
    dead_run(jq, "r1")
    client = TestClient(create_app(jq, credentials=Credentials.parse_basic("ops:s3cret")))
    reply = client.post("/actions/retry", content="run_id=r1", headers=FORM)
    assert reply.status_code == 401
    assert jq.get_run("r1").state == "dead"


def test_a_bearer_token_is_accepted(jq: JobQueue) -> None:
    client = TestClient(create_app(jq, credentials=Credentials(token="t0k")))
    assert client.get("/workers").status_code == 401
    assert client.get("/workers", headers={"authorization": "Bearer nope"}).status_code == 401
    assert client.get("/workers", headers={"authorization": "Bearer t0k"}).status_code == 200


def test_a_token_in_the_address_becomes_a_cookie_and_leaves_the_address(jq: JobQueue) -> None:
    client = TestClient(
        create_app(jq, credentials=Credentials(token="t0k")), follow_redirects=False
    )
    assert client.get("/runs?token=wrong").status_code == 401
    reply = client.get("/runs?state=dead&token=t0k")
    assert reply.status_code == 303 and reply.headers["location"] == "/runs?state=dead"
    assert "t0k" not in reply.headers["set-cookie"]  # the cookie holds an HMAC of it
    assert client.cookies.get(TOKEN_COOKIE)
    assert client.get("/runs?state=dead").status_code == 200


def test_basic_auth_parsing_refuses_a_missing_password() -> None:
    for text in ("ops", "ops:", ":pw"):
        with pytest.raises(ValueError, match="user:password"):
            Credentials.parse_basic(text)


def test_a_loopback_dashboard_refuses_a_foreign_host_header(jq: JobQueue) -> None:
    # A page on evil.example whose name re-resolves to 127.0.0.1 (DNS rebinding) sends
    # Host: evil.example; the dashboard answers only to its own names.
    app = create_app(jq, allowed_hosts=["127.0.0.1", "localhost"])
    client = TestClient(app, base_url="http://127.0.0.1:8000")
    assert client.get("/queues").status_code == 200
    assert client.get("/queues", headers={"host": "evil.example"}).status_code == 400


def test_loopback_addresses_are_recognised() -> None:
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.5.0.1", "::1", "[::1]", "localhost"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "192.168.1.2", "example.com", "::"))


def run_cli(*args: str) -> Any:
    return CliRunner().invoke(main, ["--redis-url", "redis://127.0.0.1:1/0", "dashboard", *args])


def test_a_public_address_without_auth_is_refused_in_one_line() -> None:
    result = run_cli("--host", "0.0.0.0")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: refusing to serve on non-loopback 0.0.0.0")
    assert "--insecure" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_auth_and_token_together_are_refused() -> None:
    result = run_cli("--auth", "a:b", "--token", "t")
    assert result.exit_code == 2 and "not both" in result.stderr


def test_a_missing_dashboard_extra_is_one_line_saying_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # import uvicorn now raises ImportError
    result = run_cli()
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        "error: the dashboard needs starlette, jinja2 and uvicorn: pip install starlette "
        "jinja2 uvicorn (the dashboard extra of jobqueue-redis)"
    )


def test_an_unreachable_redis_is_a_503_line_not_a_traceback() -> None:
    no_retry = Retry(NoBackoff(), 0)  # one refused connection is enough
    jq = JobQueue(redis.Redis(host="127.0.0.1", port=1, retry=no_retry))
    reply = TestClient(create_app(jq), raise_server_exceptions=False).get("/queues")
    assert reply.status_code == 503
    assert reply.text.startswith("Redis unavailable: ConnectionError")
    assert "Traceback" not in reply.text


def test_a_non_ascii_token_is_refused_not_a_crash(jq: JobQueue, client: TestClient) -> None:
    dead_run(jq, "r1")
    csrf_token(client)
    body = b"csrf_token=%C3%A9t%C3%A9&run_id=r1"
    assert client.post("/actions/retry", content=body, headers=FORM).status_code == 403


def test_a_non_ascii_auth_cookie_is_refused_not_a_crash(jq: JobQueue) -> None:
    client = TestClient(create_app(jq, credentials=Credentials(token="t0k")))
    raw = f"{TOKEN_COOKIE}=\u00e9t\u00e9".encode()
    assert client.get("/queues", headers={"cookie": raw}).status_code == 401


# -- read-only ---------------------------------------------------------------------------------

ACTION_NAMES = ["retry", "purge", "cancel", "pause", "resume", "pause-queue", "resume-queue",
                "trigger", "no-such-action"]  # fmt: skip


@pytest.fixture
def read_only(jq: JobQueue) -> TestClient:
    return TestClient(create_app(jq, read_only=True, secret=b"s" * 32), follow_redirects=False)


def test_a_read_only_dashboard_shows_no_action_button(jq: JobQueue, read_only: TestClient) -> None:
    dead_run(jq, "gone")
    jq.enqueue(jq.resolve_task("report").with_options(run_id="due"))
    jq.schedule("nightly", "report", every=3600)
    for page in ("/queues", "/queue?name=default", "/schedules", "/run?id=gone", "/run?id=due"):
        text = read_only.get(page).text
        assert "read-only</span>" in text, page
        assert "/actions/" not in text and 'method="post"' not in text, page


@pytest.mark.parametrize("name", ACTION_NAMES)
def test_a_read_only_dashboard_refuses_every_action_whatever_its_token(
    jq: JobQueue, read_only: TestClient, name: str
) -> None:
    dead_run(jq, "r1")
    # A valid session and token, as a dashboard with the same secret hands out.
    same_secret = TestClient(create_app(jq, secret=b"s" * 32))
    token = csrf_token(same_secret)
    session = same_secret.cookies[SESSION_COOKIE]
    reply = read_only.post(f"/actions/{name}", headers={**FORM, "cookie": f"jq_session={session}"},
                           content=f"csrf_token={token}&run_id=r1&confirm=yes&queue=default")
    assert reply.status_code == 403
    assert reply.text.startswith("this dashboard is read-only")
    assert jq.get_run("r1").state == "dead" and not jq.queue_paused("default")


def test_jobqueue_dashboard_read_only_serves_a_read_only_dashboard(
    jq: JobQueue, real_server: EmbeddedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    import uvicorn

    served: list[Any] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: served.append(app))
    result = CliRunner().invoke(main, ["--redis-url", real_server.url, "dashboard", "--read-only"])
    assert result.exit_code == 0, result.output
    (app,) = served
    client = TestClient(app, base_url="http://127.0.0.1")  # a loopback dashboard checks Host
    reply = client.post("/actions/retry", content="run_id=x", headers=FORM)
    assert reply.status_code == 403 and "read-only" in reply.text
