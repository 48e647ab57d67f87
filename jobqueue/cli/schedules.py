"""`jobqueue schedules`: recurring jobs from the terminal (list, show, add, pause, resume,
trigger, backfill, remove); `schedule` is the older, hidden name of the same group."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import click

from jobqueue.cli.common import (
    FiniteFloat,
    Group,
    State,
    anomaly_cell,
    echo_handle,
    json_arg,
    load_app,
    pass_state,
    warn_anomalies,
)
from jobqueue.cli.format import table, when
from jobqueue.cli.output import confirm, progress
from jobqueue.client.sync import JobQueue
from jobqueue.errors import CorruptData, OperationRefused, UnknownTask
from jobqueue.policy.cron import fire_times_between
from jobqueue.policy.timeutil import instant_to_ms
from jobqueue.recurring.definitions import (
    DEFAULT_MISFIRE,
    DEFAULT_OVERLAP,
    DEFAULT_TZ,
    MAX_BACKFILL,
    OVERLAP_POLICIES,
    refuse_future_end,
)
from jobqueue.recurring.info import ScheduleInfo
from jobqueue.store.keys import MAX_PARTITIONS

# Fire times per backfill call of `schedules backfill`: one progress step each.
BACKFILL_CHUNK = 500


@click.group(cls=Group, invoke_without_command=True)
@click.pass_context
def schedules(ctx: click.Context) -> None:
    """Recurring jobs: list (the default), show, add (upsert), pause, resume, trigger,
    backfill, remove; partitions (who owns which scheduler partition), repartition K."""
    if ctx.invoked_subcommand is None:
        ctx.invoke(schedules_list)


def _when_text(info: ScheduleInfo) -> str:
    d = info.definition
    every = f"every {d.every_ms / 1000:g}s" if d.every_ms is not None else ""
    return f"{d.cron if d.cron is not None else every} {d.tz}"


def _next_text(info: ScheduleInfo, now: int) -> str:
    """The next fire after now (its run may be created already: a lookahead early)."""
    if info.definition.paused:
        return "paused"
    around = info.fires_around(now)
    if around.next_ms is None:
        return "ended"
    return when(around.next_ms, now) + (", run created" if around.next_created else "")


def _last_text(info: ScheduleInfo, now: int) -> str:
    """The last fire at or before now whose run was created."""
    return when(info.fires_around(now).last_ms, now)


def _schedule_line(info: ScheduleInfo, now: int) -> str:
    """One line for what a mutating command did: enough to see its effect at a glance."""
    s = info.state
    return (
        f"{info.job_id} ({info.definition.task}, {_when_text(info)}): "
        f"{'' if info.definition.paused else 'next '}{_next_text(info, now)}; "
        f"fired {s.fired}, missed {s.missed}, "
        f"skipped {s.skipped}, dropped {s.dropped}"
    )


def _require_schedule(jq: JobQueue, job_id: str) -> ScheduleInfo:
    info = jq.get_schedule(job_id)
    if info is None:
        raise OperationRefused(f"no recurring job {job_id!r} (never added, or removed)")
    return info


@schedules.command("add")
@click.argument("job_id")
@click.argument("task")
@click.option("--cron", help="5 fields, 6 with seconds first, or an alias like @daily.")
@click.option("--every", type=FiniteFloat(0, min_open=True), help="Fixed interval in seconds.")
@click.option("--tz", default=DEFAULT_TZ, show_default=True)
@click.option("--args", "args_json", default="[]", help="Positional arguments, a JSON array.")
@click.option("--kwargs", "kwargs_json", default="{}", help="Keyword arguments, a JSON object.")
@click.option("--misfire", default=DEFAULT_MISFIRE, show_default=True)
@click.option(
    "--jitter", type=FiniteFloat(0), help="Jitter window in seconds (< the period)."
)
@click.option(
    "--overlap",
    default=DEFAULT_OVERLAP,
    show_default=True,
    help=", ".join(OVERLAP_POLICIES[:-1]) + f" or {OVERLAP_POLICIES[-1]}.",
)
@click.option("--queue")
@click.option("--max-attempts", type=click.IntRange(1), default=None)
@click.option(
    "--app",
    "app_spec",
    help="module:attribute of your JobQueue: TASK must be one of its tasks and the "
    "arguments must fit it (without it, neither is checked).",
)
@click.option("--json", "as_json", is_flag=True)
@pass_state
def schedule_add(
    state: State,
    job_id: str,
    task: str,
    cron: str | None,
    every: float | None,
    tz: str,
    args_json: str,
    kwargs_json: str,
    misfire: str,
    jitter: float | None,
    overlap: str,
    queue: str | None,
    max_attempts: int | None,
    app_spec: str | None,
    as_json: bool,
) -> None:
    """Create or update the recurring job JOB_ID running TASK (idempotent: an upsert).
    With --app, TASK and the arguments are checked against the app's tasks."""
    args = json_arg(args_json, "--args", list)
    kwargs = json_arg(kwargs_json, "--kwargs", dict)
    app = load_app(app_spec) if app_spec else None
    jq = state.jq(app)
    if app is not None and task not in jq.registry:
        raise UnknownTask(f"task {task!r} is not registered in {app_spec}")

    info = jq.schedule(
        job_id,
        task,
        cron=cron,
        every=every,
        tz=tz,
        args=args,
        kwargs=kwargs,
        misfire=misfire,
        jitter=jitter,
        overlap=overlap,
        queue=queue,
        max_attempts=max_attempts,
    )
    if as_json:
        click.echo(json.dumps(info.to_dict()))
    else:
        click.echo(f"scheduled {_schedule_line(info, jq.server_time_ms())}")
    if app is None:
        click.echo(
            f"note: task {task!r} and its arguments were not checked (no --app): a task no "
            "worker registers would have every fire's run handed back until it dies",
            err=True,
        )


