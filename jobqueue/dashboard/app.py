"""The dashboard: a Starlette app over the CLI's data functions (``jobqueue.queries`` and the
``JobQueue`` client), rendered server-side with Jinja2 (autoescape on) and SVG charts.

Pages are GETs with no side effect; every change is a POST to ``/actions/<name>``, one route,
so no action can skip the CSRF check. Handlers are plain functions run in Starlette's thread
pool: the Redis client is synchronous and thread-safe. Besides the pages, the app runs one
background task, the sampler (``sampler.py``), which writes the history of the queues' gauges
(``jobqueue.ops.gauges``) that the charts read.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlencode

import jinja2
import redis
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from jobqueue.client.groups import busiest
from jobqueue.client.sync import JobQueue
from jobqueue.dashboard import overview
from jobqueue.dashboard.flow_drawing import draw
from jobqueue.dashboard.sampler import DEFAULT_SAMPLE_EVERY_S, Sampler, StartsSampler
from jobqueue.dashboard.security import (
    CSRF_FIELD,
    SESSION_COOKIE,
    AuthGate,
    Credentials,
    Csrf,
    ReadOnlyGate,
)
from jobqueue.errors import (
    ConfigError,
    ConnectionFailed,
    InvalidRunId,
    JobQueueError,
    OperationRefused,
    UnknownQueue,
)
from jobqueue.models import STATES, Run, split_entry
from jobqueue.ops import flow_queries, gauges, listing, queries, server_info
from jobqueue.policy.timeutil import abs_time, duration, instants_shown, relative, when_to_ms
from jobqueue.store.events import KINDS

HERE = Path(__file__).parent
FLASH_COOKIE = "jq_flash"
MAX_FORM_BYTES = 256 * 1024
# The most groups a queue's page shows (those with the most runs waiting and running); it
# says how many more there are (`jobqueue groups list` lists every one).
GROUPS_SHOWN = 200
# One script, ours (static/live.js: live updates from the event logs); every page works
# without it. Framing is refused (clickjacking on buttons).
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'self'; img-src 'self' data:; "
    "script-src 'self'; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


@dataclass
class Settings:
    jq: JobQueue
    csrf: Csrf
    templates: jinja2.Environment
    read_only: bool = False  # no action buttons; every change refused (ReadOnlyGate)


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,  # run ids, payloads and errors come from users
        undefined=jinja2.StrictUndefined,
    )
    env.filters["abs_time"] = abs_time
    env.filters["duration"] = duration
    env.filters["iso"] = _iso
    env.filters["q"] = lambda s: quote(str(s), safe="")
    env.filters["pretty_json"] = _pretty_json
    return env


def _iso(ms: int | None) -> str:
    """An instant for a <time datetime>: live.js shows it in the browser's own zone."""
    if ms is None:
        return ""
    try:
        return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")
    except (OverflowError, OSError, ValueError):
        return ""  # a time no date can show: the page shows the number (an anomaly)


def _pretty_json(text: str | None) -> str:
    if not text:
        return "-"
    try:
        return json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    except ValueError:
        return text


def _settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def _root(request: Request) -> str:
    """The path the dashboard is mounted under ('' at the top; '/jobs' when an app mounts it
    there): every link, form and redirect starts with it."""
    root: str = request.scope.get("root_path", "")
    return root.rstrip("/")


