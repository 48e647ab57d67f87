"""The clients' steps for queues: registering a queue (its partition count), pausing it,
and its flow limits (concurrency, rate, per-key and per-task caps, exact limits). Written
once as I/O-free steps (``jobqueue.store.io``), as the rest of ``ClientCore``."""

from __future__ import annotations

import redis

from jobqueue.anomalies import is_wrong_type
from jobqueue.client.base import ClientBase, QueueTable, queue_table
from jobqueue.errors import ConfigError, ConnectionFailed
from jobqueue.models import QueueLimits
from jobqueue.store.admin import PAUSE, SET_LIMIT, limits_of, rate_value
from jobqueue.store.exact import GLOBAL_LIMIT, ExactKeys
from jobqueue.store.io import (
    Scripts,
    Steps,
    cmd,
    commands,
)
from jobqueue.store.keys import QUEUES_KEY, validate_queue_name

MAX_LIMIT = 1_000_000  # a concurrency limit above any worker fleet is a typo
# A per-key or per-task cap: claim checks a full group's members, so the bound keeps that
# bounded (lua/lib/slots.lua SLOT_CAP_MAX).
MAX_SLOT_CAP = 10_000
MAX_RATE_WINDOW_MS = 86_400_000  # the claim log of a rate limit lives one window


def to_ms(seconds: float, what: str) -> int:
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds != seconds:
        raise ConfigError(f"{what} must be a number of seconds")
    if seconds in (float("inf"), float("-inf")):
        raise ConfigError(f"{what} must be a finite number of seconds")
    return round(seconds * 1000)


