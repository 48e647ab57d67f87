"""Whether every run waiting in a queue has a live worker that can run it: ``jobqueue check``'s
lines about workers and tasks. Pure: the reader (``jobqueue.ops.coverage``) gives it the
task names of a sample of each queue's due runs and the live workers' queues and tasks.

A run whose task no live worker serving its queue registers is handed back by every worker
that claims it and dies once the hand-back window is over (Settings.unknown_task_window_s):
a deploy that left out a task, a worker started with the wrong ``--queue`` or ``--app``."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from jobqueue.policy.health import Check, ok, warn

NAME = "workers"
# Task names shown in one line, at most.
SHOWN = 5


@dataclass(frozen=True)
class LiveWorker:
    id: str
    queues: tuple[str, ...]
    tasks: frozenset[str] | None  # None: a version that did not list its tasks


def _names(counts: Counter[str]) -> str:
    shown = [f"'{t}' ({n})" for t, n in counts.most_common(SHOWN)]
    more = len(counts) - SHOWN
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


def coverage(
    due_tasks: Mapping[str, Counter[str]], workers: Sequence[LiveWorker]
) -> list[Check]:
    """One line per queue with due runs: ok when a live worker serving it registers every
    task seen, else a warning naming the tasks no such worker registers, or saying that no
    live worker serves the queue at all."""
    out: list[Check] = []
    for queue, seen in sorted(due_tasks.items()):
        if not seen:
            continue
        n = sum(seen.values())
        serving = [w for w in workers if queue in w.queues]
        if not serving:
            out.append(warn(
                NAME,
                f"queue {queue}: {n} due runs seen and no live worker serves it (start a "
                f"worker of the app whose tasks they are: {_names(seen)})",
            ))
            continue
        if any(w.tasks is None for w in serving):
            out.append(ok(
                NAME,
                f"queue {queue}: {len(serving)} live workers; some are of a version that does "
                "not list its tasks, so which tasks they run is not known",
            ))
            continue
        known = frozenset().union(*(w.tasks or frozenset() for w in serving))
        missing = Counter({t: c for t, c in seen.items() if t not in known})
        if missing:
            out.append(warn(
                NAME,
                f"queue {queue}: due runs of {_names(missing)} but none of its "
                f"{len(serving)} live workers registers the task; they hand those runs back "
                "until a worker that has it comes, and they die at the end of the window "
                "(Settings.unknown_task_window_s)",
            ))
        else:
            out.append(ok(
                NAME,
                f"queue {queue}: every task of its {n} due runs seen is registered by one of "
                f"its {len(serving)} live workers",
            ))
    return out