def render(request: Request, name: str, status_code: int = 200, **context: Any) -> Response:
    s = _settings(request)
    session = request.cookies.get(SESSION_COOKIE)
    new_session = session is None
    if session is None:
        session = Csrf.new_session()
    flash = unquote(request.cookies.get(FLASH_COOKIE, ""))
    now = context.pop("now", None) or s.jq.server_time_ms()
    # The page follows the event logs from where they were as it was read (static/live.js).
    live = context.pop("live", None)
    live_url = ""
    if live is not None:
        try:
            cursor = s.jq.events(live.get("queue"), run_id=live.get("run")).start()
        except JobQueueError:
            cursor = ""
        params = {k: v for k, v in {**live, "since": cursor}.items() if v}
        live_url = _root(request) + "/events/stream?" + urlencode(params)
    # Foreign or corrupt data the page's reads met: listed at the top, rows marked.
    anomalies = context.pop("anomalies", [])
    body = s.templates.get_template(name).render(
        request=request,
        csrf_field=CSRF_FIELD,
        csrf_token=s.csrf.token_for(session),
        flash=flash,
        now=now,
        rel=lambda ms: relative(ms, now),
        states=STATES,
        anomalies=anomalies,
        root=_root(request),
        live_url=live_url,
        read_only=s.read_only,
        **context,
    )
    response = HTMLResponse(body, status_code=status_code)
    if new_session:
        response.set_cookie(SESSION_COOKIE, session, httponly=True, samesite="strict")
    if flash:
        response.delete_cookie(FLASH_COOKIE)
    return response


# -- pages -----------------------------------------------------------------------------------


def home_page(request: Request) -> Response:
    """Totals over every queue, and what the Redis server (each master) says of itself."""
    jq = _settings(request).jq
    per_partition = queries.stats(jq)
    return render(
        request,
        "home.html",
        overall=overview.overall(per_partition),
        queues=len(queries.queue_totals(per_partition)),
        servers=server_info.servers(jq),
        anomalies=queries.all_anomalies(per_partition),
        live={},
    )


def queues_page(request: Request) -> Response:
    """Every queue in a table; the charts of the last hour for those that did something in
    it (an idle queue's are on its own page, a click away)."""
    jq = _settings(request).jq
    now = jq.server_time_ms()
    per_partition = queries.stats(jq)
    totals = queries.queue_totals(per_partition)
    flowing = queries.throughput(jq, now_ms=now)
    flows = {t.queue: t for t in flowing}
    kept = gauges.history(jq, [t.queue for t in totals], gauges.MINUTES, now)
    charts, idle = [], []
    for t, h in zip(totals, kept, strict=True):
        if overview.is_active(t, flows.get(t.queue), h.points):
            charts.append({"queue": t.queue,
                           **overview.hour_charts(t, now, flows.get(t.queue), h.points)})
        else:
            idle.append(t.queue)
    return render(
        request,
        "queues.html",
        now=now,
        totals=totals,
        charts=charts,
        idle=idle,
        anomalies=queries.all_anomalies(per_partition, flowing, kept),
        live={},
    )


def queue_page(request: Request) -> Response:
    """One queue: its row, its groups (fair shares), its charts of the last hour and of the
    last week."""
    jq = _settings(request).jq
    name = request.query_params.get("name", "")
    if not name:
        return PlainTextResponse("name the queue: /queue?name=Q", 400)
    now = jq.server_time_ms()
    per_partition = queries.stats(jq, name)  # an unknown queue: 404; a malformed name: 400
    totals = queries.queue_totals(per_partition)
    if not totals:  # its partition count is not usable: the anomaly says why
        return render(request, "missing.html", status_code=404, what=f"queue {name!r}",
                      why="its partition count cannot be read",
                      anomalies=queries.all_anomalies(per_partition))  # fmt: skip
    (t,) = totals
    flowing = queries.throughput(jq, name, now_ms=now)
    minutes = gauges.history(jq, [name], gauges.MINUTES, now)
    hours = gauges.history(jq, [name], gauges.HOURS, now)
    groups = jq.groups(name)  # this queue's only: a page reads no other queue's groups
    shown, left_out = busiest(groups, GROUPS_SHOWN)
    return render(
        request,
        "queue.html",
        now=now,
        t=t,
        fair=jq.fair_shares(name),
        groups=shown,
        groups_left_out=len(left_out),
        hour=overview.hour_charts(t, now, flowing[0] if flowing else None, minutes[0].points),
        week=overview.week_charts(name, now, hours[0].points),
        anomalies=queries.all_anomalies(per_partition, flowing, minutes, hours, groups),
        live={"queue": name},
    )