class QueueSteps(ClientBase):
    """Queues and their limits, for ClientCore."""

    _registered_queues: set[str]

    def _register_queue(self, queue: str) -> Steps[int]:
        """Record the queue and its partition count in Redis once; a process that disagrees
        with the recorded count is refused (runs would be looked for in the wrong slots)."""
        if queue in self._registered_queues:
            return self.partitions_of(queue)
        validate_queue_name(queue)  # jq:queues lists only names every command can address
        try:
            written, stored = yield commands(
                cmd("hsetnx", QUEUES_KEY, queue, self.registration(queue)),
                cmd("hget", QUEUES_KEY, queue),
            )
            if isinstance(written, Exception) and not is_wrong_type(written):
                raise written  # refused by the server (OOM, READONLY): not the data's fault
        except redis.exceptions.RedisError as exc:
            raise ConnectionFailed(f"cannot register queue {queue!r}: {exc}") from None
        count = self.adopt_partition_count(queue, stored)
        self._registered_queues.add(queue)
        return count

    def _queue_table(self) -> Steps[QueueTable]:
        """``jq:queues`` as read, with the entries no command can use as anomalies."""
        (reply,) = yield commands(cmd("hgetall", QUEUES_KEY))
        return queue_table(reply)

    def _queues(self) -> Steps[dict[str, int]]:
        return (yield from self._queue_table()).counts

    def _pause(self, queue: str, paused: bool) -> Steps[bool]:
        """Pause or resume every partition of a queue (recorded first, like an enqueue, so a
        queue can be paused before its first run); True when a partition changed."""
        yield from self._register_queue(queue)
        calls = [PAUSE.call(keys, paused) for keys in self.all_partition_keys(queue)]
        replies = yield Scripts(calls)
        return any([PAUSE.parse(reply) for reply in replies])

    def _set_concurrency(
        self,
        queue: str,
        limit: int | None,
        per_key: bool = False,
        task: str | None = None,
        exact: bool = False,
    ) -> Steps[bool]:
        """Set (or with None remove) the concurrency limit of every partition of a queue:
        of the whole queue, or with ``per_key`` of each limit_key, or with ``task`` of that
        task's runs; with ``exact``, the queue's exact limit (across its partitions, in the
        limit's own slot); True when a partition changed."""
        if per_key and task is not None:
            raise ConfigError("a concurrency limit is per key or per task, not both")
        if exact and (per_key or task is not None):
            raise ConfigError("an exact concurrency limit is for the whole queue only")
        if task is not None and (not isinstance(task, str) or not task):
            raise ConfigError(f"task must be a task name, not {task!r}")
        top = MAX_LIMIT if not per_key and task is None else MAX_SLOT_CAP
        if limit is not None and (
            isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= top
        ):
            raise ConfigError(
                f"concurrency limit must be an integer from 1 to {top} (to stop claims, "
                "pause the queue)"
            )
        name = "key_concurrency" if per_key else "concurrency" if task is None else f"task:{task}"
        yield from self._register_queue(queue)
        if exact:
            (reply,) = yield Scripts([GLOBAL_LIMIT.call(ExactKeys(queue), "concurrency", limit)])
            return bool(GLOBAL_LIMIT.parse(reply))
        calls = [SET_LIMIT.call(keys, name, limit) for keys in self.all_partition_keys(queue)]
        replies = yield Scripts(calls)
        return any([SET_LIMIT.parse(reply) for reply in replies])

    def _set_rate(
        self,
        queue: str,
        limit: int | None,
        per: float,
        per_key: bool = False,
        margin: float = 0.0,
        exact: bool = False,
    ) -> Steps[bool]:
        """Set (or with None remove) the rate limit of every partition of a queue: at most
        ``limit`` claims (with ``per_key``: of each limit_key) in any ``per`` + ``margin``
        seconds; True when a partition changed."""
        value: str | None = None
        if isinstance(margin, bool) or not (isinstance(margin, int | float) and 0 <= margin <= 60):
            raise ConfigError(f"rate margin must be from 0 to 60 seconds, not {margin!r}")
        if limit is not None:
            if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
                raise ConfigError(
                    f"rate limit must be an integer from 1 to {MAX_LIMIT} (to stop claims, "
                    "pause the queue)"
                )
            window_ms = to_ms(per, "per") + (round(margin * 1000) if margin else 0)
            if not 1 <= window_ms <= MAX_RATE_WINDOW_MS:
                raise ConfigError("rate window 'per' must be from 1 ms to 1 day")
            value = rate_value(limit, window_ms)
        if exact and per_key:
            raise ConfigError("an exact rate limit is for the whole queue only")
        yield from self._register_queue(queue)
        if exact:
            (reply,) = yield Scripts([GLOBAL_LIMIT.call(ExactKeys(queue), "rate", value)])
            return bool(GLOBAL_LIMIT.parse(reply))
        name = "key_rate" if per_key else "rate"
        calls = [SET_LIMIT.call(keys, name, value) for keys in self.all_partition_keys(queue)]
        replies = yield Scripts(calls)
        return any([SET_LIMIT.parse(reply) for reply in replies])

    def _queue_limits(self, queue: str) -> Steps[QueueLimits]:
        """The flow limits of a queue's first partition, as set_queue_concurrency and
        set_queue_rate set them on every one; None where there is none (or what is stored is
        not a limit)."""
        table = yield from self._queue_table()
        if queue not in table.counts:
            return QueueLimits()
        first = table.partitions(queue)[0]
        (reply,) = yield commands(cmd("hgetall", first.limits))
        if not isinstance(reply, dict):
            return QueueLimits()  # a limits key of another type: an anomaly of the listings
        return limits_of(reply)

    def _queue_paused(self, queue: str) -> Steps[bool]:
        """Whether any partition of a queue recorded in Redis is paused (an unknown queue,
        or a paused key of another type, is not: claims refuse the latter whole)."""
        table = yield from self._queue_table()
        parts = table.partitions(queue) if queue in table.counts else []
        if not parts:
            return False
        replies = yield commands(*(cmd("get", keys.paused) for keys in parts))
        return any(isinstance(r, (str, bytes)) for r in replies)

    # -- creating runs ---------------------------------------------------------------------
