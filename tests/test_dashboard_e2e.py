"""The dashboard end to end: uvicorn serving it on a loopback port, a real Redis server, and
Debian's headless Chromium driven by Playwright (never `playwright install`: no browser is
downloaded; CI installs the chromium package in .ci/run). No skip: a missing browser fails.

Every page (tests/dashboard_sample.py's PAGES, over its realistic data) is also checked for
accessibility by axe-core run inside the browser (fetched by bin/test, never at test time), and
on a phone's 390 px wide screen: no sideways scrolling, the navigation all on screen."""

from __future__ import annotations

import struct
import time
import uuid
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from dashboard_sample import AXE, PAGES, fill, launch, open_page, serving
from helpers import claim_one
from playwright.sync_api import Browser, BrowserContext, Page, sync_playwright

from jobqueue.client.sync import JobQueue
from jobqueue.store.embedded import EmbeddedServer
from jobqueue.store.runs import COMPLETE, FAIL

pytestmark = pytest.mark.slow

BAR_RGB = (0x25, 0x63, 0xEB)  # charts.PALETTE[0]: the finished/min bars
SHOTS = Path("/tmp/jobqueue-dashboard-shots")
PHONE = {"width": 390, "height": 844}
# Impacts that fail the test; moderate and minor ones are not checked.
FAILING_IMPACTS = ("serious", "critical")
AXE_TIMEOUT_MS = 20_000


@pytest.fixture(scope="module")
def jq(real_server: EmbeddedServer) -> Iterator[JobQueue]:
    redis.Redis.from_url(real_server.url).flushall()
    q = JobQueue.from_url(real_server.url)
    q.declare_task("report", max_attempts=1)
    yield q
    q.close()


@pytest.fixture(scope="module")
def base_url(jq: JobQueue) -> Iterator[str]:
    with serving(jq) as url:
        yield url


@pytest.fixture(scope="module")
def sample(jq: JobQueue) -> None:
    """tests/dashboard_sample.py's realistic data, in queues of its own."""
    fill(jq)


@pytest.fixture(scope="module")
def chromium() -> Iterator[Browser]:
    with sync_playwright() as pw:
        browser = launch(pw)
        yield browser
        browser.close()


def new_context(chromium: Browser, **options: Any) -> BrowserContext:
    context = chromium.new_context(**options)
    context.set_default_timeout(10_000)
    return context


@pytest.fixture(scope="module")
def browser(chromium: Browser) -> Iterator[BrowserContext]:
    """A desktop browser, under the pages' own Content-Security-Policy."""
    context = new_context(chromium, viewport={"width": 1400, "height": 1000})
    yield context
    context.close()


@pytest.fixture(scope="module")
def audited(chromium: Browser) -> Iterator[BrowserContext]:
    """A desktop browser in which every page has axe-core loaded. An init script is run by the
    browser itself, as the page starts, so the pages' CSP (script-src 'self') still holds: axe
    sees each page as a user gets it."""
    assert AXE.exists(), f"axe-core is missing at {AXE}: bin/test fetches it (npm)"
    context = new_context(chromium, viewport={"width": 1280, "height": 900})
    context.add_init_script(path=str(AXE))
    yield context
    context.close()


@pytest.fixture(scope="module")
def phone(chromium: Browser) -> Iterator[BrowserContext]:
    """A phone's screen, 390 x 844 CSS px, as a mobile browser lays pages out (the viewport
    meta tag honoured; without one a page is laid out 980 px wide)."""
    context = new_context(chromium, viewport=PHONE, is_mobile=True, has_touch=True)
    yield context
    context.close()


@pytest.fixture
def page(browser: BrowserContext) -> Iterator[Page]:
    p = browser.new_page()
    yield p
    p.close()


@pytest.fixture
def audited_page(audited: BrowserContext) -> Iterator[Page]:
    p = audited.new_page()
    yield p
    p.close()


@pytest.fixture
def phone_page(phone: BrowserContext) -> Iterator[Page]:
    p = phone.new_page()
    yield p
    p.close()


def run_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def claimed(jq: JobQueue, queue: str, rid: str) -> tuple[Any, int]:
    """Claim ``rid``: each test uses its own queue, so it is that queue's only due run."""
    keys = jq.keys_for(queue, rid)
    run = claim_one(jq.scripts, keys, owner="e2e", retention_ms=60_000)
    assert run.run_id == rid
    return keys, run.fence


def test_runs_page_shows_a_run_created_by_the_test(jq: JobQueue, page: Page, base_url: str) -> None:
    rid = run_id("invoice")
    jq.enqueue(jq.resolve_task("report").with_options(run_id=rid), 42)
    page.goto(f"{base_url}/runs")
    row = page.locator("#runs tr", has_text=rid)
    assert row.count() == 1
    assert "pending" in row.inner_text()
    row.get_by_role("link", name=rid).click()
    page.wait_for_url("**/run?id=*")
    assert page.locator("h1").inner_text() == f"Run {rid}"
    assert "42" in page.locator("table.fields").inner_text()  # the payload's argument