def leases_page(request: Request) -> Response:
    p = request.query_params
    found = queries.leases(
        _settings(request).jq,
        p.get("queue") or None,
        expired_only=p.get("expired") == "1",
        worker=p.get("worker") or None,
        limit=500,
    )
    return render(
        request, "leases.html", leases=found, params=p, anomalies=queries.all_anomalies(found),
        live={"queue": p.get("queue") or None},
    )


PAGE_SIZES = (25, 50, 100, 500)
# The filters a listing's URL and a bulk action's form carry (the CLI's options).
FILTER_FIELDS = ("state", "queue", "task", "job", "q", "error", "since", "until",
                 "since_ms", "until_ms", "order")


def _run_query(jq: JobQueue, p: Any, state: str | None = None) -> listing.RunQuery:
    """The listing a page's parameters (or a bulk form's fields) ask for; ConfigError (a 400)
    names a bad one. ``since``/``until`` take what the CLI's do (10m, 2h, an ISO time);
    ``since_ms``/``until_ms`` are those resolved, as a confirmation form carries them."""
    def instant(name: str) -> int | None:
        exact = p.get(f"{name}_ms") or ""
        if exact:
            if not (exact.isascii() and exact.isdigit()) or len(exact) > 16:
                raise ConfigError(f"{name}_ms must be a time in ms")
            return int(exact)
        text = (p.get(name) or "").strip()
        return when_to_ms(text, jq.server_time_ms(), name) if text else None

    chosen = state or p.get("state") or None
    if chosen is not None and chosen not in STATES:
        raise ConfigError(f"unknown state {chosen!r}")
    return listing.RunQuery(
        state=chosen,
        queue=p.get("queue") or None,
        task=p.get("task") or None,
        job=p.get("job") or None,
        contains=(p.get("q") or "").strip() or None,
        error=p.get("error") or None,
        since_ms=instant("since"),
        until_ms=instant("until"),
        order=p.get("order") or None,
    )


def _limit(p: Any, default: int = 50) -> int:
    try:
        return max(1, min(1000, int(p.get("limit") or default)))
    except ValueError:
        raise ConfigError("limit must be a number") from None


def _listing(request: Request, path: str, state: str | None = None) -> dict[str, Any]:
    """A page of a run listing, the links to the next and first pages (every filter kept),
    and the filter itself, for the bulk actions' forms."""
    jq = _settings(request).jq
    p = request.query_params
    query = _run_query(jq, p, state)
    page = listing.runs_page(jq, query, cursor=p.get("cursor") or None, limit=_limit(p))
    kept = [(k, v) for k, v in p.multi_items() if k != "cursor" and v]
    here = _root(request) + path
    return {
        "page": page,
        "runs": page,
        "params": p,
        "query": query,
        "first_url": here + ("?" + urlencode(kept) if kept else "") if p.get("cursor") else "",
        "next_url": here + "?" + urlencode([*kept, ("cursor", page.next_cursor)])
        if page.next_cursor else "",
        "filters": [(k, v) for k, v in kept if k in FILTER_FIELDS],
        "here": here + ("?" + urlencode(p.multi_items()) if p else ""),
        "page_sizes": PAGE_SIZES,
        "queues": sorted(jq.queues()),
        "anomalies": list(page.anomalies) + queries.all_anomalies(list(page)),
        "live": {"queue": query.queue},
    }


def runs_page(request: Request) -> Response:
    jq = _settings(request).jq
    search = request.query_params.get("q", "").strip()
    if search and not request.query_params.get("cursor"):
        try:
            exact = jq.find_run(search, request.query_params.get("queue") or None)
        except InvalidRunId:  # no run can have that id: it is a prefix to look for
            exact = None
        if exact is not None:
            target = f"/run?id={quote(exact.run_id, safe='')}&queue={quote(exact.queue)}"
            return RedirectResponse(_root(request) + target, status_code=303)
    return render(request, "runs.html", search=search, **_listing(request, "/runs"))


