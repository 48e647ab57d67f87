"""The whole keyspace, byte for byte: what a test compares to prove that a command wrote
nothing (``DUMP`` of every key, and whether it has a TTL; DUMP leaves the TTL out)."""

from __future__ import annotations

from typing import Any

Keyspace = dict[str, tuple[bytes | None, bool]]


def keyspace(client: Any) -> Keyspace:
    keys = sorted(client.scan_iter(count=1000))
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.dump(key)
        pipe.pttl(key)
    replies = pipe.execute()
    return {key: (replies[2 * i], replies[2 * i + 1] >= 0) for i, key in enumerate(keys)}
