"""asyncio twins of the sync clients: the worker's event loop reaches the same server(s) with
the same options (address, credentials, TLS, timeouts, decoding) as the sync JobQueue it is
given, so no second URL or client has to be configured, nor kept in step with the first.

On a Redis Cluster the twin is a ``ClusterTwin``: the sync client keeps the slot map (a
lookup in memory; a refresh is blocking I/O, run in a thread) and one asyncio client per
master sends that master's calls. Not redis-py's asyncio cluster client: its pipelines ask
one default node for every EVALSHA's keys, so with that node down every pipeline fails.

``ListWaits``: blocking pops on private connections, so that a cancelled wait (its reply
still to come) is dropped, never handed back to a pool that other calls use."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Sequence
from functools import cache
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.connection
import redis.asyncio.retry
import redis.backoff
import redis.cluster
import redis.connection

from jobqueue.errors import ConfigError
from jobqueue.store.connection import _PatientAsyncPool
from jobqueue.store.slot_map import follow_moved

_ASYNC_CONNECTIONS: dict[type, type] = {
    redis.connection.Connection: redis.asyncio.connection.Connection,
    redis.connection.SSLConnection: redis.asyncio.connection.SSLConnection,
    redis.connection.UnixDomainSocketConnection: (
        redis.asyncio.connection.UnixDomainSocketConnection
    ),
}
# redis-py's own (the stubs mypy reads lack from_pool)
_AsyncRedis: Any = redis.asyncio.Redis
# What a sync pool puts in its connections' options itself, as sync objects (a parser, a
# connect callback, maintenance-notification handlers...): the asyncio pool makes its own.
_POOL_MADE = frozenset({
    "retry", "parser_class", "redis_connect_func", "event_dispatcher", "command_packer",
    "encoder_class", "maint_notifications_config", "maint_notifications_pool_handler",
    "oss_cluster_maint_notifications_handler", "maintenance_state",
    "maintenance_notification_hash", "himport_registry", "orig_host_address",
    "orig_socket_timeout", "orig_socket_connect_timeout", "connection_class",
    "max_connections", "timeout",
})  # fmt: skip
# Options never dropped silently: a twin that cannot carry them is refused.
_GUARDED = frozenset({"username", "password", "credential_provider"})
# A blocking pop's reply may come this much after its own timeout before the wait gives up
# on the connection (when the client has no socket timeout of its own).
_REPLY_GRACE_S = 5.0
# On a cluster, one wake list at a time is waited on this long, in rotation.
CLUSTER_WAKE_S = 0.5


def async_twin(client: Any) -> Any:
    """An asyncio client on ``client``'s server(s) with its options: a ``FakeAsyncRedis`` on
    the same FakeServer, a ``redis.asyncio.Redis`` (its own pool, the async twin of the sync
    connection class), or a ``ClusterTwin``. The caller closes it (``await twin.aclose()``).
    Never re-sends a command (see ``connection._never_resend``), whatever the sync client's
    retry: a script call is not sent twice."""
    if type(client).__module__.startswith("fakeredis"):
        return _fake_twin(client)
    if isinstance(client, redis.cluster.RedisCluster):
        return ClusterTwin(client)
    if isinstance(client, redis.Redis):  # (a subclass's overrides are not mirrored)
        return _AsyncRedis.from_pool(_async_pool(client.connection_pool))
    raise ConfigError(
        f"no asyncio twin for a {type(client).__module__}.{type(client).__qualname__}: "
        "give the JobQueue a redis.Redis, a redis.cluster.RedisCluster or a fakeredis.FakeRedis"
    )


def _fake_twin(client: Any) -> Any:
    import fakeredis

    if not isinstance(client, fakeredis.FakeRedis):
        raise ConfigError(f"no asyncio twin for a {type(client).__qualname__}")
    kw = client.connection_pool.connection_kwargs
    same = (
        "version", "server_type", "lua_modules", "db", "username", "password", "client_name",
        "decode_responses", "encoding", "encoding_errors", "protocol",
    )  # fmt: skip
    return fakeredis.FakeAsyncRedis(server=kw["server"], **{k: kw[k] for k in same if k in kw})


@cache
def _accepted(cls: type) -> frozenset[str]:
    """The keyword options ``cls`` takes (its own and its bases')."""
    names: set[str] = set()
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None or klass is object:
            continue
        for name, param in inspect.signature(init).parameters.items():
            if param.kind not in (param.VAR_KEYWORD, param.VAR_POSITIONAL) and name != "self":
                names.add(name)
    return frozenset(names)


def _guarded(name: str) -> bool:
    return name in _GUARDED or name.startswith("ssl_")


def mirrored_options(connection_kwargs: dict[str, Any], async_class: type) -> dict[str, Any]:
    """The sync connection options ``async_class`` takes. One it refuses is dropped, unless
    it is a credential or a TLS setting that is set (OCSP checks: the asyncio TLS connection
    has none): then ConfigError, never a twin less strict than its original."""
    accepted = _accepted(async_class)
    out: dict[str, Any] = {}
    for name, value in connection_kwargs.items():
        if name in _POOL_MADE:
            continue
        if name in accepted:
            out[name] = value
        elif _guarded(name) and value:
            raise ConfigError(
                f"the asyncio client cannot carry the connection option {name} "
                f"({async_class.__qualname__} has no such setting)"
            )
    out["retry"] = redis.asyncio.retry.Retry(redis.backoff.NoBackoff(), 0)
    return out


def _async_pool(pool: Any) -> Any:
    """An asyncio pool like ``pool``: the same connection options and bound (blocking with
    the same wait when ``pool`` blocks)."""
    async_class = _ASYNC_CONNECTIONS.get(getattr(pool, "connection_class", None) or type(None))
    own_pool = type(pool) in (redis.ConnectionPool, redis.BlockingConnectionPool)
    if not own_pool or async_class is None:
        raise ConfigError(
            f"no asyncio twin for a {type(pool).__qualname__} of "
            f"{getattr(pool, 'connection_class', None)!r}: only redis-py's own pools of TCP, TLS "
            "and unix socket connections are mirrored"
        )
    options = mirrored_options(pool.connection_kwargs, async_class)
    if isinstance(pool, redis.BlockingConnectionPool):
        patient: Any = _PatientAsyncPool
        return patient(
            connection_class=async_class,
            max_connections=pool.max_connections,
            timeout=pool.timeout,
            **options,
        )
    return redis.asyncio.ConnectionPool(
        connection_class=async_class, max_connections=pool.max_connections, **options
    )


class ClusterTwin:
    """The asyncio face of a sync ``RedisCluster`` (not owned: ``aclose`` leaves it open)."""

    def __init__(self, sync: Any) -> None:
        self.sync = sync
        self._clients: dict[str, Any] = {}
        self._refresh_lock = asyncio.Lock()
        self._refreshes = 0

    def node_of(self, key: str) -> Any:
        """The master serving ``key``'s slot, from the map in memory (raises
        SlotNotCoveredError/RedisClusterException for a slot with no known master)."""
        return self.sync.get_node_from_key(key)

    def client_for(self, node: Any) -> Any:
        """The asyncio client of one master (made at first use, kept until aclose)."""
        client = self._clients.get(node.name)
        if client is None:
            pool = self.sync.get_redis_connection(node).connection_pool
            client = self._clients[node.name] = _AsyncRedis.from_pool(_async_pool(pool))
        return client

    def masters(self) -> list[Any]:
        return list(self.sync.get_primaries())

    def group_by_node(self, keys: Sequence[str]) -> list[list[int]]:
        """Indexes of ``keys`` grouped by the master serving them ("": no known master yet,
        a group of its own that fails alone)."""
        groups: dict[str, list[int]] = {}
        for i, key in enumerate(keys):
            try:
                name = self.node_of(key).name
            except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException):
                name = ""
            groups.setdefault(name, []).append(i)
        return list(groups.values())

    def follow_moved(self, moved: Sequence[redis.exceptions.MovedError]) -> None:
        """Point the slot of each MOVED reply at the master it names (in memory)."""
        follow_moved(self.sync, moved)

    async def refresh_slots(self) -> None:
        """Ask the cluster again which master serves which slot (after a lost node), in a
        thread: the sync client's refresh is blocking. Callers that arrive while one is
        under way share it."""
        seen = self._refreshes
        async with self._refresh_lock:
            if self._refreshes != seen:
                return
            nodes = getattr(self.sync, "nodes_manager", None)
            if nodes is not None:
                with contextlib.suppress(
                    redis.exceptions.RedisError, redis.exceptions.RedisClusterException
                ):
                    await asyncio.to_thread(nodes.initialize)
            self._refreshes += 1

    async def aclose(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            await client.aclose()


class ListWaits:
    """Blocking waits on wake lists, each on a connection of its own (made from the client's
    pool options, never taken from the pool). A wait that fails or is cancelled disconnects
    its connection; the next one connects again."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._idle: dict[str, list[tuple[Any, int | None]]] = {}
        self._open: set[Any] = set()
        self._rr = 0

    async def wait(self, keys: Sequence[str], timeout: float) -> str | None:
        """The key a token was popped from, or None after ``timeout`` seconds. On a cluster
        (one slot per blocking call) one key at a time, CLUSTER_WAKE_S each, in rotation;
        after each, one LLEN of every key per master: a key found holding a token is
        returned without popping it (a later wait takes it)."""
        timeout = max(timeout, 0.01)
        if not keys:
            await asyncio.sleep(timeout)
            return None
        if isinstance(self._client, ClusterTwin):
            return await self._wait_on_cluster(self._client, list(keys), timeout)
        return await self._blpop(self._client.connection_pool, "", list(keys), timeout)

    async def _wait_on_cluster(
        self, twin: ClusterTwin, keys: list[str], timeout: float
    ) -> str | None:
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while True:
            key = keys[self._rr % len(keys)]
            self._rr = (self._rr + 1) % len(keys)
            left = end - loop.time()
            node = twin.node_of(key)
            pool = twin.client_for(node).connection_pool
            try:
                wait_s = max(min(left, CLUSTER_WAKE_S), 0.01)
                got = await self._blpop(pool, node.name, [key], wait_s)
            except redis.exceptions.MovedError as exc:
                twin.follow_moved([exc])
                raise
            except redis.exceptions.ConnectionError:
                await twin.refresh_slots()
                raise
            if got is not None:
                return got
            if end - loop.time() <= 0:
                return None
            found = await self._first_not_empty(twin, keys)
            if found is not None:
                return found

    async def _first_not_empty(self, twin: ClusterTwin, keys: list[str]) -> str | None:
        """The first of ``keys`` holding a token: one pipelined LLEN per master, all masters
        at once. A master that fails is passed over (its own keys' waits report it) unless
        every one failed."""

        async def lengths(indexes: list[int]) -> list[int]:
            pipe = twin.client_for(twin.node_of(keys[indexes[0]])).pipeline(transaction=False)
            for i in indexes:
                pipe.llen(keys[i])
            return list(await pipe.execute())

        groups = twin.group_by_node(keys)
        answers = await asyncio.gather(*(lengths(g) for g in groups), return_exceptions=True)
        errors = [a for a in answers if isinstance(a, BaseException)]
        if errors and len(errors) == len(answers):
            await twin.refresh_slots()
            raise errors[0]
        filled: set[int] = set()
        for indexes, answer in zip(groups, answers, strict=True):
            if not isinstance(answer, BaseException):
                filled.update(i for i, n in zip(indexes, answer, strict=True) if n)
        return keys[min(filled)] if filled else None

    async def _blpop(self, pool: Any, name: str, keys: list[str], timeout: float) -> str | None:
        conn, fake_id = await self._take(pool, name)
        grace = pool.connection_kwargs.get("socket_timeout") or _REPLY_GRACE_S
        try:
            await conn.send_command("BLPOP", *keys, timeout)
            try:
                async with asyncio.timeout(timeout + grace):
                    reply = await conn.read_response()
            except TimeoutError:
                raise redis.exceptions.TimeoutError(
                    f"no reply to BLPOP within {timeout + grace:g}s"
                ) from None
        except BaseException:  # cancelled, timed out, lost: the reply may still come
            self._open.discard(conn)
            with contextlib.suppress(Exception):
                await conn.disconnect(nowait=True)
            if fake_id is not None:
                # fakeredis keeps a disconnected client's BLPOP blocked: it would take the
                # next token pushed. A real server drops it with the connection.
                with contextlib.suppress(Exception):
                    await self._client.execute_command("CLIENT", "UNBLOCK", fake_id)
            raise
        self._idle.setdefault(name, []).append((conn, fake_id))
        if not reply:
            return None
        key = reply[0]
        return key.decode() if isinstance(key, bytes) else str(key)

    async def _take(self, pool: Any, name: str) -> tuple[Any, int | None]:
        """An idle connection of this node's, else a new one, with its client id on fakeredis
        (see _blpop)."""
        idle = self._idle.get(name)
        if idle:
            return idle.pop()
        # no socket timeout: the wait bounds its own read (the BLPOP's timeout plus a grace)
        conn = pool.connection_class(**{**pool.connection_kwargs, "socket_timeout": None})
        self._open.add(conn)
        fake_id = None
        if type(conn).__module__.startswith("fakeredis"):
            await conn.send_command("CLIENT", "ID")
            fake_id = int(await conn.read_response())
        return conn, fake_id

    async def aclose(self) -> None:
        conns, self._open, self._idle = list(self._open), set(), {}
        for conn in conns:
            with contextlib.suppress(Exception):
                await conn.disconnect()