def run_page(request: Request) -> Response:
    jq = _settings(request).jq
    run_id = request.query_params.get("id", "")
    run = jq.find_run(run_id, request.query_params.get("queue") or None) if run_id else None
    if run is None:
        return render(request, "missing.html", status_code=404, what=f"run {run_id!r}")
    # The run's story as `jobqueue show` tells it (creation, the latest claim and a success
    # come from the record), each failed attempt with its traceback, instants as times.
    kept: dict[tuple[int | None, str], str] = {}
    for entry in run.history:
        line, tb = split_entry(entry)
        stamp, _, text = line.partition(" ")
        # isdigit() alone takes "²", which int() refuses: a foreign line is shown whole.
        ok = stamp.isascii() and stamp.isdigit()
        if tb is not None:
            kept[(int(stamp) if ok else None, text if ok else line)] = tb
    history = []
    previous: int | None = None
    for ms, text in run.timeline():
        # How long after the entry before: how long each attempt waited and ran.
        since = ms - previous if ms is not None and previous is not None else None
        history.append(
            (ms, instants_shown(text, lambda t: abs_time(t) + " UTC"), kept.get((ms, text)),
             since)
        )
        previous = ms if ms is not None else previous
    return render(request, "run.html", run=run, history=history, anomalies=list(run.anomalies),
                  live={"run": run.run_id, "queue": run.queue})


def flows_page(request: Request) -> Response:
    p = request.query_params
    found = flow_queries.flows(_settings(request).jq, p.get("queue") or None,
                               limit=max(1, min(1000, _limit(p, 20))))
    return render(request, "flows.html", flows=found, anomalies=queries.all_anomalies(found),
                  live={})


def flow_page(request: Request) -> Response:
    flow_id = request.query_params.get("id", "")
    detail = flow_queries.flow(_settings(request).jq, flow_id) if flow_id else None
    if detail is None:
        return render(request, "missing.html", status_code=404, what=f"flow {flow_id!r}")
    waits: dict[str, list[str]] = {}
    for e in detail.edges:
        waits.setdefault(e.waiting, []).append(e.dependency)
    return render(request, "flow.html", flow=detail, drawing=draw(detail.runs, detail.edges),
                  waits=waits, anomalies=list(detail.summary.anomalies), live={})


def schedules_page(request: Request) -> Response:
    found = queries.schedules(_settings(request).jq)
    return render(
        request, "schedules.html", schedules=found, anomalies=queries.all_anomalies(found)
    )


def dead_page(request: Request) -> Response:
    return render(request, "dead.html", **_listing(request, "/dead", "dead"))


WORKER_RUNS_SHOWN = 5  # runs named per worker; the rest are a link to its leases


def workers_page(request: Request) -> Response:
    """The registry, each worker with the runs it holds now (from the leases, 1,000 at most
    read: a worker past them shows its in-flight count and a link to its leases)."""
    jq = _settings(request).jq
    found = queries.workers(jq)
    held = queries.leases(jq, limit=1000)
    by_owner: dict[str, list[queries.Lease]] = {}
    for lease in held:
        by_owner.setdefault(lease.owner, []).append(lease)
    return render(request, "workers.html", workers=found, held=by_owner,
                  shown=WORKER_RUNS_SHOWN,
                  anomalies=queries.all_anomalies(found, held), live={})


