"""Typed exceptions: everything a user can get wrong or a server can refuse has a name here.

No bare ``redis.ResponseError`` reaches users: the client layer translates them.
"""

from __future__ import annotations


class JobQueueError(Exception):
    """Base class of every error jobqueue raises on purpose."""


class ConfigError(JobQueueError):
    """A bad setting: URL, queue name, limits."""


class ConnectionFailed(JobQueueError):
    """Redis is unreachable, refused the credentials, or went away."""


class Unreachable(ConnectionFailed):
    """No Redis answered at the URL's address (nothing listening, a host not resolved yet, a
    server still loading its data): what may pass by itself, unlike refused credentials.
    The daemons wait for it at start (``--connect-timeout``)."""


class PoolExhausted(ConnectionFailed):
    """Every connection of the client's pool stayed busy for the pool's whole wait (the URL's
    ``timeout``, 20 s by default): the call was never sent. Raise the URL's
    ``max_connections`` (100 by default), or send fewer calls at once."""


class ServerRefused(ConnectionFailed):
    """Redis refused a call for now and it did not run: memory full (OOM), a replica or a
    demoted master (READONLY, or UNBLOCKED for a blocking wait), a busy script, a Redis
    Cluster slot moving (TRYLATER, MOVED, ASK), a script cache emptied again as soon as it
    was loaded (NOSCRIPT). Retried like a lost connection by the daemons; an enqueue can be
    sent again as is.
    From a pipelined call, ``replies`` holds every reply (error replies as exceptions), so
    a caller can send again just the refused calls."""

    replies: list[object] | None = None


class PayloadError(JobQueueError, ValueError):
    """Arguments or a result that cannot be stored: not JSON, or too large."""


class UnknownTask(JobQueueError, LookupError):
    """A task name that is not registered with this JobQueue."""


class FlowFinished(JobQueueError):
    """A run was to be added to a flow (``ctx.add_to_flow``) that no longer waits on the run
    adding it: its batch's callbacks or its workflow's next steps have moved on. Nothing was
    added."""


class FlowConflict(JobQueueError, ValueError):
    """A workflow cannot be created as given: a step that waits on others reuses the run id
    of a run that exists outside it (finished or not, it would never wait), or a step waits
    on a run of another Redis. Nothing was written."""


class FlowAborted(JobQueueError):
    """A workflow's creation over several partitions was rolled back before its commit (it
    took longer than ``Settings.flow_stage_timeout_s``, and a worker's audit undid it):
    nothing of it is left, and none of its runs ran. Create it again."""


class FlowAddFailed(JobQueueError):
    """The error of an attempt whose ``ctx.add_to_flow`` raised, though the task returned:
    it is retried like any failure (see RunContext.add_to_flow)."""


class RunNotFound(JobQueueError, LookupError):
    """No run with that id (never created, or its record expired after retention)."""


class InvalidRunId(JobQueueError, ValueError):
    """A run id that is empty, too long or has characters we refuse."""


class OperationRefused(JobQueueError):
    """The run is in a state that does not allow the operation (e.g. cancel a finished run)."""


class UnknownQueue(OperationRefused, LookupError):
    """A queue name no run or worker ever used: most likely a typo, never shown as empty."""


class GroupFull(OperationRefused):
    """An enqueue would make a group hold more waiting runs than its ``max_size``
    (``JobQueue.set_group``); nothing of that call was created."""


class CorruptData(OperationRefused, ValueError):
    """Data in one of jobqueue's own keys that jobqueue never writes (a key of another type, a
    garbage field, a partition count out of range) stands in the way of an operation: refused
    (exit 1), naming the key. Reading paths report such data as anomalies instead (see
    ``jobqueue.anomalies``). A ValueError too, like the ``int()`` failures it replaces, so code
    that skips unusable data keeps skipping it."""


class ScriptError(JobQueueError):
    """A Lua script failed inside Redis: a bug or a corrupted key, never a user mistake."""


class RunTimeout(JobQueueError, TimeoutError):
    """``RunHandle.wait`` (or ``result``) gave up before the run finished."""


class RunFailed(JobQueueError):
    """``RunHandle.result()`` of a dead run: its attempts are spent, or it failed for good.
    ``run`` is the Run; ``error`` and ``traceback`` are its last failed attempt's (None when
    none was kept)."""

    def __init__(self, run: object) -> None:
        self.run: object = run
        self.run_id: str = str(getattr(run, "run_id", ""))
        self.error: str | None = getattr(run, "error", None)
        self.traceback: str | None = getattr(run, "traceback", None)
        attempts = getattr(run, "attempt", None)
        error = self.error or "no error kept"
        super().__init__(f"run {self.run_id} is dead after {attempts} attempt(s): {error}")


class RunCancelled(JobQueueError):
    """``RunHandle.result()`` of a cancelled run. ``run`` is the Run, ``reason`` why it was
    cancelled."""

    def __init__(self, run: object) -> None:
        self.run: object = run
        self.run_id: str = str(getattr(run, "run_id", ""))
        self.reason: str | None = getattr(run, "error", None)
        super().__init__(f"run {self.run_id} was cancelled: {self.reason or 'cancelled'}")


class Fatal(JobQueueError):
    """Raised by a task to fail its run for good: no retry, straight to the dead set."""


class NotDurable(JobQueueError):
    """The write is done on the master, but not acknowledged by the replicas (or the AOF)
    that Settings.durable_* ask for within the timeout: a failover now could lose it. An
    enqueue can be sent again with the same run id (it is idempotent)."""


class RecurringError(ConfigError):
    """A recurring job definition that cannot be accepted: the message names the bad value."""


class BackfillInFuture(RecurringError):
    """A backfill whose end is after the server's now: fire times still to come are the
    scheduler's to create at their time, not runs to make due now."""


class UnknownSchedule(OperationRefused, LookupError):
    """No recurring job with that id."""
