"""A dashboard with realistic data in it, seen through Debian's headless Chromium: what the
browser tests (tests/test_dashboard_e2e.py) check every page on, and what
tools/dashboard_shots.py photographs.

``fill`` writes a few queues' worth of runs into a JobQueue's Redis (done over the last hour,
dead with a traceback, running under a registered worker's lease, pending now and later,
waiting in a workflow, cancelled), a finished batch, two recurring jobs and two workers; the
same names each time, times relative to the server's clock. ``serving`` serves the dashboard
with uvicorn on a loopback port; ``open_page`` brings a browser tab to one of ``PAGES``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import uvicorn
from helpers import wait_for
from playwright.sync_api import Browser, Page, Playwright

from jobqueue.client.sync import JobQueue
from jobqueue.dashboard.app import create_app
from jobqueue.store.keys import WORKERS_KEY
from jobqueue.store.runs import CLAIM, COMPLETE, FAIL
from jobqueue.testing import run_due

ROOT = Path(__file__).resolve().parents[1]
# axe-core, fetched from the npm registry by bin/test (never at test time): its version is
# pinned there (AXE_CORE_VERSION).
AXE = ROOT / ".cache/axe-core/node_modules/axe-core/axe.min.js"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

# Every page of the dashboard (jobqueue/dashboard/app.py, create_app), by the name its
# screenshots take: the GET pages by path, then the purge's confirmation (reached by a POST)
# and the page of a run that does not exist.
PAGES = (
    "overview", "queues", "queue", "leases", "runs", "run", "flows", "flow", "schedules",
    "dead", "workers", "events", "confirm", "missing",
)  # fmt: skip
DEAD_RUN = "charge-1042"  # the run page shown, and the run whose purge is asked for
FLOW = "onboard-acme"
PATHS = {
    "run": f"/run?id={DEAD_RUN}&queue=billing",
    "flow": f"/flow?id={FLOW}",
    "missing": "/run?id=no-such-run",
    "overview": "/",
    "queue": "/queue?name=billing",
    **{name: f"/{name}" for name in PAGES
       if name not in ("run", "flow", "confirm", "missing", "overview", "queue")},
}
RUNNING_WORKER = "media-7f9c4d:2817:9f3a"
STALE_WORKER = "billing-5b2e81:3120:1c7e"
MINUTE_MS = 60_000


class PaymentDeclinedError(Exception):
    pass


PaymentDeclinedError.__module__ = "payments"  # shown as an application's error would be


def _register_tasks(jq: JobQueue) -> None:
    @jq.task(name="send_invoice", queue="billing")
    def send_invoice(customer: str, amount_cents: int) -> dict[str, Any]:
        return {"customer": customer, "amount_cents": amount_cents, "sent": True}

    @jq.task(name="charge_card", queue="billing", max_attempts=1)
    def charge_card(customer: str, amount_cents: int) -> None:
        raise PaymentDeclinedError(f"card of {customer} declined: insufficient funds")

    @jq.task(name="sync_crm", queue="billing", max_attempts=5, backoff=600)
    def sync_crm(customer: str) -> None:
        raise TimeoutError("crm.internal:443 did not answer within 10 s")

    @jq.task(name="resize_image", queue="media")
    def resize_image(path: str, width: int) -> str:
        return path.replace(".jpg", f"-{width}w.jpg")

    @jq.task(name="publish_gallery", queue="media")
    def publish_gallery(name: str) -> None: ...

    @jq.task(name="create_account", queue="onboarding")
    def create_account(company: str) -> str:
        return f"acct-{company}"

    @jq.task(name="send_welcome", queue="emails")
    def send_welcome(company: str) -> None: ...

    @jq.task(name="provision_workspace", queue="provisioning")
    def provision_workspace(company: str) -> None: ...

    @jq.task(name="notify_sales", queue="emails")
    def notify_sales(company: str) -> None: ...

    @jq.task(name="nightly_report", queue="reports")
    def nightly_report() -> None: ...


def _history(jq: JobQueue, queue: str, task: str, minutes_ago: list[int], now: int) -> None:
    """Runs finished over the last hour, at the given minutes before ``now`` (so the
    throughput charts have bars), claimed and completed by the scripts as a worker would."""
    for i, ago in enumerate(minutes_ago):
        rid = f"{task}-h{i:03d}"
        jq.enqueue(jq.resolve_task(task).with_options(run_id=rid), f"cust-{i % 7}", 1000 + i)
        keys = jq.keys_for(queue, rid)
        reply = jq.scripts.run(CLAIM.call(keys, 1, STALE_WORKER, 30_000, 86_400_000))
        (run,) = CLAIM.parse(reply).runs
        at = now - ago * MINUTE_MS - 1000 * (i % 50)
        if i % 11 == 10:  # one in eleven died
            error = "ConnectionResetError: [Errno 104] Connection reset by peer"
            jq.scripts.run(FAIL.call(keys, rid, run.fence, error, None, 86_400_000, at))
        else:
            result = json.dumps({"sent": True})
            jq.scripts.run(COMPLETE.call(keys, [(rid, run.fence, result)], 86_400_000, at))


def fill(jq: JobQueue) -> None:
    """Realistic data in ``jq``'s Redis. It touches no queue but its own (billing, media,
    onboarding, emails, provisioning, reports), and runs none but its own tasks."""
    _register_tasks(jq)
    now = jq.server_time_ms()
    _history(jq, "billing", "send_invoice", [1, 2, 2, 4, 7, 9, 9, 12, 18, 23, 31, 35, 35, 42,
                                             47, 51, 55, 58], now)  # fmt: skip
    _history(jq, "media", "resize_image", [3, 5, 5, 6, 14, 20, 26, 26, 33, 44, 57], now)

    # Run by an in-process worker: done, dead (with a traceback) and retrying.
    invoice = jq.resolve_task("send_invoice")
    for n, (customer, cents) in enumerate([("acme", 129_900), ("globex", 4_500)]):
        jq.enqueue(invoice.with_options(run_id=f"invoice-{2001 + n}"), customer, cents)
    charge = jq.resolve_task("charge_card")
    jq.enqueue(charge.with_options(run_id=DEAD_RUN), "initech", 99_00)
    jq.enqueue(charge.with_options(run_id="charge-1043"), "umbrella", 12_50)
    jq.enqueue(jq.resolve_task("sync_crm").with_options(run_id="sync-crm-acme"), "acme")
    batch = jq.batch(
        [jq.resolve_task("resize_image").s(f"uploads/photo-{i}.jpg", 640) for i in range(1, 7)],
        on_success=jq.resolve_task("publish_gallery").s("spring-sale"),
        batch_id="thumbnails-0611",
    )
    flow = jq.workflow(
        {
            "create_account": jq.resolve_task("create_account").s("acme"),
            "send_welcome": jq.resolve_task("send_welcome").s("acme").after("create_account"),
            "provision": jq.resolve_task("provision_workspace").s("acme").after("create_account"),
            "notify_sales": jq.resolve_task("notify_sales")
            .s("acme")
            .after("send_welcome", "provision"),
        },
        flow_id=FLOW,
    )
    worker_log = logging.getLogger("jobqueue.worker")
    level, worker_log.level = worker_log.level, logging.CRITICAL  # the failures are on purpose
    try:
        run_due(jq, ["billing", "media", "onboarding"])
    finally:
        worker_log.setLevel(level)
    assert batch is not None and flow is not None

    # Running: claimed by a worker that is alive (its registry entry is fresh).
    resize = jq.resolve_task("resize_image")
    for i in range(3):
        rid = f"resize-{3001 + i}"
        jq.enqueue(resize.with_options(run_id=rid), f"uploads/banner-{i}.jpg", 1920)
        keys = jq.keys_for("media", rid)
        jq.scripts.run(CLAIM.call(keys, 1, RUNNING_WORKER, 600_000, 86_400_000))
    # Pending: due now (nobody serves the emails queue), later, and one cancelled.
    for i, company in enumerate(["hooli", "pied-piper", "stark"]):
        jq.enqueue(jq.resolve_task("send_welcome").with_options(run_id=f"welcome-{i + 1}"),
                   company)  # fmt: skip
    jq.enqueue(invoice.with_options(run_id="invoice-2003", delay=3600), "wayne", 250_000)
    jq.enqueue(invoice.with_options(run_id="invoice-2004", delay=7200), "wonka", 9_900)
    jq.cancel("invoice-2004", reason="customer closed the account")
    # Fair shares in billing, a queue of tenants (limit keys): the groups on its page.
    jq.set_fair_shares("billing")
    jq.set_group("billing", "acme", weight=3, max_size=500)
    jq.pause_group("billing", "initech")
    for n, (customer, delay) in enumerate([("acme", 1800), ("acme", 1800), ("globex", 5400)]):
        later = invoice.with_options(run_id=f"invoice-{2005 + n}", delay=delay, limit_key=customer)
        jq.enqueue(later, customer, 10_000 + n)

    jq.schedule("nightly-report", "nightly_report", cron="0 2 * * *", tz="Europe/Paris")
    jq.schedule("sync-crm", "sync_crm", every=300, args=["all"])
    jq.pause_schedule("sync-crm")

    now = jq.server_time_ms()
    for wid, queues, seen_ago, in_flight in [
        (RUNNING_WORKER, ["media"], 2_000, 3),
        (STALE_WORKER, ["billing", "emails"], 300_000, 0),
    ]:
        host, pid, _ = wid.split(":")
        entry = {
            "id": wid, "host": host, "pid": int(pid), "queues": queues, "concurrency": 8,
            "in_flight": in_flight, "started_ms": now - 3 * 3_600_000,
            "last_seen_ms": now - seen_ago,
        }  # fmt: skip
        jq.redis.hset(WORKERS_KEY, wid, json.dumps(entry))


@contextlib.contextmanager
def serving(jq: JobQueue, **options: Any) -> Iterator[str]:
    """The dashboard of ``jq`` served by uvicorn on a free loopback port, in a thread; yields
    its base URL, and stops it on exit."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))  # a free loopback port, held from the start: no race
    port = sock.getsockname()[1]
    app = create_app(jq, allowed_hosts=["127.0.0.1"], **options)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started, 10, "uvicorn to start", interval=0.02)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def launch(pw: Playwright) -> Browser:
    """Debian's chromium, headless (never a browser Playwright downloads)."""
    assert CHROMIUM.exists(), "Debian's chromium is needed: apt-get install -y chromium"
    return pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)


def open_page(page: Page, base_url: str, name: str) -> None:
    """Bring ``page`` to the dashboard page ``name`` (one of PAGES), loaded."""
    if name == "confirm":  # what the purge button of a dead run answers, before anything goes
        page.goto(f"{base_url}/dead")
        with page.expect_navigation():
            page.locator(f'#dead tr[data-run-id="{DEAD_RUN}"] button[data-action="purge"]').click()
    else:
        page.goto(base_url + PATHS[name])
