"""Tunables with production defaults, shared by the client, worker and scheduler."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ConfigError
from .payload import DEFAULT_MAX_PAYLOAD_BYTES


@dataclass(frozen=True)
class Settings:
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    # A finished record (and so its run id's uniqueness) lives this long, then expires.
    done_retention_s: float = 24 * 3600
    dead_retention_s: float = 7 * 24 * 3600
    default_queue: str = "default"
    default_lease_s: float = 30.0
    # More than one, so that a run whose worker died is retried (DESIGN invariant 3).
    default_max_attempts: int = 3
    backoff_base_s: float = 1.0
    backoff_cap_s: float = 300.0

    def __post_init__(self) -> None:
        if self.max_payload_bytes <= 0:
            raise ConfigError("max_payload_bytes must be positive")
        if self.done_retention_s <= 0 or self.dead_retention_s <= 0:
            raise ConfigError("retention must be positive (records must expire)")
        if self.default_lease_s <= 0:
            raise ConfigError("default_lease_s must be positive")
        if self.default_max_attempts < 1:
            raise ConfigError("default_max_attempts must be at least 1")

    @property
    def done_retention_ms(self) -> int:
        return int(self.done_retention_s * 1000)

    @property
    def dead_retention_ms(self) -> int:
        return int(self.dead_retention_s * 1000)

    @property
    def default_lease_ms(self) -> int:
        return int(self.default_lease_s * 1000)