def events_page(request: Request) -> Response:
    """The newest events (of a queue, a run, a kind); live.js adds the next as they come."""
    jq = _settings(request).jq
    p = request.query_params
    queue, run_id, kind = p.get("queue") or None, p.get("run") or None, p.get("kind") or None
    if kind is not None and kind not in KINDS:
        return PlainTextResponse(f"unknown event kind {kind!r}", 400)
    try:
        limit = max(1, min(1000, int(p.get("limit") or 100)))
    except ValueError:
        return PlainTextResponse("limit must be a number", 400)
    shown = jq.recent_events(queue, limit=limit, run_id=run_id, kinds=[kind] if kind else None)
    live = {"queue": queue, "run": run_id, "kind": kind}
    return render(request, "events.html", events=list(reversed(shown)), params=p,
                  kinds=KINDS, queues=sorted(jq.queues()), anomalies=shown.anomalies, live=live)


STREAM_S = 60.0  # an event stream ends after this; the browser comes back (Last-Event-ID)
KEEPALIVE_S = 15.0


async def events_stream(request: Request) -> Response:
    """Server-sent events: each event of the logs (a queue's, a run's, a kind's), its ``id``
    the cursor to resume right after it, which the browser sends back as Last-Event-ID when
    it reconnects (the stream ends after STREAM_S, so no connection stays open for ever)."""
    jq = _settings(request).jq
    p = request.query_params
    queue, run_id, kind = p.get("queue") or None, p.get("run") or None, p.get("kind") or None
    if kind is not None and kind not in KINDS:
        return PlainTextResponse(f"unknown event kind {kind!r}", 400)
    since = request.headers.get("last-event-id") or p.get("since") or None
    stream = jq.events(queue, since=since, run_id=run_id, kinds=[kind] if kind else None)
    await run_in_threadpool(stream.start)  # bad input is refused here, before any byte
    length = request.app.state.stream_s

    async def body() -> AsyncIterator[str]:
        yield "retry: 1000\n\n"
        end = asyncio.get_running_loop().time() + length
        quiet = 0.0
        while asyncio.get_running_loop().time() < end:
            if await request.is_disconnected():
                return
            try:
                # (Of every queue while none exists, a read waits, then looks for queues.)
                batch = await run_in_threadpool(stream.read_batch)
            except (JobQueueError, redis.exceptions.RedisError):
                return  # the browser comes back in a second, from its last id
            for ev in batch:
                yield f"id: {ev.cursor}\ndata: {json.dumps(ev.to_dict(), default=str)}\n\n"
            quiet = 0.0 if batch else quiet + stream.block_s
            if quiet >= KEEPALIVE_S:
                quiet = 0.0
                yield ": keepalive\n\n"

    return StreamingResponse(body(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})


# -- actions ---------------------------------------------------------------------------------

Form = list[tuple[str, str]]


def _one(form: Form, name: str) -> str:
    for key, value in form:
        if key == name and value:
            return value
    raise ValueError(f"missing {name}")


def _queue(form: Form) -> str | None:
    return next((v for k, v in form if k == "queue" and v), None)


def _retry(jq: JobQueue, form: Form) -> str:
    ids = [v for k, v in form if k == "run_id" and v]
    if not ids:
        return "nothing selected"
    done, refused = 0, []
    for run_id in ids:
        try:
            # A done run's button says "run again": pressing it (a CSRF-checked POST) is the
            # explicit ask that the API's force=True stands for.
            jq.requeue(run_id, queue=_queue(form), force=True)
            done += 1
        except JobQueueError as exc:
            refused.append(str(exc))
    return f"retried {done} run(s)" + (f"; refused: {'; '.join(refused)}" if refused else "")


def _purge(jq: JobQueue, form: Form) -> str:
    ids = [v for k, v in form if k == "run_id" and v]
    # Only runs still dead are deleted, as by `jobqueue dead purge` (the same client call).
    purged = jq.purge_dead(ids, _queue(form))
    return f"purged {purged} of {len(ids)} dead run(s)"


def _cancel(jq: JobQueue, form: Form) -> str:
    run_id = _one(form, "run_id")
    was = jq.cancel(run_id, queue=_queue(form), reason="cancelled from the dashboard")
    return f"cancelled {run_id} (was {was})"


