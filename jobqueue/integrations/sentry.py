"""Failed attempts to Sentry (the ``sentry`` extra: sentry-sdk 2).

``jq.use(SentryMiddleware())`` after ``sentry_sdk.init(...)``: every attempt whose code raised
is captured with its exception (and so its traceback), tagged ``jobqueue.run_id``,
``jobqueue.task``, ``jobqueue.queue``, ``jobqueue.attempt``, ``jobqueue.max_attempts`` and
``jobqueue.fence``, from the run's own thread or task, in a scope of its own. A cancelled or
timed-out run's stop (CancelledError) is not an error and is not sent.
"""

from __future__ import annotations

import sentry_sdk

from jobqueue.context import RunContext
from jobqueue.hooks import Middleware


class SentryMiddleware(Middleware):
    def after_run(self, ctx: RunContext, error: BaseException | None) -> None:
        if not isinstance(error, Exception):  # None, or CancelledError / SystemExit
            return
        with sentry_sdk.new_scope() as scope:
            for name, value in (
                ("run_id", ctx.run_id),
                ("task", ctx.task),
                ("queue", ctx.queue),
                ("attempt", ctx.attempt),
                ("max_attempts", ctx.max_attempts),
                ("fence", ctx.fence),
            ):
                scope.set_tag(f"jobqueue.{name}", str(value))
            scope.capture_exception(error)
