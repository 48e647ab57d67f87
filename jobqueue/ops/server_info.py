"""What the Redis server says of itself (``INFO``): version, memory and its limit, clients,
evictions, uptime; on a cluster, of each master. One INFO per server (a few kilobytes,
whatever the data: no key is listed). Steps (``servers_steps``) that either client drives."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from jobqueue.client.sync import JobQueue
from jobqueue.store.io import EachMaster, Steps, cmd


@dataclass(frozen=True)
class ServerInfo:
    """One server's INFO, or why it could not be read (``error``: refused by an ACL without
    +info, or the node did not answer); a field INFO did not give is None."""

    address: str
    server: str | None = None  # "redis" or "valkey"
    version: str | None = None
    used_memory_human: str | None = None
    maxmemory: int | None = None  # bytes; 0: no limit
    maxmemory_human: str | None = None
    maxmemory_policy: str | None = None
    connected_clients: int | None = None
    evicted_keys: int | None = None
    uptime_s: int | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def parse(address: str, info: Mapping[str, Any]) -> ServerInfo:
    """A ServerInfo from redis-py's parsed INFO (pure)."""
    valkey = info.get("server_name") == "valkey"
    return ServerInfo(
        address=address,
        server="valkey" if valkey else "redis",
        version=_text(info.get("valkey_version") if valkey else info.get("redis_version")),
        used_memory_human=_text(info.get("used_memory_human")),
        maxmemory=_int(info.get("maxmemory")),
        maxmemory_human=_text(info.get("maxmemory_human")),
        maxmemory_policy=_text(info.get("maxmemory_policy")),
        connected_clients=_int(info.get("connected_clients")),
        evicted_keys=_int(info.get("evicted_keys")),
        uptime_s=_int(info.get("uptime_in_seconds")),
    )


def servers(jq: JobQueue) -> list[ServerInfo]:
    """:func:`servers_steps` on a sync client."""
    return jq.run_steps(servers_steps())


def servers_steps() -> Steps[list[ServerInfo]]:
    """The server, or each master of a cluster (by address): a server that cannot be read is
    a row with its ``error``, never an exception."""
    rows = []
    for address, replies in (yield EachMaster([cmd("info")])):
        reply = replies if isinstance(replies, Exception) else replies[0]
        if isinstance(reply, Exception):
            rows.append(ServerInfo(address, error=f"INFO: {str(reply) or type(reply).__name__}"))
        else:
            rows.append(parse(address, reply))
    return rows
