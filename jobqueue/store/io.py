"""Operations written once for the sync and the asyncio client: an operation is a generator
(``Steps``) that yields what it needs from Redis (a pipeline of commands, script calls, a SCAN
page on one node, the same commands on each master) and receives the replies; it decides
everything else (validation, keys, parsing, anomalies) without I/O. :func:`run_steps` answers
it on a sync client, :func:`run_steps_async` on a ``redis.asyncio`` one: only these two touch
the network.

An error the I/O raises (a lost connection, a script refused) is thrown into the generator at
its ``yield``, so an operation handles it the same way on both."""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import redis

from jobqueue.store.connection import exhausted, pool_exhausted
from jobqueue.store.scripts import AsyncScriptRunner, Call, ScriptRunner

T = TypeVar("T")


@dataclass(frozen=True)
class Cmd:
    """One redis-py command by its method name, e.g. ``Cmd("zrange", (key, 0, -1),
    {"withscores": True})``: redis-py parses its reply as that method does."""

    name: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


def cmd(name: str, *args: Any, **kwargs: Any) -> Cmd:
    return Cmd(name, args, kwargs)


@dataclass(frozen=True)
class Commands:
    """Commands in one pipelined round trip; each reply in its place, an error reply (such as
    WRONGTYPE) as a value: the operation decides what it means. ``atomic``: in one MULTI/EXEC
    (keys of one slot on a cluster)."""

    cmds: Sequence[Cmd]
    atomic: bool = False


@dataclass(frozen=True)
class Scripts:
    """Script calls in one round trip (a single call goes without a pipeline); the first
    error reply is raised, as ``ScriptRunner.run_many`` does. Replies in call order."""

    calls: Sequence[Call]


@dataclass(frozen=True)
class DurableScripts:
    """Script calls, then WAIT (or WAITAOF) on their connections: (replies, acknowledged)."""

    calls: Sequence[Call]
    replicas: int
    fsync: bool
    timeout_ms: int


@dataclass(frozen=True)
class NodeScan:
    """One SCAN page (``MATCH pattern COUNT count`` from ``cursor``) on the node that serves
    ``near``'s slot, the server itself off a cluster: SCAN reads one node, and a cluster
    client would otherwise scan every master. Reply: (next cursor, keys)."""

    near: str
    pattern: str
    cursor: int
    count: int


@dataclass(frozen=True)
class EachMaster:
    """The same commands on each master of a cluster, by address (the server itself off
    one): per-node reads such as INFO, which no key routes. Reply: ``[(address, replies)]``,
    replies as ``Commands`` gives them, or the error that lost that node (never raised: a
    node that does not answer is part of the reading)."""

    cmds: Sequence[Cmd]


Request = Commands | Scripts | DurableScripts | NodeScan | EachMaster
Steps = Generator[Request, Any, T]


def commands(*cmds: Cmd) -> Commands:
    return Commands(cmds)


def transaction(*cmds: Cmd) -> Commands:
    return Commands(cmds, atomic=True)


def raised(replies: list[Any]) -> list[Any]:
    """Pipelined replies, the first error among them raised (the server refused: OOM,
    READONLY; or a key of another type where the caller has no other answer)."""
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies


def checked_commands(*cmds: Cmd) -> Steps[list[Any]]:
    """``cmds`` in one round trip (none when there are none), the first error reply raised."""
    if not cmds:
        return []
    return raised((yield commands(*cmds)))


def server_time_steps(now: int | None = None) -> Steps[int]:
    """``now`` (ms, as tests give it), else the Redis server's clock: the one clock."""
    if now is not None:
        return int(now)
    ((seconds, micros),) = raised((yield commands(cmd("time"))))
    return int(seconds) * 1000 + int(micros) // 1000


def run_steps(steps: Steps[T], client: Any, scripts: ScriptRunner) -> T:
    """Drive an operation on a sync client."""
    try:
        request = next(steps)
        while True:
            try:
                reply = _perform(request, client, scripts)
            except Exception as exc:
                request = steps.throw(exc)
            else:
                request = steps.send(reply)
    except StopIteration as done:
        result: T = done.value
        return result


async def run_steps_async(steps: Steps[T], client: Any, scripts: AsyncScriptRunner) -> T:
    """Drive an operation on a ``redis.asyncio`` client."""
    try:
        request = next(steps)
        while True:
            try:
                reply = await _perform_async(request, client, scripts)
            except Exception as exc:
                request = steps.throw(exc)
            else:
                request = steps.send(reply)
    except StopIteration as done:
        result: T = done.value
        return result


def _commands_of(request: Request) -> str:
    if isinstance(request, NodeScan):
        return "SCAN"
    if isinstance(request, (Commands, EachMaster)):
        return " ".join(sorted({c.name.upper() for c in request.cmds}))
    return ", ".join(sorted({c.script for c in request.calls}))


def _perform(request: Request, client: Any, scripts: ScriptRunner) -> Any:
    try:
        return _perform_raw(request, client, scripts)
    except redis.exceptions.ConnectionError as exc:
        if pool_exhausted(exc):
            raise exhausted(_commands_of(request)) from exc
        raise


