"""The dashboard inside another app: mounted under a prefix by Starlette, FastAPI or a Django
ASGI router, none of which runs a mounted app's lifespan, it still samples the queues' gauges
(its first request starts its sampler), and its links, forms and redirects follow the prefix.
The sampler's life: one per app whatever the loops serving it, stopped by a lifespan's
shutdown, ended when its app is dropped."""

from __future__ import annotations

import asyncio
import gc
import re
import socket
import sys
import threading
import types
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import uvicorn
from helpers import wait_for, wait_for_async
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Mount, Route
from starlette.testclient import TestClient
from starlette.types import ASGIApp

from jobqueue.client.sync import JobQueue
from jobqueue.dashboard.app import create_app
from jobqueue.dashboard.mount import under_prefix
from jobqueue.dashboard.sampler import TASK_NAME
from jobqueue.ops import gauges

pytestmark = pytest.mark.real_only

PREFIX = "/ops/jobs"


@pytest.fixture
def queued(jq: JobQueue) -> JobQueue:
    jq.declare_task("report", max_attempts=1)
    jq.enqueue(jq.resolve_task("report").with_options(run_id="r1"))
    return jq


def has_history(jq: JobQueue) -> bool:
    (found,) = gauges.history(jq, ["default"], gauges.MINUTES, jq.server_time_ms())
    return bool(found.points)


@contextmanager
def serving(app: ASGIApp, lifespan: str) -> Iterator[str]:
    """uvicorn serving ``app`` on a free loopback port, in a thread; its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan=lifespan))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started, what="uvicorn started", interval=0.02)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return reply.status, reply.read().decode()


def starlette_host(dashboard: ASGIApp) -> ASGIApp:
    return Starlette(routes=[Route("/", lambda r: PlainTextResponse("host")),
                             Mount(PREFIX, app=dashboard)])  # fmt: skip


def fastapi_host(dashboard: ASGIApp) -> ASGIApp:
    from fastapi import FastAPI

    app = FastAPI()
    app.get("/", response_class=PlainTextResponse)(lambda: "host")
    app.mount(PREFIX, dashboard)
    return app


def django_host(dashboard: ASGIApp) -> ASGIApp:
    """Django's ASGI handler, which has no mounting and refuses the lifespan protocol (uvicorn
    then carries on without one), with the dashboard routed to by ``under_prefix``."""
    from django.conf import settings
    from django.core.asgi import get_asgi_application
    from django.http import HttpResponse
    from django.urls import path

    if not settings.configured:  # as tests/test_recipes.py configures it, whichever runs first
        settings.configure(
            DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
            INSTALLED_APPS=[],
            USE_TZ=True,
        )
    urls = types.ModuleType("dashboard_host_urls")
    urls.urlpatterns = [path("", lambda request: HttpResponse("host"))]  # type: ignore[attr-defined]
    sys.modules[urls.__name__] = urls
    settings.ROOT_URLCONF = urls.__name__
    settings.ALLOWED_HOSTS = ["127.0.0.1"]
    return under_prefix(PREFIX, dashboard, get_asgi_application())


HOSTS = {"starlette": (starlette_host, "on"), "fastapi": (fastapi_host, "on"),
         "django": (django_host, "auto")}  # fmt: skip


@pytest.mark.parametrize("host", sorted(HOSTS))
def test_a_mounted_dashboard_samples_though_its_lifespan_never_runs(
    queued: JobQueue, host: str
) -> None:
    build, lifespan = HOSTS[host]
    with serving(build(create_app(queued)), lifespan) as base:
        assert get(base + "/") == (200, "host")
        assert not has_history(queued)
        status, page = get(base + PREFIX + "/workers")  # a page that writes nothing itself
        assert status == 200 and f'href="{PREFIX}/queues"' in page
        wait_for(lambda: has_history(queued), what="the sampler to write a point", interval=0.02)


# -- a prefix ------------------------------------------------------------------------------------


@pytest.fixture
def mounted(queued: JobQueue) -> TestClient:
    host = starlette_host(create_app(queued, sample_every_s=None))
    return TestClient(host, follow_redirects=False)


PAGES = ["/", "/queues", "/queue?name=default", "/runs", "/run?id=r1", "/leases", "/flows",
         "/schedules", "/dead", "/workers", "/events"]  # fmt: skip


@pytest.mark.parametrize("page", PAGES)
def test_every_link_form_and_script_of_a_page_starts_with_the_prefix(
    queued: JobQueue, mounted: TestClient, page: str
) -> None:
    queued.schedule("nightly", "report", every=3600)  # the schedules page's forms
    reply = mounted.get(PREFIX + page)
    assert reply.status_code == 200
    targets = re.findall(r'(?:href|action|src|formaction|data-live|data-root)="([^"]*)"',
                         reply.text)  # fmt: skip
    local = [t for t in targets if t.startswith("/")]
    assert local, "the page links nowhere"
    assert [t for t in local if not t.startswith(PREFIX)] == []
    nexts = re.findall(r'name="next" value="([^"]*)"', reply.text)
    assert [n for n in nexts if not n.startswith(PREFIX + "/")] == []


def test_an_actions_redirect_stays_under_the_prefix(queued: JobQueue, mounted: TestClient) -> None:
    page = mounted.get(PREFIX + "/queues").text
    form = re.search(r'<form method="post" action="([^"]+)".*?</form>', page, re.S)
    assert form and form.group(1) == PREFIX + "/actions/pause-queue"
    fields = dict(re.findall(r'name="([^"]+)" value="([^"]*)"', form.group(0)))
    reply = mounted.post(form.group(1), data=fields)
    assert reply.status_code == 303 and reply.headers["location"] == PREFIX + "/queues"
    assert queued.queue_paused("default")


def test_a_search_for_a_run_id_redirects_under_the_prefix(mounted: TestClient) -> None:
    reply = mounted.get(PREFIX + "/runs", params={"q": "r1"})
    assert reply.headers["location"] == PREFIX + "/run?id=r1&queue=default"


# -- the sampler's life ----------------------------------------------------------------------------


def samplers() -> list[asyncio.Task[Any]]:
    """The sampler tasks alive on the running loop."""
    return [t for t in asyncio.all_tasks() if t.get_name() == TASK_NAME and not t.done()]


async def asgi_get(app: ASGIApp, path: str) -> int:
    """One GET straight through the ASGI interface, on the running loop; its status."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "GET", "scheme": "http", "path": path, "raw_path": path.encode(),
             "query_string": b"", "root_path": "", "headers": [(b"host", b"testserver")],
             "client": ("127.0.0.1", 1), "server": ("testserver", 80)}  # fmt: skip
    status: list[int] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            status.append(message["status"])

    await app(scope, receive, send)
    return status[0]


