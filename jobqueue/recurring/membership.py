"""Scheduler partitions owned by leases: N schedulers share the K scheduler partitions instead
of each ticking all of them.

Each scheduler keeps an entry in the registry ``jq:schedulers`` (refreshed every tick, with
the server's time) and holds a lease (``sched_lease.lua``, in the partition's own slot) on each
partition it owns. Every tick it rebalances: with N live schedulers (entries refreshed within
their lease) each should own ``ceil(K / N)``; it renews the leases it keeps, releases what it
holds beyond that share, and acquires partitions that have no owner or whose lease expired, up
to its share. So a scheduler that dies loses its partitions when its leases expire (at most the
lease later, 5 s by default) and the others take them up; one that joins gets partitions as the
others give up their surplus, within a few ticks.

A lease carries a token, a fence that grows each time the partition changes hands;
``advance.lua`` refuses the moves of a caller whose token is not the current one. An owner that
stalled past its lease (a pause, a lost connection) therefore cannot move a job's next fire
after another took over; the runs it may still create are the ones the new owner creates too
(same run ids: SET NX), so a hand-over neither doubles nor loses a fire. Before its writes, a
scheduler also checks that its lease is still valid by its own clock (renewing it if needed),
which keeps a stale owner from even creating in all but a pause that falls between that check
and the write.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import redis

from jobqueue.anomalies import Listing
from jobqueue.errors import JobQueueError
from jobqueue.policy.hashing import fnv1a_32
from jobqueue.recurring.registry import (
    PartitionOwner,
    SchedulerInfo,
    forget_steps,
    members_steps,
    owners_steps,
    register_steps,
)
from jobqueue.store.keys import SchedKeys
from jobqueue.store.schedules import SCHED_LEASE, Lease

if TYPE_CHECKING:
    from jobqueue.client.sync import JobQueue
    from jobqueue.recurring.sync import Recurring

log = logging.getLogger("jobqueue.scheduler")

# A lease is taken as valid by its holder's own clock for this share of its length after the
# renewal was sent, so that clock rates and the round trip never make it trust a lease the
# server already counts as expired.
TRUSTED_SHARE = 0.75
# Registry entries not refreshed for this long are deleted by the next scheduler that reads
# them (a crashed scheduler's entry otherwise stays forever).
FORGET_AFTER_MS = 3_600_000


def read_members(jq: JobQueue, now_ms: int | None = None) -> Listing[SchedulerInfo]:
    """The registry (``registry.members_steps``) on a sync client."""
    return jq.run_steps(members_steps(now_ms))


def read_owners(jq: JobQueue, keys: Sequence[SchedKeys]) -> list[PartitionOwner]:
    """Each partition's lease and job count (``registry.owners_steps``), and on a cluster the
    master serving its slot."""
    owners = jq.run_steps(owners_steps(keys))
    locate = getattr(jq.redis, "get_node_from_key", None)
    if locate is None:
        return owners
    out = []
    for owner, sk in zip(owners, keys, strict=True):
        try:
            node: str | None = str(locate(sk.owner).name)
        except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException):
            node = None
        out.append(replace(owner, node=node))
    return out


@dataclass
class _Held:
    token: int
    trusted_until: float  # monotonic: the lease is taken as valid until then


@dataclass
class Ownership:
    """What one scheduler owns, and the rebalancing that keeps the partitions shared."""

    jq: JobQueue
    store: Recurring
    lease_ms: int
    info: dict[str, Any] = field(default_factory=dict)  # extra registry fields (rate, ...)
    id: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}:"
                    f"{uuid.uuid4().hex[:6]}")  # fmt: skip
    started_ms: int = 0
    held: dict[SchedKeys, _Held] = field(default_factory=dict)
    members: int = 1  # live schedulers seen at the last rebalance
    now_ms: int = 0  # the server's now at the last rebalance
    _renewed: float = 0.0  # monotonic time of the last renewal
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # -- reading -----------------------------------------------------------------------------

    def token(self, sk: SchedKeys) -> int | None:
        with self._lock:
            held = self.held.get(sk)
        return None if held is None else held.token

    def trusted(self, sk: SchedKeys) -> bool:
        with self._lock:
            held = self.held.get(sk)
        return held is not None and time.monotonic() < held.trusted_until

    def owned(self) -> list[SchedKeys]:
        with self._lock:
            return sorted(self.held, key=lambda k: k.partition)

    # -- the registry ------------------------------------------------------------------------

    def _entry(self, now_ms: int) -> str:
        entry = {
            "id": self.id,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "started_ms": self.started_ms or now_ms,
            "seen_ms": now_ms,
            "lease_ms": self.lease_ms,
            "partitions": [k.partition for k in self.owned()],
            **self.info,
        }
        return json.dumps(entry)

    def _live_members(self, now_ms: int) -> int:
        """The live schedulers, this one included; entries older than FORGET_AFTER_MS are
        deleted (their schedulers are long gone)."""
        if not self.started_ms:
            self.started_ms = now_ms
        listing = read_members(self.jq, now_ms)
        forgotten = [m.id for m in listing if m.seen_ago_ms > FORGET_AFTER_MS]
        if forgotten:
            self.jq.run_steps(forget_steps(*forgotten))
        live = {m.id for m in listing if m.live} | {self.id}
        return len(live)

    def register(self, now_ms: int) -> None:
        """This scheduler's registry entry: what it owns, the server's now as last seen."""
        self.jq.run_steps(register_steps(self.id, self._entry(now_ms)))

    def leave(self) -> None:
        """Give every partition up and leave the registry (a graceful stop): the others
        take the partitions over at their next tick instead of after the lease."""
        self._apply([(sk, "release") for sk in self.owned()], None)
        with self._lock:
            self.held.clear()
        self.jq.run_steps(forget_steps(self.id))

    # -- leases ------------------------------------------------------------------------------

    def _apply(self, calls: list[tuple[SchedKeys, str]], now: int | None) -> int | None:
        """Send acquire/renew/release calls (one round trip per master) and record what is
        held after them; the server's now as the replies said (None: no reply)."""
        if not calls:
            return None
        built = []
        for sk, action in calls:
            token = None if action == "acquire" else self.token(sk)
            built.append(SCHED_LEASE.call(sk, self.id, action, self.lease_ms, token, now))
        sent = time.monotonic()
        replies = self.jq.scripts.run_each(built)
        trusted = sent + self.lease_ms / 1000 * TRUSTED_SHARE
        server_now = None
        with self._lock:
            for (sk, action), reply in zip(calls, replies, strict=True):
                if isinstance(reply, Exception):
                    # Its master down, its slot moving: keep the token (the lease may still
                    # be ours) but stop trusting it once its time is up.
                    log.warning("lease of %s: %s failed (%s)", sk.prefix, action, reply)
                    continue
                lease: Lease = SCHED_LEASE.parse(reply)
                server_now = max(server_now or 0, lease.now_ms)
                was = self.held.pop(sk, None)
                if lease.held:
                    self.held[sk] = _Held(lease.token, trusted)
                elif was is not None and action != "release":
                    log.warning(
                        "scheduler partition %s lost: %s holds it now",
                        sk.prefix, lease.owner or "nobody",
                    )  # fmt: skip
        self._renewed = sent
        return server_now

    def rebalance(self, now: int | None = None) -> list[SchedKeys]:
        """Keep this scheduler's fair share: renew what it keeps, release its surplus,
        acquire free or expired partitions; then register. Returns the partitions it owns
        now. The leases are read on the node serving each (a master that is down only hides
        its own partitions); the registry's master down leaves the count of schedulers as it
        was."""
        keys = self.store.all_keys()
        replies = self.jq.scripts.run_each(
            [SCHED_LEASE.call(sk, self.id, "read", self.lease_ms, None, now) for sk in keys]
        )
        leases = {
            sk: SCHED_LEASE.parse(r)
            for sk, r in zip(keys, replies, strict=True)
            if not isinstance(r, Exception)
        }
        if not leases:  # no master answers: the caller's retry and back-off apply
            raise next(r for r in replies if isinstance(r, Exception))
        now_ms = max(lease.now_ms for lease in leases.values()) if now is None else now
        self.now_ms = now_ms
        try:
            self.members = self._live_members(now_ms)
        except (JobQueueError, redis.exceptions.RedisError, redis.exceptions.RedisClusterException
                ) as exc:  # fmt: skip
            log.warning("scheduler registry not read (%s); %d scheduler(s) as last seen",
                        exc, self.members)  # fmt: skip
        share = math.ceil(len(keys) / self.members)
        with self._lock:
            # Partitions of another layout (K changed while stopped) are no longer ours.
            for sk in [k for k in self.held if k not in keys]:
                del self.held[sk]
            mine = [sk for sk in keys if sk in self.held]
        keep, surplus = mine[:share], mine[share:]
        free = [
            sk
            for sk, lease in leases.items()
            if sk not in self.held and not (lease.owner and lease.until_ms >= now_ms)
        ]
        # Start at a place of one's own, so that schedulers racing for free partitions
        # mostly try different ones.
        if free:
            start = fnv1a_32(self.id) % len(free)
            free = free[start:] + free[:start]
        calls = [(sk, "renew") for sk in keep] + [(sk, "release") for sk in surplus]
        calls += [(sk, "acquire") for sk in free[: max(0, share - len(keep))]]
        self._apply(calls, now)
        try:
            self.register(now_ms)
        except (JobQueueError, redis.exceptions.RedisError, redis.exceptions.RedisClusterException
                ) as exc:  # fmt: skip
            log.warning("scheduler registry not written (%s)", exc)
        return self.owned()

    def keep_alive(self, now: int | None = None, force: bool = False) -> None:
        """Renew every held lease when a third of its length has passed since the last
        renewal (a long tick: a herd drained batch after batch), or at once with ``force``."""
        if not force and time.monotonic() - self._renewed < self.lease_ms / 3000:
            return
        server_now = self._apply([(sk, "renew") for sk in self.owned()], now)
        if server_now is not None:  # still alive to the others too (the registry)
            with contextlib.suppress(
                JobQueueError, redis.exceptions.RedisError, redis.exceptions.RedisClusterException
            ):
                self.register(now if now is not None else server_now)

    def hold(self, sk: SchedKeys, now: int | None = None) -> int | None:
        """Own ``sk`` (acquire it unless held already): its token, or None when another
        scheduler holds it."""
        calls = [(sk, "renew" if sk in self.held else "acquire")]
        self._apply(calls, now)
        return self.token(sk)

    def still_held(self, sk: SchedKeys, now: int | None = None) -> bool:
        """Before a write: the lease is trusted by this scheduler's clock, or renewed now."""
        if self.trusted(sk):
            return True
        if self.token(sk) is None:
            return False
        self._apply([(sk, "renew")], now)
        return self.trusted(sk)

