"""``jobqueue enqueue``: one run of a task from its options, or one per line of a JSON Lines
file (validated whole first, then written in chunks, with a progress bar)."""

from __future__ import annotations

import json
import sys
from datetime import datetime
from typing import IO

import click

from jobqueue.cli.common import (
    EXIT_INTERRUPTED,
    FiniteFloat,
    State,
    echo_handle,
    json_arg,
    load_app,
    pass_state,
)
from jobqueue.cli.output import progress
from jobqueue.client.base import Request
from jobqueue.client.sync import JobQueue
from jobqueue.errors import InvalidRunId, JobQueueError, PayloadError, UnknownTask
from jobqueue.models import PRIORITY_MAX
from jobqueue.tasks import Dedupe

# Runs per enqueue_many call of `enqueue --from-file` (enqueue_many pipelines its script
# calls): one progress step each.
ENQUEUE_CHUNK = 1000


@click.command()
@click.argument("task")
@click.option("--args", "args_json", default="[]", help="Positional arguments, a JSON array.")
@click.option("--kwargs", "kwargs_json", default="{}", help="Keyword arguments, a JSON object.")
@click.option("--run-id", help="Idempotency key: a second enqueue with it creates nothing.")
@click.option("--delay", type=FiniteFloat(0), help="Seconds from now (server clock).")
@click.option("--at", "at_text", help="ISO 8601 instant with a zone, e.g. 2026-12-01T09:00Z.")
@click.option("--queue", help="Queue (default: the task's, else 'default').")
@click.option("--max-attempts", type=click.IntRange(1), default=None)
@click.option(
    "--priority",
    type=click.IntRange(0, PRIORITY_MAX),
    default=None,
    help=f"0 (the default) to {PRIORITY_MAX}: among due runs, higher is claimed first.",
)
@click.option(
    "--dedupe-key",
    help="At most one run per key in the queue at a time (see --dedupe-mode, --dedupe-ttl).",
)
@click.option(
    "--dedupe-mode",
    type=click.Choice(["throttle", "debounce"]),
    default="throttle",
    show_default=True,
    help="throttle: drop this run while another run owns the key; debounce: give that run, "
    "still pending, these arguments and due time.",
)
@click.option(
    "--dedupe-ttl",
    type=FiniteFloat(0.001),
    help="Seconds a run owns the key after its enqueue (default: until its first claim).",
)
@click.option(
    "--limit-key",
    help="The key the queue's per-key caps and rates count this run under, e.g. customer:42.",
)
@click.option("--app", "app_spec", help="module:attribute, to use its task options.")
@click.option(
    "--from-file",
    "from_file",
    # Bytes, decoded line by line: a line that is not UTF-8 is then an error naming it, not
    # a UnicodeDecodeError from deep inside the file iterator.
    type=click.File("rb"),
    help='JSON Lines, one run per line: {"args": [..], "kwargs": {..}, "run_id": ".."} '
    "(each key optional); - reads stdin. Validated whole before anything is written.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@pass_state
def enqueue(
    state: State,
    task: str,
    args_json: str,
    kwargs_json: str,
    run_id: str | None,
    delay: float | None,
    at_text: str | None,
    queue: str | None,
    max_attempts: int | None,
    priority: int | None,
    dedupe_key: str | None,
    dedupe_mode: str,
    dedupe_ttl: float | None,
    limit_key: str | None,
    app_spec: str | None,
    from_file: IO[bytes] | None,
    as_json: bool,
) -> None:
    """Enqueue one run of TASK (or one per line of --from-file, with a progress bar)."""
    if from_file is not None and (args_json != "[]" or kwargs_json != "{}" or run_id):
        raise click.UsageError("--from-file takes args, kwargs and run ids from the file")
    if dedupe_key is None and (dedupe_mode != "throttle" or dedupe_ttl is not None):
        raise click.UsageError("--dedupe-mode and --dedupe-ttl go with --dedupe-key")
    if dedupe_key is not None and (from_file is not None or run_id):
        raise click.UsageError("--dedupe-key is for one run, without --run-id or --from-file")
    dedupe = None if dedupe_key is None else Dedupe(dedupe_key, dedupe_mode, dedupe_ttl)
    args = json_arg(args_json, "--args", list)
    kwargs = json_arg(kwargs_json, "--kwargs", dict)
    at = None
    if at_text:
        try:
            at = datetime.fromisoformat(at_text.replace("Z", "+00:00"))
        except ValueError:
            raise click.BadParameter(
                f"not an ISO 8601 instant: {at_text!r}", param_hint="--at"
            ) from None
    jq = state.jq(load_app(app_spec) if app_spec else None)
    if app_spec and task not in jq.registry:
        # The app is the list of tasks its workers run: a run of any other name would only
        # ever be handed back by them, then buried.
        raise UnknownTask(f"task {task!r} is not registered in {app_spec}")
    if app_spec and max_attempts is not None:
        raise click.UsageError("--max-attempts is for tasks not in --app (the app's task sets it)")
    unchecked = task not in jq.registry
    if unchecked:
        jq.declare_task(task, queue=queue, max_attempts=max_attempts)
    if from_file is not None:
        _enqueue_file(jq, task, from_file, delay, at, queue, as_json, priority, limit_key)
    else:
        options = jq.resolve_task(task).with_options(
            run_id=run_id, delay=delay, at=at, queue=queue, priority=priority, dedupe=dedupe,
            limit_key=limit_key,
        )
        handle = jq.enqueue(options, *args, **kwargs)
        echo_handle(handle, as_json)
    if unchecked:  # after the outcome, so that a refusal stays the one line on stderr
        click.echo(
            f"note: task {task!r} is not checked (no --app) and its declared defaults (queue, "
            "max attempts, timeout) are not applied: pass --app module:jq to use them",
            err=True,
        )


_LINE_KEYS = frozenset({"args", "kwargs", "run_id"})


def _file_requests(
    jq: JobQueue,
    task: str,
    lines: IO[bytes],
    delay: float | None,
    at: datetime | None,
    queue: str | None,
    priority: int | None = None,
    limit_key: str | None = None,
) -> list[Request]:
    """Every line parsed and validated (payload size, run id) before anything is written:
    a bad line 40,000 is one error line naming it (exit 2), not 39,999 runs and a
    traceback."""
    out = []
    for number, raw in enumerate(lines, 1):
        # click.File opens a path with its name; only stdin may come without one.
        where = f"{getattr(lines, 'name', '<stdin>')} line {number}"
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise PayloadError(
                f"{where}: not valid UTF-8 ({exc.reason} at byte {exc.start + 1})"
            ) from None
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError as exc:
            raise PayloadError(f"{where}: not valid JSON: {exc}") from None
        except RecursionError:
            raise PayloadError(f"{where}: JSON nested too deeply") from None
        if not isinstance(item, dict) or not _LINE_KEYS.issuperset(item):
            raise PayloadError(f"{where}: expected an object with only args, kwargs, run_id")
        args, kwargs, run_id = item.get("args", []), item.get("kwargs", {}), item.get("run_id")
        if not isinstance(args, list) or not isinstance(kwargs, dict):
            raise PayloadError(f"{where}: args must be a JSON array, kwargs an object")
        if run_id is not None and not isinstance(run_id, str):
            raise InvalidRunId(f"{where}: run_id must be a string")
        req = Request(
            task, args, kwargs, run_id=run_id, delay=delay, at=at, queue=queue, priority=priority,
            limit_key=limit_key,
        )
        try:
            jq.prepare(req)
        except JobQueueError as exc:
            # The same kind of error (so the same exit code), said of this line.
            raise type(exc)(f"{where}: {exc}") from None
        out.append(req)
    return out


def _enqueue_file(
    jq: JobQueue,
    task: str,
    lines: IO[bytes],
    delay: float | None,
    at: datetime | None,
    queue: str | None,
    as_json: bool,
    priority: int | None = None,
    limit_key: str | None = None,
) -> None:
    requests = _file_requests(jq, task, lines, delay, at, queue, priority, limit_key)
    created = written = 0
    try:
        with progress(len(requests), f"enqueueing {len(requests):,} runs") as advance:
            for start in range(0, len(requests), ENQUEUE_CHUNK):
                chunk = requests[start : start + ENQUEUE_CHUNK]
                created += sum(h.created for h in jq.enqueue_many(chunk))
                written += len(chunk)
                advance(len(chunk))
    except KeyboardInterrupt:
        # A chunk in flight may or may not have been written: `created` counts the confirmed.
        note = f" ({written - created:,} of them existed already)" if written > created else ""
        click.echo(
            f"\ninterrupted: {written:,} of {len(requests):,} created{note}; a re-run skips "
            "the lines whose run_id exists, but creates lines without run_id again",
            err=True,
        )
        sys.exit(EXIT_INTERRUPTED)
    existed = len(requests) - created
    if as_json:
        click.echo(json.dumps({"runs": len(requests), "created": created, "existed": existed}))
    else:
        click.echo(f"{len(requests):,} runs: {created:,} created, {existed:,} existed already")