def test_a_lifespan_that_runs_starts_the_sampler_and_its_shutdown_stops_it(
    queued: JobQueue,
) -> None:
    app = create_app(queued)

    async def scenario() -> None:
        inbox: asyncio.Queue[dict[str, str]] = asyncio.Queue()
        sent: list[str] = []

        async def send(message: dict[str, Any]) -> None:
            sent.append(message["type"])

        life = asyncio.create_task(app({"type": "lifespan", "asgi": {"version": "3.0"},
                                        "state": {}}, inbox.get, send))  # fmt: skip
        await inbox.put({"type": "lifespan.startup"})
        await wait_for_async(lambda: "lifespan.startup.complete" in sent, what="the startup")
        assert len(samplers()) == 1
        await inbox.put({"type": "lifespan.shutdown"})
        await life
        assert sent == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
        assert samplers() == []  # stopped while its loop still runs

    asyncio.run(scenario())


def test_one_app_never_runs_two_samplers_whatever_the_loops(queued: JobQueue) -> None:
    app = create_app(queued)
    first_serving, release = threading.Event(), threading.Event()
    counted: dict[str, int] = {}

    async def first_loop() -> None:
        assert await asgi_get(app, "/workers") == 200
        assert await asgi_get(app, "/workers") == 200  # a second request: still one
        counted["first"] = len(samplers())
        first_serving.set()
        await asyncio.to_thread(release.wait, 20)  # the loop (and its sampler) runs meanwhile

    async def other_loop(name: str) -> None:
        assert await asgi_get(app, "/workers") == 200
        counted[name] = len(samplers())

    thread = threading.Thread(target=asyncio.run, args=(first_loop(),))
    thread.start()
    try:
        assert first_serving.wait(10)
        asyncio.run(other_loop("beside"))  # while the first loop's sampler runs: none here
    finally:
        release.set()
        thread.join(10)
    asyncio.run(other_loop("after"))  # the first loop is gone: this one takes over
    assert counted == {"first": 1, "beside": 0, "after": 1}


def test_an_app_dropped_by_its_host_ends_its_sampler(queued: JobQueue) -> None:
    async def scenario() -> None:
        app = create_app(queued, sample_every_s=0.01)
        # A page runs in a worker thread, which keeps its request (and so the app) until
        # its next job: a request answered on the loop leaves nothing behind.
        assert await asgi_get(app, "/no-such-page") == 404
        (task,) = samplers()
        del app
        # It ends at its next look. (A collection made while a look, in its thread, briefly
        # held the sampler frees the app but not yet the sampler: collect again meanwhile.)
        await wait_for_async(lambda: gc.collect() >= 0 and task.done(), 10, "the sampler to end",
                             interval=0.1)
        assert task.done() and not task.cancelled() and task.exception() is None

    asyncio.run(scenario())