@schedules.command("remove")
@click.argument("job_id")
@click.option("--yes", is_flag=True, help="Do not ask.")
@pass_state
def schedule_remove(state: State, job_id: str, yes: bool) -> None:
    """Remove a recurring job and its counters (runs already created stay).

    A job that is not there is refused (exit 1): a typo must not look like success."""
    jq = state.jq()
    try:
        info = _require_schedule(jq, job_id)
        what = f"fired {info.state.fired} times"
    except CorruptData as exc:
        # Removing is the way out of a definition that is not usable: allowed, said so.
        what = f"its stored definition is not usable: {exc}"
    confirm(f"remove recurring job {job_id!r} ({what})?", yes)
    if not jq.unschedule(job_id):
        raise OperationRefused(f"no recurring job {job_id!r} (removed meanwhile)")
    click.echo(f"removed {job_id}; runs it created stay")


@schedules.command("pause")
@click.argument("job_id")
@pass_state
def schedule_pause(state: State, job_id: str) -> None:
    """Stop firing a recurring job until resumed (idempotent)."""
    jq = state.jq()
    if _require_schedule(jq, job_id).definition.paused:
        click.echo(f"{job_id} is already paused (nothing to do)")
        return
    click.echo(f"paused {_schedule_line(jq.pause_schedule(job_id), jq.server_time_ms())}")


@schedules.command("resume")
@click.argument("job_id")
@pass_state
def schedule_resume(state: State, job_id: str) -> None:
    """Fire again from the next fire time; those missed while paused are not fired (backfill
    them if they matter). Idempotent."""
    jq = state.jq()
    info = _require_schedule(jq, job_id)
    if not info.definition.paused:
        click.echo(
            f"{job_id} is not paused (nothing to do): next {_next_text(info, jq.server_time_ms())}"
        )
        return
    click.echo(f"resumed {_schedule_line(jq.resume_schedule(job_id), jq.server_time_ms())}")


