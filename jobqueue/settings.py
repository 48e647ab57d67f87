"""Tunables with production defaults, shared by the client, worker and scheduler."""

from __future__ import annotations

import math
from dataclasses import dataclass

from jobqueue.errors import ConfigError
from jobqueue.payload import DEFAULT_MAX_PAYLOAD_BYTES


@dataclass(frozen=True)
class Settings:
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    # A finished record (and so its run id's uniqueness) lives this long, then expires.
    done_retention_s: float = 24 * 3600
    dead_retention_s: float = 7 * 24 * 3600
    default_queue: str = "default"
    default_lease_s: float = 30.0
    # More than one, so that a run whose worker died is retried (invariant 3, docs/design.md).
    default_max_attempts: int = 3
    backoff_base_s: float = 1.0
    backoff_cap_s: float = 300.0
    # Durability (docs/guarantees.md, "Durability"): after creating runs and after claiming
    # them, wait until this many replicas have the write (WAIT), and with durable_fsync until
    # it is in the master's AOF on disk (WAITAOF, Redis >= 7.2), at most durable_timeout_s.
    # 0 and False: the default, Redis's asynchronous replication.
    durable_replicas: int = 0
    durable_fsync: bool = False
    durable_timeout_s: float = 1.0
    # A failed attempt's traceback, kept with its history entry (docs/observability.md): at
    # most this many frames per exception of the chain and this many UTF-8 bytes, the newest
    # kept. max_bytes 0 keeps none.
    traceback_max_frames: int = 50
    traceback_max_bytes: int = 16 * 1024
    # A run of a task the worker that claimed it has no code for (a rolling deploy: new code
    # enqueues a task the old workers do not know yet; two apps on one queue) is handed back,
    # not counted as an attempt, due again after unknown_task_delay_s, doubling at each
    # hand-back up to unknown_task_delay_cap_s; it is dead only once hand-backs have gone on
    # for unknown_task_window_s and numbered unknown_task_min_hand_backs (a run claimed
    # rarely, behind a long backlog, is not dead at its second hand-back) (docs/operations.md,
    # "Rolling deploys and apps sharing a Redis").
    unknown_task_window_s: float = 3600.0
    unknown_task_delay_s: float = 1.0
    unknown_task_delay_cap_s: float = 60.0
    unknown_task_min_hand_backs: int = 5
    # Workflows (docs/workflows.md, "Exactly once"): every flow_audit_s a worker looks at the
    # waiting runs of the partitions it serves that have waited that long, and delivers the
    # outcomes of finished dependencies they never heard of (a delivery a failover lost); it
    # also forgets the flows whose records all expired.
    flow_audit_s: float = 30.0
    # A workflow over several partitions is written staged, then committed in one write
    # (docs/workflows.md, "Created whole or not at all"): staged runs older than this whose
    # commit never came (the creating process died) are rolled back by that audit, or
    # released if the commit happened.
    flow_stage_timeout_s: float = 120.0
    # The most bytes a workflow step receiving its dependencies' results may hold (its
    # payload: the results first, then its own arguments); past it the step dies saying so.
    max_results_bytes: int = 16 * 1024 * 1024

    def __post_init__(self) -> None:
        if self.max_payload_bytes <= 0:
            raise ConfigError("max_payload_bytes must be positive")
        if not (_positive(self.done_retention_s) and _positive(self.dead_retention_s)):
            raise ConfigError("retention must be positive (records must expire)")
        if not _positive(self.default_lease_s):
            raise ConfigError("default_lease_s must be positive")
        if self.default_max_attempts < 1:
            raise ConfigError("default_max_attempts must be at least 1")
        if self.durable_replicas < 0:
            raise ConfigError("durable_replicas must be 0 (off) or more")
        if not _positive(self.durable_timeout_s):
            raise ConfigError("durable_timeout_s must be positive")
        if self.traceback_max_frames < 1:
            raise ConfigError("traceback_max_frames must be at least 1")
        if not 0 <= self.traceback_max_bytes <= 65536:
            raise ConfigError("traceback_max_bytes must be between 0 (none kept) and 65536")
        if not 0 <= self.unknown_task_window_s <= 30 * 86400:  # NaN fails too
            raise ConfigError("unknown_task_window_s must be from 0 to 30 days")
        if not (
            _positive(self.unknown_task_delay_s)
            and self.unknown_task_delay_s <= self.unknown_task_delay_cap_s <= 86400
        ):
            raise ConfigError(
                "unknown_task_delay_s and unknown_task_delay_cap_s must be positive, the "
                "delay at most the cap, the cap at most a day"
            )
        if not 0.05 <= self.flow_audit_s <= 86400:  # NaN fails too
            raise ConfigError("flow_audit_s must be from 0.05 s to a day")
        if not 0.05 <= self.flow_stage_timeout_s <= 86400:
            raise ConfigError("flow_stage_timeout_s must be from 0.05 s to a day")
        if (isinstance(self.max_results_bytes, bool) or not isinstance(self.max_results_bytes, int)
                or not 1 <= self.max_results_bytes <= 512 * 1024 * 1024):
            raise ConfigError("max_results_bytes must be a whole number from 1 to 512 MiB")
        if (
            isinstance(self.unknown_task_min_hand_backs, bool)
            or not isinstance(self.unknown_task_min_hand_backs, int)
            or self.unknown_task_min_hand_backs < 1
        ):
            raise ConfigError("unknown_task_min_hand_backs must be an integer >= 1")

    @property
    def durable(self) -> bool:
        return self.durable_replicas > 0 or self.durable_fsync

    @property
    def durable_timeout_ms(self) -> int:
        return to_ms(self.durable_timeout_s)

    @property
    def done_retention_ms(self) -> int:
        return to_ms(self.done_retention_s)

    @property
    def dead_retention_ms(self) -> int:
        return to_ms(self.dead_retention_s)

    @property
    def default_lease_ms(self) -> int:
        return to_ms(self.default_lease_s)

    @property
    def unknown_task_window_ms(self) -> int:
        return round(self.unknown_task_window_s * 1000)

    @property
    def backoff_base_ms(self) -> int:
        return to_ms(self.backoff_base_s)

    @property
    def backoff_cap_ms(self) -> int:
        return to_ms(self.backoff_cap_s)


def _positive(seconds: float) -> bool:
    return seconds > 0 and math.isfinite(seconds)  # NaN compares False to everything


def to_ms(seconds: float) -> int:
    """Whole milliseconds (rounded), at least 1: the scripts read 0 as 'no expiry' / 'no
    lease'. Every duration in seconds that jobqueue is given becomes ms this way."""
    return max(1, round(seconds * 1000))