def _pause(jq: JobQueue, form: Form) -> str:
    return f"paused {jq.pause_schedule(_one(form, 'job_id')).job_id}"


def _resume(jq: JobQueue, form: Form) -> str:
    return f"resumed {jq.resume_schedule(_one(form, 'job_id')).job_id}"


def _pause_queue(jq: JobQueue, form: Form) -> str:
    queue = _one(form, "queue")
    return f"paused queue {queue}" if jq.pause_queue(queue) else f"queue {queue} was paused"


def _resume_queue(jq: JobQueue, form: Form) -> str:
    queue = _one(form, "queue")
    return f"resumed queue {queue}" if jq.resume_queue(queue) else f"queue {queue} was running"


def _trigger(jq: JobQueue, form: Form) -> str:
    handle = jq.trigger(_one(form, "job_id"))
    return f"created {handle.run_id} in queue {handle.queue}"


# Bulk actions on a filter: each acts on the runs the filter lists whose state allows it.
BULK_OPS: dict[str, tuple[frozenset[str], str]] = {
    "retry": (frozenset({"dead", "cancelled"}), "retry"),
    "cancel": (frozenset({"pending", "waiting", "running"}), "cancel"),
    "purge": (frozenset({"dead"}), "delete for good"),
}
MAX_BULK = 100_000  # runs one bulk action takes at most (a narrower filter for more)


def _bulk_targets(jq: JobQueue, form: Form) -> tuple[str, list[Run], listing.RunQuery]:
    """The bulk action asked for and the runs it would act on now: every page of its
    filter, those in a state it applies to."""
    op = _one(form, "op")
    if op not in BULK_OPS:
        raise ValueError(f"unknown bulk action {op!r}")
    allowed = BULK_OPS[op][0]
    query = _run_query(jq, dict(form))
    # Only the listings of the states the action applies to are read (a retry of "every
    # state" never reads the pending or running indexes).
    states = [query.state] if query.state else sorted(allowed)
    targets = []
    for state in states:
        # (the order matters not here, and running runs have one only)
        for run in listing.iter_runs(jq, replace(query, state=state, order=None),
                                     page_size=500):
            if run.state in allowed:
                targets.append(run)
                if len(targets) > MAX_BULK:
                    raise OperationRefused(
                        f"more than {MAX_BULK:,} runs match: narrow the filter, or use the CLI"
                    )
    return op, targets, query


def _bulk(jq: JobQueue, form: Form) -> str:
    op, targets, _ = _bulk_targets(jq, form)
    done, refused = 0, 0
    if op == "retry":
        for start in range(0, len(targets), 500):
            chunk = [(r.run_id, jq.keys_for(r.queue, r.run_id))
                     for r in targets[start : start + 500]]
            for changed, _previous in jq.requeue_located(chunk):
                done, refused = done + changed, refused + (not changed)
    elif op == "cancel":
        for r in targets:
            try:
                jq.cancel(r.run_id, queue=r.queue, reason="cancelled from the dashboard")
                done += 1
            except JobQueueError:
                refused += 1  # finished meanwhile
    else:
        by_queue: dict[str, list[str]] = {}
        for r in targets:
            by_queue.setdefault(r.queue, []).append(r.run_id)
        for queue, ids in by_queue.items():
            purged = jq.purge_dead(ids, queue)
            done, refused = done + purged, refused + len(ids) - purged
    verb = {"retry": "retried", "cancel": "cancelled", "purge": "deleted"}[op]
    message = f"{verb} {done:,} of {len(targets):,} matching run(s)"
    return message + (f"; {refused:,} had changed state meanwhile" if refused else "")


# Actions that delete for good: the first POST only shows what would go; the second, with
# confirm=yes, does it.
CONFIRMED_ACTIONS = frozenset({"purge"})

