"""The whole keyspace, byte for byte: what a test compares to prove that a command wrote
nothing (``DUMP`` of every key, and when it expires: PEXPIRETIME, an absolute time, so a
TTL set again, even to the same length, shows; DUMP leaves the TTL out)."""

from __future__ import annotations

from typing import Any

Keyspace = dict[str, tuple[bytes | None, int]]


def keyspace(client: Any) -> Keyspace:
    keys = sorted(client.scan_iter(count=1000))
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.dump(key)
        pipe.pexpiretime(key)
    replies = pipe.execute()
    return {key: (replies[2 * i], replies[2 * i + 1]) for i, key in enumerate(keys)}