async def _perform_async(request: Request, client: Any, scripts: AsyncScriptRunner) -> Any:
    try:
        return await _perform_async_raw(request, client, scripts)
    except redis.exceptions.ConnectionError as exc:
        if pool_exhausted(exc):
            raise exhausted(_commands_of(request)) from exc
        raise


def server_address(client: Any) -> str:
    """host:port, or the unix socket's path (the URL's credentials never appear)."""
    kwargs = client.connection_pool.connection_kwargs
    if kwargs.get("path"):
        return str(kwargs["path"])
    return f"{kwargs.get('host', '?')}:{kwargs.get('port', '?')}"


def _masters(client: Any) -> list[tuple[str, Any]]:
    """(address, node) of each master by address; (address, None) for a single server."""
    primaries = getattr(client, "get_primaries", None)
    if primaries is None:
        return [(server_address(client), None)]
    return sorted(((str(n.name), n) for n in primaries()), key=lambda found: found[0])


def _perform_raw(request: Request, client: Any, scripts: ScriptRunner) -> Any:
    if isinstance(request, EachMaster):
        out: list[tuple[str, Any]] = []
        for address, node in _masters(client):
            conn = client if node is None else client.get_redis_connection(node)
            try:
                out.append((address, _perform_raw(Commands(request.cmds), conn, scripts)))
            except (redis.exceptions.RedisError, OSError) as exc:
                out.append((address, exc))
        return out
    if isinstance(request, NodeScan):
        locate = getattr(client, "get_node_from_key", None)
        node = client if locate is None else client.get_redis_connection(locate(request.near))
        cursor, keys = node.scan(request.cursor, match=request.pattern, count=request.count)
        return int(cursor), list(keys)
    if isinstance(request, Commands) and len(request.cmds) == 1 and not request.atomic:
        # Alone, without a pipeline: a cluster pipeline refuses keyless commands (TIME).
        (c,) = request.cmds
        try:
            return [getattr(client, c.name)(*c.args, **c.kwargs)]
        except redis.exceptions.ResponseError as exc:
            return [exc]  # in its place, as a pipeline would give it
    if isinstance(request, Commands):
        pipe = client.pipeline(transaction=request.atomic)
        for c in request.cmds:
            getattr(pipe, c.name)(*c.args, **c.kwargs)
        return list(pipe.execute(raise_on_error=False))
    if isinstance(request, Scripts):
        if len(request.calls) == 1:  # no pipeline: its overhead matters at one enqueue
            return [scripts.run(request.calls[0])]
        return scripts.run_many(request.calls)
    return scripts.run_durable(
        request.calls, request.replicas, request.fsync, request.timeout_ms
    )


async def _on_node(client: Any, c: Cmd, node: Any) -> Any:
    try:
        return await getattr(client, c.name)(*c.args, **c.kwargs, target_nodes=node)
    except redis.exceptions.ResponseError as exc:
        return exc  # in its place, as a pipeline would give it


async def _perform_async_raw(
    request: Request, client: Any, scripts: AsyncScriptRunner
) -> Any:
    if isinstance(request, EachMaster):
        if hasattr(client, "get_primaries"):
            await client.initialize()  # an asyncio cluster client knows no node before it
        out: list[tuple[str, Any]] = []
        for address, node in _masters(client):
            try:
                if node is None:
                    replies = await _perform_async_raw(Commands(request.cmds), client, scripts)
                else:  # one node's commands, each sent to it alone
                    replies = [await _on_node(client, c, node) for c in request.cmds]
                out.append((address, replies))
            except (redis.exceptions.RedisError, OSError) as exc:
                out.append((address, exc))
        return out
    if isinstance(request, NodeScan):
        locate = getattr(client, "get_node_from_key", None)
        if locate is not None:
            await client.initialize()  # the slot map, which the client reads at first use
        where = {} if locate is None else {"target_nodes": locate(request.near)}
        cursor, keys = await client.scan(
            request.cursor, match=request.pattern, count=request.count, **where
        )
        if isinstance(cursor, dict):  # a cluster client names each node's cursor
            (cursor,) = cursor.values()
        return int(cursor), list(keys)
    if isinstance(request, Commands) and len(request.cmds) == 1 and not request.atomic:
        (c,) = request.cmds
        try:
            return [await getattr(client, c.name)(*c.args, **c.kwargs)]
        except redis.exceptions.ResponseError as exc:
            return [exc]
    if isinstance(request, Commands):
        pipe = client.pipeline(transaction=request.atomic)
        for c in request.cmds:
            getattr(pipe, c.name)(*c.args, **c.kwargs)
        return list(await pipe.execute(raise_on_error=False))
    if isinstance(request, Scripts):
        if len(request.calls) == 1:
            return [await scripts.run(request.calls[0])]
        return await scripts.run_many(request.calls)
    return await scripts.run_durable(
        request.calls, request.replicas, request.fsync, request.timeout_ms
    )