ACTIONS: dict[str, Callable[[JobQueue, Form], str]] = {
    "retry": _retry,
    "purge": _purge,
    "cancel": _cancel,
    "pause": _pause,
    "resume": _resume,
    "pause-queue": _pause_queue,
    "resume-queue": _resume_queue,
    "trigger": _trigger,
    "bulk": _bulk,
}


def _same_origin(request: Request) -> bool:
    """A browser's Origin, when sent, must be this very host (defence in depth beside the
    token)."""
    origin = request.headers.get("origin")
    if origin is None or origin == "null":
        return origin is None
    host = request.headers.get("host", "")
    return origin.split("://", 1)[-1] == host


def _back(form: Form, default: str) -> str:
    """Where to go after the action: a local path only (never an open redirect)."""
    target = next((v for k, v in form if k == "next"), default)
    ok = target.startswith("/") and not target.startswith("//") and "\\" not in target
    return target if ok else default


async def action(request: Request) -> Response:
    s = _settings(request)
    name = request.path_params["name"]
    if request.headers.get("content-type", "").split(";")[0].strip() != (
        "application/x-www-form-urlencoded"
    ):
        return PlainTextResponse("forms only", 415)
    body = await request.body()
    if len(body) > MAX_FORM_BYTES:
        return PlainTextResponse("form too large", 413)
    form = parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True)
    submitted = next((v for k, v in form if k == CSRF_FIELD), None)
    if not s.csrf.valid(request.cookies.get(SESSION_COOKIE), submitted) or not _same_origin(
        request
    ):
        return PlainTextResponse("CSRF check failed: reload the page and try again", 403)
    handler = ACTIONS.get(name)
    if handler is None:
        return PlainTextResponse(f"unknown action {name!r}", 404)
    if name == "bulk" and ("confirm", "yes") not in form:
        # Every bulk action is confirmed, on a page that says how many runs it takes now;
        # the times of the filter are fixed there, so "10m" means the same on both POSTs.
        try:
            op, targets, query = await run_in_threadpool(_bulk_targets, s.jq, form)
        except (JobQueueError, ValueError) as exc:
            return PlainTextResponse(f"bulk refused: {exc}"[:300], 400)
        fields = [(k, v) for k, v in form
                  if k in FILTER_FIELDS and k not in ("since", "until") and v]
        fields += [(f"{k}_ms", str(v)) for k, v in
                   (("since", query.since_ms), ("until", query.until_ms)) if v is not None]
        fields += [("op", op), ("next", _back(form, _root(request) + "/runs"))]
        return render(request, "confirm_bulk.html", op=op, what=BULK_OPS[op][1],
                      allowed=sorted(BULK_OPS[op][0]), ids=[r.run_id for r in targets[:50]],
                      count=len(targets), fields=fields,
                      back=_back(form, _root(request) + "/runs"))
    if name in CONFIRMED_ACTIONS and ("confirm", "yes") not in form:
        # Destructive: a page that says what will go, whose button re-posts with confirm=yes
        # (no JavaScript dialog; `jobqueue dead purge` asks for --yes the same way).
        ids = [v for k, v in form if k == "run_id" and v]
        kept = [(k, v) for k, v in form if k in ("run_id", "queue", "next")]
        return render(request, "confirm.html", action=name, ids=ids, fields=kept,
                      back=_back(form, _root(request) + "/dead"))  # fmt: skip
    try:
        message = await run_in_threadpool(handler, s.jq, form)
    except (JobQueueError, ValueError) as exc:
        message = f"{name} refused: {exc}"
    response = RedirectResponse(_back(form, _root(request) + "/"), status_code=303)
    response.set_cookie(FLASH_COOKIE, quote(message[:500]), httponly=True, samesite="strict")
    return response


# -- the app ---------------------------------------------------------------------------------


async def _unknown_queue(request: Request, exc: Exception) -> Response:
    """A ?queue= naming no queue: a 404 that says so, not an empty page."""
    return PlainTextResponse(str(exc)[:300], 404)