def test_retry_button_on_a_dead_run_puts_it_back(jq: JobQueue, page: Page, base_url: str) -> None:
    rid = run_id("doomed")
    jq.enqueue(jq.resolve_task("report").with_options(run_id=rid, queue="e2e-dead"))
    keys, fence = claimed(jq, "e2e-dead", rid)
    jq.scripts.run(FAIL.call(keys, rid, fence, "ValueError: boom", None, 60_000))
    assert jq.get_run(rid).state == "dead"
    page.goto(f"{base_url}/dead")
    row = page.locator(f'#dead tr[data-run-id="{rid}"]')
    assert "ValueError: boom" in row.inner_text()
    SHOTS.mkdir(exist_ok=True)
    page.screenshot(path=str(SHOTS / "dead-page.png"))  # for a person to look at
    with page.expect_navigation():
        row.locator('button[data-action="retry"]').click()
    assert page.locator(".flash").inner_text() == "retried 1 run(s)"
    assert page.locator(f'#dead tr[data-run-id="{rid}"]').count() == 0
    # Redis, not the page, is the judge.
    assert jq.redis.hget(keys.run(rid), "state") == "pending"
    assert jq.redis.zscore(keys.due, rid) is not None
    assert jq.redis.zscore(keys.dead, rid) is None


def test_purge_asks_for_confirmation_then_deletes_the_dead_run(
    jq: JobQueue, page: Page, base_url: str
) -> None:
    rid = run_id("purged")
    jq.enqueue(jq.resolve_task("report").with_options(run_id=rid, queue="e2e-purge"))
    keys, fence = claimed(jq, "e2e-purge", rid)
    jq.scripts.run(FAIL.call(keys, rid, fence, "ValueError: boom", None, 60_000))
    page.goto(f"{base_url}/dead")
    with page.expect_navigation():
        page.locator(f'#dead tr[data-run-id="{rid}"] button[data-action="purge"]').click()
    assert "for good?" in page.locator("main, body").first.inner_text()
    assert jq.redis.hget(keys.run(rid), "state") == "dead"  # nothing gone yet
    with page.expect_navigation():
        page.locator('button[data-action="confirm-purge"]').click()
    assert page.locator(".flash").inner_text() == "purged 1 of 1 dead run(s)"
    assert page.locator(f'#dead tr[data-run-id="{rid}"]').count() == 0
    assert not jq.redis.exists(keys.run(rid)) and jq.redis.zscore(keys.dead, rid) is None


