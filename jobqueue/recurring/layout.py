"""The scheduler partition count K and its placement: configured (argument, else
$JOBQUEUE_SCHED_PARTITIONS), recorded in ``jq:sched:config`` by the first writer, read back by
every process, and the keys of each partition. I/O-free steps, shared by both clients."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from jobqueue.anomalies import (
    is_wrong_type,
)
from jobqueue.errors import (
    ConfigError,
    CorruptData,
    OperationRefused,
)
from jobqueue.recurring.definitions import (
    ENV_SCHED_PARTITIONS,
    MOVING_FIELD,
    PER_MASTER,
    SCHED_CONFIG_KEY,
    _str,
    sched_keys,
    sched_partition_of,
)
from jobqueue.store.io import (
    Steps,
    cmd,
    commands,
)
from jobqueue.store.keys import (
    MAX_PARTITIONS,
    SchedKeys,
    bad_count,
    parse_placement,
    placement_record,
    validate_partition_count,
)


class SchedLayout:
    """K and its placement as this process knows them: kept between operations once read
    (``forget`` drops them). ``topology``: the client whose slot map decides the default K
    (a cluster's masters); called at first use, so a client connects only when used."""

    def __init__(
        self, partitions: int | None = None, topology: Callable[[], Any] = lambda: None
    ) -> None:
        self._wanted = partitions
        self.known: int | None = None
        self._spread = False
        self._topology = topology

    def record_partitions_steps(self) -> Steps[int]:
        """K, recorded in Redis (HSETNX) by the first writer; a process configured otherwise
        is refused. Every write records it first, and the scheduler daemon at start."""
        if self.known is None:
            wanted = self.configured()
            first = placement_record(wanted or self.default_partitions(), True)
            written, stored = yield commands(
                cmd("hsetnx", SCHED_CONFIG_KEY, "partitions", first),
                cmd("hget", SCHED_CONFIG_KEY, "partitions"),
            )
            if isinstance(written, Exception) and not is_wrong_type(written):
                raise written  # refused by the server (OOM, READONLY): not the data's fault
            self.known, self._spread = self._adopt(stored, wanted)
        return self.known

    def default_partitions(self) -> int:
        """K when nothing configures it: 1 on a single server (its one thread runs every
        script anyway; a second scheduler stands by), PER_MASTER x the masters on a cluster,
        so that the partitions, placed evenly, put the same share of the jobs on each master
        and up to that many schedulers can share the work."""
        primaries = getattr(self._topology(), "get_primaries", None)  # cached slot map
        if primaries is None:
            return 1
        return min(MAX_PARTITIONS, PER_MASTER * max(1, len(primaries())))

    def read_partitions_steps(self) -> Steps[int]:
        """K as recorded, else as configured: nothing recorded means no definition was ever
        written, so there is nothing to find in any partition. Writes nothing, so a command
        that only reads (or is refused) leaves Redis as it was."""
        if self.known is not None:
            return self.known
        wanted = self.configured()
        (stored,) = yield commands(cmd("hget", SCHED_CONFIG_KEY, "partitions"))
        if stored is None:
            return wanted or 1  # not kept: the first write records it, and may find another
        self.known, self._spread = self._adopt(stored, wanted)
        return self.known

    def forget(self) -> None:
        """Read K and its placement again at the next use (after `schedules repartition`)."""
        self.known, self._spread = None, False

    def refresh_steps(self) -> Steps[None]:
        """Before a write: K and its placement as Redis records them now (another process
        may have changed them with `jobqueue schedules repartition` since this one read
        them), and refused while such a change is in progress."""
        (reply,) = yield commands(cmd("hmget", SCHED_CONFIG_KEY, "partitions", MOVING_FIELD))
        if is_wrong_type(reply):
            raise CorruptData(f"{SCHED_CONFIG_KEY} is not a hash: recurring jobs cannot be read")
        if isinstance(reply, Exception):
            raise reply
        stored, moving = reply
        if moving is not None:
            raise OperationRefused(
                f"the scheduler partitions are being changed to {_str(moving)!r} (jobqueue "
                "schedules repartition): try again once it has finished"
            )
        if stored is not None:
            self.known, self._spread = self._adopt(stored, self.configured())

    def configured(self) -> int | None:
        """K as this process is configured (argument, else $JOBQUEUE_SCHED_PARTITIONS)."""
        wanted = self._wanted
        env = os.environ.get(ENV_SCHED_PARTITIONS)
        if wanted is None and env:
            if not (env.isascii() and env.isdigit()):
                raise ConfigError(f"${ENV_SCHED_PARTITIONS} is {env!r}: not a whole number")
            wanted = int(env)
        if wanted is not None:
            validate_partition_count(wanted, "scheduler")
        return wanted

    def _adopt(self, stored: Any, wanted: int | None) -> tuple[int, bool]:
        """The recorded K and placement (an HGET reply), checked against the configured K."""
        if is_wrong_type(stored):
            raise CorruptData(f"{SCHED_CONFIG_KEY} is not a hash: recurring jobs cannot be read")
        if isinstance(stored, Exception):
            raise stored
        placed = parse_placement(stored)
        if placed is None:
            raise CorruptData(
                f"{SCHED_CONFIG_KEY} field 'partitions': {bad_count(stored)}; set it right "
                "before using recurring jobs"
            )
        count, spread = placed
        if wanted is not None and wanted != count:
            raise ConfigError(
                f"recurring jobs use {count} scheduler partitions in Redis but {wanted} "
                f"are configured here; changing it needs a migration: `jobqueue schedules "
                f"repartition {wanted}` (see its --help)"
            )
        return count, spread

    def keys_steps(self, job_id: str) -> Steps[SchedKeys]:
        count = yield from self.read_partitions_steps()
        return sched_keys(sched_partition_of(job_id, count), count, self._spread)

    def all_keys_steps(self) -> Steps[list[SchedKeys]]:
        count = yield from self.read_partitions_steps()
        return [sched_keys(k, count, self._spread) for k in range(count)]

    # -- reading ---------------------------------------------------------------------------