async def _bad_input(request: Request, exc: Exception) -> Response:
    """A malformed ?queue= or run id: a 400 that says what is wrong, as the CLI's exit 2."""
    return PlainTextResponse(str(exc)[:300], 400)


async def _refused(request: Request, exc: Exception) -> Response:
    """A read that cannot answer as asked (e.g. a run id in several queues): say why."""
    return PlainTextResponse(str(exc)[:300], 409)


async def _unavailable(request: Request, exc: Exception) -> Response:
    """Redis down or refusing: one line and 503, not a traceback page."""
    return PlainTextResponse(f"Redis unavailable: {type(exc).__name__}: {exc}"[:300], 503)


async def _add_headers(request: Request, call_next: Any) -> Response:
    response: Response = await call_next(request)
    for key, value in SECURITY_HEADERS.items():
        response.headers.setdefault(key, value)
    return response


def create_app(
    jq: JobQueue,
    *,
    credentials: Credentials | None = None,
    sample_every_s: float | None = DEFAULT_SAMPLE_EVERY_S,
    allowed_hosts: list[str] | None = None,
    secret: bytes | None = None,
    events_stream_s: float = STREAM_S,
    read_only: bool = False,
) -> Starlette:
    """The dashboard for ``jq``. ``allowed_hosts`` (Host header check) guards a loopback
    dashboard against DNS rebinding; ``secret`` signs CSRF tokens (random if not given);
    ``events_stream_s``: how long one live-update stream lasts before the browser reconnects
    (from the last event it got); ``sample_every_s``: seconds between the history sampler's
    looks (None: this app samples nothing, and shows what other dashboards recorded);
    ``read_only``: no action buttons, and every request but a GET or a HEAD (every action)
    is refused with a 403.

    The sampler starts with the app's first request, so it runs where the host never runs
    the app's lifespan (mounted in Starlette, FastAPI or a Django ASGI router); it also starts
    at the lifespan's startup when one runs, and stops at its shutdown."""
    secret = secret or secrets.token_bytes(32)
    sampler = None if sample_every_s is None else Sampler(jq, every_s=sample_every_s)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if sampler is not None:
            sampler.ensure_running()
        try:
            yield
        finally:
            if sampler is not None:
                await sampler.stop()

    from starlette.middleware.base import BaseHTTPMiddleware

    middleware = []
    if sampler is not None:  # outermost: every request that reaches the app starts it
        middleware.append(Middleware(StartsSampler, sampler=sampler))
    middleware.append(Middleware(BaseHTTPMiddleware, dispatch=_add_headers))
    if read_only:  # before anything else looks at a change: refused, whoever asks
        middleware.append(Middleware(ReadOnlyGate))
    if allowed_hosts:
        middleware.append(Middleware(TrustedHostMiddleware, allowed_hosts=allowed_hosts))
    if credentials is not None and credentials.required:
        middleware.append(Middleware(AuthGate, credentials=credentials, secret=secret))
    app = Starlette(
        routes=[
            Route("/", home_page),
            Route("/queues", queues_page),
            Route("/queue", queue_page),
            Route("/leases", leases_page),
            Route("/runs", runs_page),
            Route("/run", run_page),
            Route("/flows", flows_page),
            Route("/flow", flow_page),
            Route("/schedules", schedules_page),
            Route("/dead", dead_page),
            Route("/workers", workers_page),
            Route("/events", events_page),
            Route("/events/stream", events_stream),
            Route("/actions/{name}", action, methods=["POST"]),
            Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
        ],
        middleware=middleware,
        exception_handlers={
            redis.exceptions.RedisError: _unavailable,
            ConnectionFailed: _unavailable,
            UnknownQueue: _unknown_queue,
            OperationRefused: _refused,
            ConfigError: _bad_input,
            InvalidRunId: _bad_input,
        },
        lifespan=lifespan,
    )
    app.state.settings = Settings(jq, Csrf(secret), _environment(), read_only)
    app.state.stream_s = events_stream_s
    return app