@schedules.command("trigger")
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True)
@pass_state
def schedule_trigger(state: State, job_id: str, as_json: bool) -> None:
    """Run a recurring job now, with its own run id (<job>@manual-<now>); its schedule and
    counters are untouched. Each call is a new manual run."""
    echo_handle(state.jq().trigger(job_id), as_json, ", due now")


def _cli_instant(text: str, what: str) -> datetime:
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise click.BadParameter(f"not an ISO 8601 instant: {text!r}", param_hint=what) from None
    if value.tzinfo is None:
        raise click.BadParameter(f"{text!r} has no time zone (add Z or +hh:mm)", param_hint=what)
    return value


def _ms_instant(ms: int) -> datetime:
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms)


def _backfill_ranges(
    info: ScheduleInfo, start: datetime, end: datetime
) -> Iterator[tuple[datetime, datetime, int]]:
    """[start, end] cut into back-to-back ranges of BACKFILL_CHUNK fire times each (ranges
    cover every instant, so no fire can fall between two), with their fire counts. Anything
    jobqueue.recurring.fires would refuse (too many fires, end before start) is one range: its
    backfill then raises the error it always did."""
    defn = info.definition
    start_ms, end_ms = instant_to_ms(start), instant_to_ms(end)
    fires = (
        fire_times_between(
            defn.schedule, start_ms - 1, end_ms, limit=MAX_BACKFILL + 1, anchor_ms=defn.start_ms
        )
        if end_ms >= start_ms
        else []
    )
    if not fires or len(fires) > MAX_BACKFILL:
        yield start, end, len(fires)
        return
    cuts = fires[BACKFILL_CHUNK::BACKFILL_CHUNK]
    lows = [start, *(_ms_instant(c) for c in cuts)]
    highs = [*(_ms_instant(c - 1) for c in cuts), end]
    counts = [BACKFILL_CHUNK] * len(cuts) + [len(fires) - BACKFILL_CHUNK * len(cuts)]
    yield from zip(lows, highs, counts, strict=True)


@schedules.command("backfill")
@click.argument("job_id")
@click.option("--start", "start_text", required=True, help="ISO 8601 instant with a zone.")
@click.option("--end", "end_text", required=True, help="ISO 8601 instant with a zone.")
@click.option("--json", "as_json", is_flag=True)
@pass_state
def schedule_backfill(
    state: State, job_id: str, start_text: str, end_text: str, as_json: bool
) -> None:
    """Create the runs of every fire time in [start, end], due now (idempotent: fire times
    that already have a run create nothing); END must not be after now. A progress bar on a
    terminal."""
    start, end = _cli_instant(start_text, "--start"), _cli_instant(end_text, "--end")
    jq = state.jq()
    info = _require_schedule(jq, job_id)
    # Checked before the first chunk: a refused backfill writes nothing at all.
    refuse_future_end(job_id, instant_to_ms(end), jq.server_time_ms())
    ranges = list(_backfill_ranges(info, start, end))
    fires = created = 0
    with progress(sum(n for _, _, n in ranges), f"backfilling {job_id}") as advance:
        for low, high, count in ranges:
            handles = jq.backfill(job_id, low, high)
            fires, created = fires + len(handles), created + sum(h.created for h in handles)
            advance(count)
    if as_json:
        click.echo(
            json.dumps({"fire_times": fires, "created": created, "existed": fires - created})
        )
    else:
        click.echo(f"{fires} fire times: {created} runs created, {fires - created} existed")


_SCHEDULE_HEADERS = [
    "JOB",
    "TASK",
    "QUEUE",
    "SCHEDULE",
    "MISFIRE",
    "OVERLAP",
    "JITTER",
    "NEXT FIRE (UTC)",
    "LAST FIRED (UTC)",
    "FIRED",
    "MISSED",
    "SKIPPED",
    "DROPPED",
]


