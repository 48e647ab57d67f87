"""The Lua scripts: found on disk, hashed locally, called by SHA, reloaded after NOSCRIPT.

One ``Call`` describes one script invocation (name, keys, args). The sync and asyncio runners
below are the only code that talks to Redis about scripts; everything else builds Calls and
parses replies (see ``ops``), so the two flavours share all logic but the I/O.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import redis

from .errors import ConnectionFailed, ScriptError

SCRIPT_NAMES = (
    "create_run",
    "claim",
    "heartbeat",
    "complete",
    "fail",
    "cancel",
    "release",
    "requeue",
    "fenced_write",
    "purge",
    "sched_due",
    "advance",
    "sched_define",
)
PRELUDE = "_prelude"

ArgT = str | int | float | bytes


def lua_dir() -> Path:
    """The wheel ships the scripts inside the package; a source checkout keeps them at the top."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "lua", here.parent / "lua"):
        if (candidate / f"{PRELUDE}.lua").is_file():
            return candidate
    raise ScriptError(f"jobqueue's Lua scripts are missing (looked in {here / 'lua'})")


@dataclass(frozen=True)
class Script:
    name: str
    source: str
    sha: str


@cache
def scripts() -> dict[str, Script]:
    directory = lua_dir()
    prelude = (directory / f"{PRELUDE}.lua").read_text()
    out = {}
    for name in SCRIPT_NAMES:
        source = prelude + "\n" + (directory / f"{name}.lua").read_text()
        out[name] = Script(name, source, hashlib.sha1(source.encode()).hexdigest())
    return out


@dataclass(frozen=True)
class Call:
    script: str
    keys: tuple[str, ...]
    args: tuple[ArgT, ...]

    def evalsha_args(self) -> tuple[Any, ...]:
        return (scripts()[self.script].sha, len(self.keys), *self.keys, *self.args)


def _is_noscript(exc: BaseException) -> bool:
    return isinstance(exc, redis.exceptions.NoScriptError) or (
        isinstance(exc, redis.exceptions.ResponseError) and str(exc).startswith("NOSCRIPT")
    )


def _translate(call: Call, exc: BaseException) -> Exception:
    if isinstance(exc, redis.exceptions.AuthenticationError | redis.exceptions.ConnectionError):
        return ConnectionFailed(f"Redis connection failed during {call.script}: {exc}")
    if isinstance(exc, redis.exceptions.TimeoutError):
        return ConnectionFailed(f"Redis timed out during {call.script}: {exc}")
    return ScriptError(f"script {call.script} failed: {exc}")


class ScriptRunner:
    """Runs Calls on a synchronous client (Redis or RedisCluster)."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def load(self, names: Sequence[str] | None = None) -> None:
        for name in names or SCRIPT_NAMES:
            self.client.script_load(scripts()[name].source)

    def run(self, call: Call) -> Any:
        try:
            try:
                return self.client.evalsha(*call.evalsha_args())
            except redis.exceptions.ResponseError as exc:
                if not _is_noscript(exc):
                    raise
                # Server restarted or failed over: its script cache is empty.
                self.load([call.script])
                return self.client.evalsha(*call.evalsha_args())
        except redis.exceptions.RedisError as exc:
            raise _translate(call, exc) from exc

    def run_many(self, calls: Sequence[Call]) -> list[Any]:
        """One pipelined round trip; calls refused with NOSCRIPT are reloaded and re-sent alone,
        so no call runs twice."""
        if not calls:
            return []
        try:
            pipe = self.client.pipeline(transaction=False)
            for call in calls:
                pipe.evalsha(*call.evalsha_args())
            replies: list[Any] = pipe.execute(raise_on_error=False)
            missing = [i for i, r in enumerate(replies) if _is_noscript(r)]
            if missing:
                self.load(sorted({calls[i].script for i in missing}))
                pipe = self.client.pipeline(transaction=False)
                for i in missing:
                    pipe.evalsha(*calls[i].evalsha_args())
                for i, reply in zip(missing, pipe.execute(raise_on_error=False), strict=True):
                    replies[i] = reply
        except redis.exceptions.RedisError as exc:
            raise _translate(calls[0], exc) from exc
        for call, reply in zip(calls, replies, strict=True):
            if isinstance(reply, Exception):
                raise _translate(call, reply) from reply
        return replies


class AsyncScriptRunner:
    """The same as ScriptRunner, for redis.asyncio clients."""

    def __init__(self, client: Any) -> None:
        self.client = client

    async def load(self, names: Sequence[str] | None = None) -> None:
        for name in names or SCRIPT_NAMES:
            await self.client.script_load(scripts()[name].source)

    async def run(self, call: Call) -> Any:
        try:
            try:
                return await self.client.evalsha(*call.evalsha_args())
            except redis.exceptions.ResponseError as exc:
                if not _is_noscript(exc):
                    raise
                await self.load([call.script])
                return await self.client.evalsha(*call.evalsha_args())
        except redis.exceptions.RedisError as exc:
            raise _translate(call, exc) from exc

    async def run_many(self, calls: Sequence[Call]) -> list[Any]:
        if not calls:
            return []
        try:
            pipe = self.client.pipeline(transaction=False)
            for call in calls:
                pipe.evalsha(*call.evalsha_args())
            replies: list[Any] = await pipe.execute(raise_on_error=False)
            missing = [i for i, r in enumerate(replies) if _is_noscript(r)]
            if missing:
                await self.load(sorted({calls[i].script for i in missing}))
                pipe = self.client.pipeline(transaction=False)
                for i in missing:
                    pipe.evalsha(*calls[i].evalsha_args())
                for i, reply in zip(missing, await pipe.execute(raise_on_error=False), strict=True):
                    replies[i] = reply
        except redis.exceptions.RedisError as exc:
            raise _translate(calls[0], exc) from exc
        for call, reply in zip(calls, replies, strict=True):
            if isinstance(reply, Exception):
                raise _translate(call, reply) from reply
        return replies
