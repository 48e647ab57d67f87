"""The worker's asyncio side of Redis: every claim, heartbeat, commit, release and wait for work
of the event loop goes through ``RedisIO``, over an asyncio twin of the app's sync client (the
same server or cluster, credentials and TLS settings: jobqueue.store.twin)."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from jobqueue.store.scripts import AsyncScriptRunner, Call
from jobqueue.store.twin import async_twin


class RedisIO:
    def __init__(self, sync_client: Any) -> None:
        self.client = async_twin(sync_client)
        self.scripts = AsyncScriptRunner(self.client)

    async def run_each(self, calls: Sequence[Call]) -> list[Any]:
        """Every call's reply, or the jobqueue error it met, as a value (one pipeline per
        master; see ScriptRunner.run_each)."""
        return await self.scripts.run_each(calls)

    async def run_durable(
        self, calls: Sequence[Call], replicas: int, fsync: bool, timeout_ms: int
    ) -> tuple[list[Any], bool]:
        return await self.scripts.run_durable(calls, replicas, fsync, timeout_ms)

    async def wait_on_lists(self, keys: list[str], timeout: float) -> str | None:
        """The wake list a token was popped from, or None after ``timeout``; cancellable."""
        return await self.scripts.wait_on_lists(keys, timeout)

    async def aclose(self) -> None:
        for closing in (self.scripts.aclose, self.client.aclose):
            with contextlib.suppress(Exception):
                await closing()