@schedules.command("list")
@click.option("--limit", default=1000, show_default=True, type=click.IntRange(1, 1_000_000))
@click.option("--json", "as_json", is_flag=True)
@pass_state
def schedules_list(state: State, limit: int, as_json: bool) -> None:
    """Recurring jobs: schedule, policies, next and last fire, counters (missed by misfire
    policy, skipped by overlap policy, dropped by the fire-all cap)."""
    from jobqueue.ops.queries import all_anomalies
    from jobqueue.ops.queries import schedules as read_schedules

    jq = state.jq()
    infos = read_schedules(jq, limit=limit)
    warn_anomalies(all_anomalies(infos))
    if infos.truncated:
        click.echo(f"note: more than {len(infos):,} recurring jobs exist: only "
                   f"{len(infos):,} of them are shown (raise --limit)", err=True)
    now = jq.server_time_ms()
    if as_json:
        click.echo(json.dumps([_schedule_dict(i, now) for i in infos]))
        return
    if not infos:
        click.echo("no recurring jobs")
        return
    rows = [
        [
            i.job_id,
            i.definition.task,
            i.definition.queue,
            _when_text(i),
            i.definition.misfire,
            i.definition.overlap,
            f"{i.definition.jitter_ms / 1000:g}s",
            _next_text(i, now),
            _last_text(i, now),
            i.state.fired,
            i.state.missed,
            i.state.skipped,
            i.state.dropped,
        ]
        for i in infos
    ]
    headers = _SCHEDULE_HEADERS
    if any(i.anomalies for i in infos):
        rows = [[*row, anomaly_cell(i.anomalies)] for row, i in zip(rows, infos, strict=True)]
        headers = [*headers, "ANOMALY"]
    click.echo(table(rows, headers))


def _schedule_dict(info: ScheduleInfo, now: int) -> dict[str, Any]:
    """ScheduleInfo.to_dict (with the fires around now) plus the last fire a run was created
    for, in ms (to_dict has it only as text)."""
    return {**info.to_dict(now), "last_fire_ms": info.state.last_fire_ms}