def read_png_rgb(data: bytes) -> tuple[int, int, list[tuple[int, int, int]]]:
    """A tiny PNG reader (8-bit RGB/RGBA, not interlaced: what Chromium writes)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            idat += body
    width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert depth == 8 and color in (2, 6) and interlace == 0, (depth, color, interlace)
    bpp = 3 if color == 2 else 4
    raw, stride = zlib.decompress(idat), width * bpp
    prev, pixels = bytearray(stride), []
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1 : start + 1 + stride])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if kind == 1:
                line[i] = (line[i] + a) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + b) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 0xFF
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else b if pb <= pc else c
                line[i] = (line[i] + pred) & 0xFF
        pixels.extend(tuple(line[i : i + 3]) for i in range(0, stride, bpp))
        prev = line
    return width, height, pixels  # type: ignore[return-value]


def test_queue_chart_renders(jq: JobQueue, page: Page, base_url: str) -> None:
    now = jq.server_time_ms()
    for minutes_ago in (2, 2, 2, 9, 9, 25, 40, 40, 40, 40):
        rid = run_id("done")
        jq.enqueue(jq.resolve_task("report").with_options(run_id=rid, queue="e2e-chart"))
        keys, fence = claimed(jq, "e2e-chart", rid)
        finished_at = now - minutes_ago * 60_000
        jq.scripts.run(COMPLETE.call(keys, [(rid, fence, "null")], 86_400_000, finished_at))
    page.goto(f"{base_url}/queues")
    chart = page.locator("#chart-throughput-e2e-chart")
    assert chart.is_visible()
    SHOTS.mkdir(exist_ok=True)
    shot = chart.screenshot(path=str(SHOTS / "throughput.png"))
    page.screenshot(path=str(SHOTS / "queues-page.png"), full_page=True)
    width, height, pixels = read_png_rgb(shot)
    assert 560 <= width <= 564 and 170 <= height <= 174  # the SVG plus its 1 px border
    background = sum(1 for p in pixels if p == (255, 255, 255))
    bars = sum(1 for p in pixels if all(abs(a - b) <= 8 for a, b in zip(p, BAR_RGB, strict=True)))
    assert background > len(pixels) // 2  # a white chart area, not a blank or black box
    assert bars > 300, f"only {bars} bar-coloured pixels: the bars did not render"


def test_a_page_shows_a_new_run_without_being_reloaded(
    jq: JobQueue, page: Page, base_url: str
) -> None:
    """Live: the runs page follows the event log (static/live.js) and reads itself again."""
    page.goto(f"{base_url}/runs")
    page.locator("#live").wait_for(state="visible")  # its stream is open
    page.evaluate("window.notReloaded = true")
    rid = run_id("live")
    jq.enqueue(jq.resolve_task("report").with_options(run_id=rid), 7)
    page.locator("#runs tr", has_text=rid).wait_for()
    assert page.evaluate("window.notReloaded") is True  # the same page: no reload


def test_the_events_page_adds_each_event_as_it_comes(
    jq: JobQueue, page: Page, base_url: str
) -> None:
    page.goto(f"{base_url}/events")
    page.locator("#live").wait_for(state="visible")
    rid = run_id("evt")
    jq.enqueue(jq.resolve_task("report").with_options(run_id=rid), 1)
    jq.cancel(rid)
    page.locator("#events tr", has_text="cancelled").filter(has_text=rid).wait_for()
    assert page.locator("#events tbody tr").first.inner_text().split("\t")[2] == "cancelled"


def test_the_run_page_shows_its_times_in_the_browsers_zone(
    jq: JobQueue, chromium: Browser, base_url: str
) -> None:
    rid = run_id("zone")
    jq.enqueue(jq.resolve_task("report").with_options(run_id=rid), 1)
    created = jq.get_run(rid).created_ms
    assert created is not None
    context = new_context(chromium, timezone_id="Asia/Kathmandu")  # UTC+05:45, no DST
    try:
        tab = context.new_page()
        tab.goto(f"{base_url}/run?id={rid}")
        first = tab.locator("time").first
        local = time.strftime("%Y-%m-%d %H:%M", time.gmtime(created / 1000 + 5 * 3600 + 2700))
        shown = first.inner_text()
        assert shown.startswith(local) and "Asia/Kat" in shown  # ICU spells it Katmandu
        assert (first.get_attribute("title") or "").endswith(" UTC")
    finally:
        context.close()


# -- every page: accessibility, and a phone's screen -------------------------------------------

AXE_RUN = """async ([failing, timeoutMs]) => {
  const late = new Promise((_, fail) =>
    setTimeout(() => fail(new Error(`axe did not finish within ${timeoutMs} ms`)), timeoutMs));
  const result = await Promise.race([axe.run(document, {resultTypes: ["violations"]}), late]);
  return result.violations.filter((v) => failing.includes(v.impact)).map((v) => ({
    id: v.id, impact: v.impact, help: v.help, helpUrl: v.helpUrl,
    nodes: v.nodes.map((n) => ({target: n.target.join(" "), html: n.html.slice(0, 160)})),
  }));
}"""


def described(violations: list[dict[str, Any]]) -> str:
    lines = []
    for v in violations:
        lines.append(f"{v['id']} ({v['impact']}): {v['help']} [{v['helpUrl']}]")
        lines.extend(f"    {n['target']}: {n['html']}" for n in v["nodes"][:10])
        if len(v["nodes"]) > 10:
            lines.append(f"    ... and {len(v['nodes']) - 10} more")
    return "\n".join(lines)


@pytest.mark.usefixtures("sample")
@pytest.mark.parametrize("name", PAGES)
def test_every_page_has_no_serious_or_critical_accessibility_violation(
    name: str, audited_page: Page, base_url: str
) -> None:
    open_page(audited_page, base_url, name)
    violations = audited_page.evaluate(AXE_RUN, [list(FAILING_IMPACTS), AXE_TIMEOUT_MS])
    assert not violations, f"axe on the {name} page ({audited_page.url}):\n" + described(violations)


@pytest.mark.usefixtures("sample")
@pytest.mark.parametrize("name", PAGES)
def test_every_page_fits_a_390px_screen_without_scrolling_sideways(
    name: str, phone_page: Page, base_url: str
) -> None:
    open_page(phone_page, base_url, name)
    width = phone_page.evaluate("document.documentElement.scrollWidth")
    assert width <= PHONE["width"] + 1, f"the {name} page is {width} px wide on a 390 px screen"


@pytest.mark.usefixtures("sample")
@pytest.mark.parametrize("name", PAGES)
def test_every_navigation_link_is_on_a_390px_screen(
    name: str, phone_page: Page, base_url: str
) -> None:
    open_page(phone_page, base_url, name)
    links = phone_page.locator("nav a")
    assert links.count() > 0
    off_screen = []
    for link in links.all():
        box = link.bounding_box()
        if box is None or not link.is_visible():
            off_screen.append(f"{link.inner_text()!r} (hidden)")
        elif box["x"] < 0 or box["x"] + box["width"] > PHONE["width"]:
            off_screen.append(
                f"{link.inner_text()!r} at x {box['x']:.0f}..{box['x'] + box['width']:.0f}"
            )
    assert not off_screen, f"on the {name} page, off a 390 px screen: " + ", ".join(off_screen)