@schedules.command("show")
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True)
@pass_state
def schedule_show(state: State, job_id: str, as_json: bool) -> None:
    """One recurring job: its definition, next and last fire, policies and counters."""
    jq = state.jq()
    info = _require_schedule(jq, job_id)
    warn_anomalies(info.anomalies)
    now = jq.server_time_ms()
    if as_json:
        click.echo(json.dumps(_schedule_dict(info, now)))
        return
    d, s = info.definition, info.state
    rows = [
        ("job", d.job_id),
        ("task", d.task),
        ("queue", d.queue),
        ("schedule", _when_text(info)),
        ("state", "paused" if d.paused else "active" if info.next_fire_ms else "ended"),
        ("next fire", _next_text(info, now)),
        ("last fired", _last_text(info, now)),
        ("created up to", when(s.last_fire_ms, now)),  # runs, a lookahead early
        ("misfire policy", d.misfire),
        ("overlap policy", d.overlap),
        ("jitter", f"{d.jitter_ms / 1000:g}s"),
        ("max attempts", str(d.max_attempts)),
        ("args", json.dumps(list(d.args))),
        ("kwargs", json.dumps(d.kwargs)),
        ("fired", str(s.fired)),
        ("missed", f"{s.missed} (misfire policy)"),
        ("skipped", f"{s.skipped} (overlap policy)"),
        ("dropped", f"{s.dropped} (fire-all cap)"),
        *(("anomaly", str(a)) for a in info.anomalies),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        click.echo(f"{key.ljust(width)}  {value}")


# The older group name: same commands (one dict), hidden from --help so the docs show one name.
schedule = Group(
    "schedule",
    commands=schedules.commands,
    hidden=True,
    invoke_without_command=True,
    callback=schedules.callback,
    help=schedules.help,
)


@schedules.command("partitions")
@click.option("--json", "as_json", is_flag=True)
@pass_state
def schedules_partitions(state: State, as_json: bool) -> None:
    """Who owns which scheduler partition (its lease and how long it has left, its jobs, its
    master on a cluster), and the schedulers running: what each owns, its lookahead and the
    creation rate it measured. A partition without an owner while schedulers run is named on
    stderr (its jobs do not fire until one takes it)."""
    from jobqueue.cli.format import duration
    from jobqueue.recurring.membership import read_members, read_owners

    jq = state.jq()
    keys = jq.recurring.all_keys()
    now = jq.server_time_ms()
    owners = read_owners(jq, keys)
    members = read_members(jq, now)
    found = [a for o in owners for a in o.anomalies] + members.anomalies
    warn_anomalies(found)
    live = [m for m in members if m.live]
    unowned = [o.partition for o in owners if not o.held(now)]
    if live and unowned:
        click.echo(
            f"warning: scheduler partition(s) {', '.join(map(str, unowned))} have no owner "
            f"while {len(live)} scheduler(s) run",
            err=True,
        )
    if as_json:
        click.echo(json.dumps({
            "now_ms": now,
            "partitions": [o.to_dict() for o in owners],
            "schedulers": [m.to_dict() for m in members],
        }))  # fmt: skip
        return
    cluster = any(o.node for o in owners)
    rows = [
        [
            o.partition,
            *([o.node] if cluster else []),
            o.jobs,
            o.owner or "-",
            ("-" if not o.owner else duration(o.until_ms - now) if o.held(now) else "expired"),
        ]
        for o in owners
    ]
    headers = ["PART", *(["MASTER"] if cluster else []), "JOBS", "OWNER", "LEASE LEFT"]
    click.echo(table(rows, headers))
    click.echo()
    if not members:
        click.echo("no scheduler registered")
        return
    rows = [
        [
            m.id,
            ",".join(map(str, m.partitions)) or "-",
            f"{m.lookahead_ms / 1000:g}s",
            "-" if m.rate is None else f"{m.rate:,.0f}/s",
            when(m.seen_ms, now),
            "ok" if m.live else "STALE",
        ]
        for m in members
    ]
    headers = ["SCHEDULER", "PARTITIONS", "LOOKAHEAD", "RATE", "LAST SEEN", "STATUS"]
    click.echo(table(rows, headers))


@schedules.command("repartition")
@click.argument("count", type=click.IntRange(1, MAX_PARTITIONS))
@click.option("--yes", is_flag=True, help="Do not ask.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_state
def schedules_repartition(state: State, count: int, yes: bool, as_json: bool) -> None:
    """Change the scheduler partition count K to COUNT: move every recurring job to its
    partition under COUNT (spread evenly over the slots), then record it. Refused while
    schedulers run (stop them first); safe to re-run after an interruption (it finishes the
    move). On a cluster, a multiple of the master count spreads the jobs evenly (4 x the
    masters is the default at install)."""
    from jobqueue.recurring import repartition as srp

    jq = state.jq()
    before = srp.plan(jq, count)
    if not yes and not click.confirm(
        f"{before.describe()}\nstop every scheduler first, and deploy them with no "
        "--partitions (or the new count) afterwards. Move now?",
        err=True,
    ):
        click.echo("error: not confirmed: nothing moved", err=True)
        raise click.exceptions.Exit(1)
    with progress(before.jobs, "moving recurring jobs") as advance:
        report = srp.repartition(jq, count, advance=advance)
    if as_json:
        click.echo(json.dumps(report.to_dict()))
        return
    click.echo(f"scheduler partitions: {report.old} -> {report.new}")
    click.echo(f"moved {report.moved:,} recurring jobs; {report.stayed:,} were already in place")
    if report.late:
        click.echo(
            f"{report.late:,} jobs were written during the move and moved too: is a client "
            "still writing schedules with the old count?"
        )
    click.echo(f"recorded {report.new} scheduler partitions in {report.seconds:.2f} s")
