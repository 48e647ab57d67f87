"""The Lua scripts: found on disk, hashed locally, called by SHA, reloaded after NOSCRIPT.

One ``Call`` describes one script invocation (name, keys, args). The sync and asyncio runners
below are the only code that talks to Redis about scripts; everything else builds Calls and
parses replies through the scripts' contracts (see ``contract``), so the two flavours share
all logic but the I/O.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, NamedTuple

import redis

from jobqueue.errors import (
    ConfigError,
    ConnectionFailed,
    GroupFull,
    ScriptError,
    ServerRefused,
)
from jobqueue.store.connection import exhausted, pool_exhausted
from jobqueue.store.slot_map import follow_moved
from jobqueue.store.twin import ClusterTwin, ListWaits

SCRIPT_NAMES = (
    "create_run",
    "claim",
    "group_set",
    "permit_take",
    "permit_settle",
    "global_limit",
    "heartbeat",
    "complete",
    "fail",
    "cancel",
    "release",
    "bounce",
    "requeue",
    "fenced_write",
    "progress",
    "purge",
    "sched_due",
    "advance",
    "sched_define",
    "sched_create",
    "sched_release",
    "sched_unhold",
    "repair",
    "sched_lease",
    "pause",
    "set_limit",
    "dedupe",
    "flow_create",
    "attach",
    "extend",
    "deliver",
    "relayed",
    "flow_tidy",
    "flow_commit",
    "flow_abort",
    "read_records",
    "index_page",
)
LIB = "lib"  # lua/lib/<name>.lua: the helpers scripts include ("-- uses: name, ...")
CORE = "core"  # lua/lib/core.lua: the vocabulary every script uses (clock, read, ...)

ArgT = str | int | float | bytes


def lua_dir() -> Path:
    """The wheel ships the scripts inside the package; a source checkout keeps them at the top."""
    package = Path(__file__).resolve().parent.parent  # jobqueue/
    for candidate in (package / "lua", package.parent / "lua"):
        if (candidate / LIB / f"{CORE}.lua").is_file():
            return candidate
    raise ScriptError(f"jobqueue's Lua scripts are missing (looked in {package / 'lua'})")


# -- includes ----------------------------------------------------------------------------------
# A script's header names the libs it calls on one line, '-- uses: core, fences'; each lib
# (lua/lib/<name>.lua) names its own the same way ('-- uses: (none)' for none). Loading a
# script puts the libs it needs, transitively, before its text: each once, every lib after the
# libs it uses, in the order the 'uses' lines give. The result is one chunk, as Redis runs it
# (a lib's locals are the script's: Lua allows 200 in a chunk, checked here).

_USES = re.compile(r"^-- uses:(.*)$", re.M)
_LIB_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_MAX_LOCALS = 200  # Lua's limit per function, the chunk included
_TOP_LOCAL = re.compile(r"^local (?:function (\w+)|([\w, ]+?)\s*=)", re.M)


def header_of(text: str) -> str:
    """A Lua file's leading comment block."""
    lines = []
    for line in text.splitlines():
        if not line.startswith("--"):
            break
        lines.append(line)
    return "\n".join(lines)


def uses(text: str, what: str = "script") -> tuple[str, ...]:
    """The libs a file's header names on its '-- uses:' line (one such line, required)."""
    header = header_of(text).splitlines()
    at = [i for i, line in enumerate(header) if _USES.match(line)]
    if len(at) != 1:
        raise ScriptError(f"{what}: its header needs one '-- uses: lib, ...' line "
                          f"(found {len(at)})")
    listed = header[at[0]][len("-- uses:"):].strip()
    for line in header[at[0] + 1:]:  # a list ending in ',' goes on: '--       more, names'
        if not listed.endswith(","):
            break
        listed += " " + line[2:].strip()
    names = tuple(n.strip() for n in listed.split(",") if n.strip())
    if names == ("(none)",):
        return ()
    for name in names:
        if not _LIB_NAME.match(name):
            raise ScriptError(f"{what}: '-- uses:' names {name!r}, not a lib name")
    if len(set(names)) != len(names):
        raise ScriptError(f"{what}: '-- uses:' names a lib twice: {', '.join(names)}")
    return names


def includes(
    text: str, what: str, read: Callable[[str, list[str]], str] | None = None
) -> list[str]:
    """The libs a file needs, transitively, in load order: each after the libs it uses, each
    once. ``read(name)`` gives a lib's text (lua/lib/<name>.lua by default). A lib that does
    not exist, or a cycle, is a ScriptError naming the chain."""
    directory = None if read is not None else lua_dir() / LIB

    def text_of(name: str, chain: list[str]) -> str:
        if read is not None:
            return read(name, chain)
        assert directory is not None
        path = directory / f"{name}.lua"
        if not path.is_file():
            raise ScriptError(f"{' -> '.join(chain)} uses {name}, but lua/lib/{name}.lua "
                              "does not exist")
        return path.read_text()

    order: list[str] = []
    visiting: list[str] = []

    def visit(name: str, chain: list[str]) -> None:
        if name in order:
            return
        if name in visiting:
            raise ScriptError(f"include cycle: {' -> '.join([*chain, name])}")
        visiting.append(name)
        for dep in uses(text_of(name, chain), f"lib/{name}.lua"):
            visit(dep, [*chain, name])
        visiting.remove(name)
        order.append(name)

    for name in uses(text, what):
        visit(name, [what])
    return order


def assemble(text: str, what: str = "script") -> str:
    """A script's text with the libs it uses before it: what Redis is given."""
    directory = lua_dir() / LIB
    parts = [(directory / f"{lib}.lua").read_text() for lib in includes(text, what)]
    whole = "\n".join([*parts, text])
    n = sum(
        1 if m.group(1) else len(m.group(2).split(","))
        for m in _TOP_LOCAL.finditer(whole)
    )
    if n > _MAX_LOCALS:
        raise ScriptError(f"{what} has {n} top-level locals with its libs; Lua allows "
                          f"{_MAX_LOCALS} (split a lib, or keep state in a table)")
    return whole


@dataclass(frozen=True)
class Script:
    """One script's source in two forms. ``source`` starts with a '#!lua' line: Redis and
    Valkey 7+ then refuse a writing script whole under maxmemory (OOM) instead of letting it
    run past its first write, and a read-only one ('-- Flags: no-writes' in its header) runs
    on replicas and under OOM. ``plain`` has no such line, for servers that cannot parse one
    (fakeredis, Redis before 7); there every write script's first write is one Redis refuses
    under OOM, so the effect is the same."""

    name: str
    source: str
    sha: str
    plain: str
    plain_sha: str


_FLAGS = re.compile(r"^-- Flags: ([a-z-]+(?:,[a-z-]+)*)", re.M)


@cache
def scripts() -> dict[str, Script]:
    directory = lua_dir()
    out = {}
    for name in SCRIPT_NAMES:
        body = (directory / f"{name}.lua").read_text()
        flags = _FLAGS.search(header_of(body))
        shebang = "#!lua" + (f" flags={flags.group(1)}" if flags else "")
        plain = assemble(body, f"{name}.lua")
        source = shebang + "\n" + plain
        out[name] = Script(
            name, source, _sha(source), plain, _sha(plain)
        )
    return out


def _sha(source: str) -> str:
    return hashlib.sha1(source.encode()).hexdigest()


class Call(NamedTuple):
    """One script invocation (a tuple: cheap to build on the per-run paths)."""

    script: str
    keys: tuple[str, ...]
    args: tuple[ArgT, ...]


def _is_noscript(exc: BaseException) -> bool:
    return isinstance(exc, redis.exceptions.NoScriptError) or (
        isinstance(exc, redis.exceptions.ResponseError) and str(exc).startswith("NOSCRIPT")
    )


# A cluster in the middle of a failover: no master for a slot yet (CLUSTERDOWN, MASTERDOWN,
# TRYAGAIN, a slot redis-py cannot place). Like a lost connection it passes; callers that
# retry connection failures (the worker, the scheduler) retry these too.
_CLUSTER_TRANSIENT = (
    redis.exceptions.ClusterDownError,
    redis.exceptions.TryAgainError,
    redis.exceptions.SlotNotCoveredError,
    redis.exceptions.ClusterError,  # redis-py's "TTL exhausted": redirected too often
)
# Errors a RedisCluster raises that are not RedisErrors.
_CLUSTER_ERRORS = (redis.exceptions.RedisClusterException,)
# Error replies that mean "not now", the call not executed: memory full (noeviction), a
# replica or a demoted master, a busy script, a replica without its master, too few
# replicas, a dataset still loading.
_REFUSED_FOR_NOW = (
    "OOM", "READONLY", "BUSY", "MASTERDOWN", "NOREPLICAS", "LOADING",
    "TRYLATER",  # a jobqueue script met a key that is on another node (lua/lib/core.lua)
    "NOSCRIPT",  # still, after the scripts were loaded again (see _RESENDS)
    "UNBLOCKED",  # a blocking wait ended by its server's demotion (a failover)
)


# redis-py strips the code of the replies it has a class for (OOM, READONLY, ...).
# TRYAGAIN: a multi-key call during a slot migration, or a jobqueue script that found a key
# on another node before its first write: it did not run.
_REFUSED_CLASSES: tuple[type[Exception], ...] = tuple(
    getattr(redis.exceptions, name)
    for name in (
        "OutOfMemoryError", "ReadOnlyError", "BusyLoadingError", "MasterDownError",
        "TryAgainError", "MovedError", "AskError", "NoScriptError",
    )
    if hasattr(redis.exceptions, name)
)


def refused_for_now(exc: BaseException) -> bool:
    if isinstance(exc, _REFUSED_CLASSES):
        return True
    if not isinstance(exc, redis.exceptions.ResponseError):
        return False
    return str(exc).split(" ", 1)[0] in _REFUSED_FOR_NOW


def translate_error(call: Call, exc: BaseException) -> Exception:
    if pool_exhausted(exc):
        return exhausted(call.script)
    if refused_for_now(exc):
        return ServerRefused(f"Redis refused {call.script} for now: {exc}")
    if isinstance(exc, redis.exceptions.AuthenticationError | redis.exceptions.ConnectionError):
        return ConnectionFailed(f"Redis connection failed during {call.script}: {exc}")
    if isinstance(exc, redis.exceptions.TimeoutError):
        return ConnectionFailed(f"Redis timed out during {call.script}: {exc}")
    if isinstance(exc, (*_CLUSTER_TRANSIENT, redis.exceptions.RedisClusterException)):
        # Also redis-py's own "TTL exhausted" (redirected too often: a slot moving) and a
        # slot with no known master yet.
        return ConnectionFailed(f"Redis Cluster unavailable during {call.script}: {exc}")
    text = str(exc)
    if "jobqueue: group full: " in text:
        return GroupFull(text.split("jobqueue: group full: ", 1)[1])
    return ScriptError(f"script {call.script} failed: {exc}")


def _noscript(replies: Sequence[Any]) -> list[int]:
    """Indexes of pipelined calls the server refused with NOSCRIPT (to reload and re-send)."""
    return [i for i, r in enumerate(replies) if _is_noscript(r)]


def _fill(replies: list[Any], indexes: Sequence[int], again: Sequence[Any]) -> None:
    for i, reply in zip(indexes, again, strict=True):
        replies[i] = reply


def _checked(calls: Sequence[Call], replies: list[Any]) -> list[Any]:
    """The replies, or the first error reply raised as jobqueue's error for its call."""
    for call, reply in zip(calls, replies, strict=True):
        if isinstance(reply, Exception):
            error = translate_error(call, reply)
            if isinstance(error, ServerRefused):
                error.replies = replies
            raise error from reply
    return replies


def _raise_first_error(replies: list[Any]) -> list[Any]:
    """The replies, or the first error among them raised (a ServerRefused carrying every
    reply: the caller re-sends only the calls that did not run)."""
    for reply in replies:
        if isinstance(reply, Exception):
            if isinstance(reply, ServerRefused):
                reply.replies = replies
            raise reply
    return replies


def _shebang_refused(exc: BaseException) -> bool:
    """The server cannot parse a '#!lua' line (fakeredis, Redis before 7): use plain sources."""
    return isinstance(exc, redis.exceptions.ResponseError) and "near '#'" in str(exc)


class _Sources:
    """Which form of the scripts a server takes (see Script); learnt at the first refusal."""

    def __init__(self) -> None:
        self.plain = False

    def source(self, name: str) -> str:
        script = scripts()[name]
        return script.plain if self.plain else script.source

    def evalsha_args(self, call: Call) -> tuple[Any, ...]:
        script = scripts()[call.script]
        sha = script.plain_sha if self.plain else script.sha
        return (sha, len(call.keys), *call.keys, *call.args)

    def learn(self, exc: BaseException) -> bool:
        """True if exc says the server needs the plain form (then used from now on). Also
        when another thread learnt it first: a call sent in the '#!lua' form meanwhile did
        not run and is sent again."""
        if not _shebang_refused(exc):
            return False
        self.plain = True
        return True


class ScriptRunner:
    """Runs Calls on a synchronous client (Redis or RedisCluster)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self._sources = _Sources()
        self._cluster = isinstance(client, redis.cluster.RedisCluster)

    def load(self, names: Sequence[str] | None = None) -> None:
        for name in names or SCRIPT_NAMES:
            try:
                self.client.script_load(self._sources.source(name))
            except redis.exceptions.ResponseError as exc:
                if not self._sources.learn(exc):
                    raise
                self.client.script_load(self._sources.source(name))

    def _evalsha(self, call: Call) -> Any:
        return self.client.evalsha(*self._sources.evalsha_args(call))

    def run(self, call: Call) -> Any:
        try:
            for attempt in range(_RECOVERIES + 1):
                try:
                    return self._evalsha(call)
                except redis.exceptions.ResponseError as exc:
                    # NOSCRIPT (a restarted or promoted server has an empty script cache) or
                    # a shebang it cannot parse: the call did not run; load and send again.
                    if attempt == _RECOVERIES or not _reload(exc, self._sources):
                        raise
                    self.load([call.script])
            raise AssertionError("unreachable")
        except (redis.exceptions.RedisError, *_CLUSTER_ERRORS) as exc:
            raise translate_error(call, exc) from exc

    def _pipelined(self, calls: Sequence[Call]) -> list[Any]:
        if self._cluster:
            return self._pipelined_on_masters(calls)
        pipe = self.client.pipeline(transaction=False)
        for call in calls:
            pipe.execute_command("EVALSHA", *self._sources.evalsha_args(call))
        return list(pipe.execute(raise_on_error=False))

    def _pipelined_on_masters(self, calls: Sequence[Call]) -> list[Any]:
        """On a cluster: one plain pipeline per master, sent to it directly. Not redis-py's
        ClusterPipeline: it asks its default node for the keys of every EVALSHA (COMMAND
        GETKEYS), so with that one node down every pipeline fails, whatever its slots. A
        redirection (MOVED after a failover, ASK during a slot migration) comes back as that
        call's reply: the call did not run (see run_many_replies, which sends a MOVED call
        again to the master it names)."""
        replies: list[Any] = [None] * len(calls)
        for indexes in self._by_node(calls):
            node = self.client.get_node_from_key(calls[indexes[0]].keys[0])
            pipe = self.client.get_redis_connection(node).pipeline(transaction=False)
            for i in indexes:
                pipe.execute_command("EVALSHA", *self._sources.evalsha_args(calls[i]))
            try:
                got = pipe.execute(raise_on_error=False)
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
                self._refresh_slots()
                raise
            for i, reply in zip(indexes, got, strict=True):
                replies[i] = reply
        return replies

    def _refresh_slots(self) -> None:
        """Ask the cluster again which master serves which slot (after a failover, a lost
        node, a MOVED): as redis-py itself does after a failed command."""
        nodes = getattr(self.client, "nodes_manager", None)
        if nodes is not None:
            with contextlib.suppress(redis.exceptions.RedisError, *_CLUSTER_ERRORS):
                nodes.initialize()

    def run_many(self, calls: Sequence[Call]) -> list[Any]:
        """One pipelined round trip; calls refused with NOSCRIPT (or a shebang the server
        cannot parse) did not run: they are reloaded and re-sent alone, so no call runs
        twice. The first error reply is raised (a ServerRefused carries every reply)."""
        if not calls:
            return []
        replies = self.run_many_replies(calls)
        return _raise_first_error(replies)

    def run_each(self, calls: Sequence[Call]) -> list[Any]:
        """Every call's reply, or the jobqueue error it met, as a value: nothing is raised.
        On a Redis Cluster the calls go out in one pipeline per master, so a master that is
        down (or refuses, or times out) fails its own calls only, never the others'. A
        ConnectionFailed value means the call may or may not have run (a timeout); a
        ServerRefused value that it did not run."""
        if not calls:
            return []
        out: list[Any] = [None] * len(calls)
        for indexes in self._by_node(calls):
            group = [calls[i] for i in indexes]
            try:
                replies = self.run_many_replies(group)
            except (ConnectionFailed, ScriptError) as exc:
                replies = [exc] * len(group)
            for i, reply in zip(indexes, replies, strict=True):
                out[i] = reply
        return out

    def run_many_replies(self, calls: Sequence[Call]) -> list[Any]:
        """run_many, with each error reply translated and returned in its call's place (a lost
        connection still raises: it concerns every call)."""
        try:
            replies: list[Any] = self._pipelined(calls)
            for _ in range(_RESENDS):
                again = _not_run(replies, self._sources)
                moved = _redirected(replies)
                if not again and not moved:
                    break
                follow_moved(self.client, [replies[i] for i in moved])
                if again:
                    self.load(sorted({calls[i].script for i in again}))
                resend = sorted(set(again) | set(moved))
                _fill(replies, resend, self._pipelined([calls[i] for i in resend]))
        except (redis.exceptions.RedisError, *_CLUSTER_ERRORS) as exc:
            raise translate_error(calls[0], exc) from exc
        return [
            translate_error(call, reply) if isinstance(reply, Exception) else reply
            for call, reply in zip(calls, replies, strict=True)
        ]

    def run_durable(
        self, calls: Sequence[Call], replicas: int, fsync: bool, timeout_ms: int
    ) -> tuple[list[Any], bool]:
        """run_many, then, on the same connection (WAIT counts the writes of its own
        connection), WAIT for ``replicas`` replicas, or WAITAOF when ``fsync`` (the master's
        AOF on disk too). Returns the replies (raising as run_many does) and whether every
        connection's writes were acknowledged within the timeout."""
        durable = True
        replies: list[Any] = [None] * len(calls)
        for indexes in self._by_node(calls):
            group = [calls[i] for i in indexes]
            got, acked = self._durable_group(group, replicas, fsync, timeout_ms)
            durable = durable and acked
            for i, reply in zip(indexes, got, strict=True):
                replies[i] = reply
        return _checked(calls, replies), durable

    def _durable_group(
        self, calls: Sequence[Call], replicas: int, fsync: bool, timeout_ms: int
    ) -> tuple[list[Any], bool]:
        wait = _wait_command(replicas, fsync, timeout_ms)
        try:
            for _ in range(_RECOVERIES + 1):
                commands = _durable_commands(calls, wait, self._sources)
                replies = self._on_one_connection(commands, calls[0])
                replies = [*replies[:-2], replies[-1]]
                again = _not_run(replies[:-1], self._sources)
                if not again:
                    break
                self.load(sorted({calls[i].script for i in again}))
        except (redis.exceptions.RedisError, *_CLUSTER_ERRORS) as exc:
            raise translate_error(calls[0], exc) from exc
        return list(replies[:-1]), _acknowledged(replies[-1], wait, replicas, fsync)

    def _on_one_connection(self, commands: Sequence[tuple[Any, ...]], first: Call) -> list[Any]:
        if self._cluster:
            node = self.client.get_node_from_key(first.keys[0])
            pipe = self.client.get_redis_connection(node).pipeline(transaction=False)
        else:
            pipe = self.client.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)
        return list(pipe.execute(raise_on_error=False))

    def _by_node(self, calls: Sequence[Call]) -> list[list[int]]:
        """Indexes of the calls, grouped by the cluster master that serves their slot (one
        group on a single server)."""
        locate = getattr(self.client, "get_node_from_key", None)
        if locate is None:
            return [list(range(len(calls)))]
        groups: dict[str, list[int]] = {}
        for i, call in enumerate(calls):
            try:
                node = locate(call.keys[0]).name
            except (redis.exceptions.RedisError, *_CLUSTER_ERRORS):
                node = ""  # a slot with no known master yet: tried on its own
            groups.setdefault(node, []).append(i)
        return list(groups.values())


# NOSCRIPT, then (the first time) a shebang the server cannot parse: two reloads at most.
_RECOVERIES = 2
# A pipelined call may take more sends: MOVED to the master that took its slot over (a second
# time when the first redirection came from a node that had not heard of a failover yet),
# then NOSCRIPT there (a promoted replica's script cache is empty), then the reloads above.
# Each send carries only the calls that did not run.
_RESENDS = 5


def _reload(exc: BaseException, sources: _Sources) -> bool:
    return _is_noscript(exc) or sources.learn(exc)


def _not_run(replies: Sequence[Any], sources: _Sources) -> list[int]:
    """Indexes of pipelined calls that did not run for want of their script (NOSCRIPT, or the
    server refusing the '#!lua' form): reload and re-send those."""
    refused = [i for i, r in enumerate(replies) if _shebang_refused(r)]
    if refused:
        sources.learn(replies[refused[0]])
    return sorted(set(_noscript(replies)) | set(refused))


def _redirected(replies: Sequence[Any]) -> list[int]:
    """Indexes of pipelined cluster calls answered MOVED: they did not run, and are sent again
    to the master the reply names (jobqueue.store.slot_map). Not ASK (a slot migrating):
    those did not run either, and wait for the migration's end."""
    return [i for i, r in enumerate(replies) if isinstance(r, redis.exceptions.MovedError)]


def _wait_command(replicas: int, fsync: bool, timeout_ms: int) -> tuple[Any, ...]:
    return ("WAITAOF", 1, replicas, timeout_ms) if fsync else ("WAIT", replicas, timeout_ms)


def _durable_commands(
    calls: Sequence[Call], wait: tuple[Any, ...], sources: _Sources
) -> list[tuple[Any, ...]]:
    """The calls, a mark, then WAIT, all for one connection. WAIT covers the writes of its own
    connection only, and a call that finds its run already there (an enqueue sent again)
    writes nothing: one small write of this connection, after the calls, makes WAIT cover
    everything the master had by then, whoever wrote it. In the calls' slot (a cluster node
    serves its own slots)."""
    tag = calls[0].keys[0].split("}", 1)[0] + "}"
    mark = ("SET", f"{tag}:durable", "1", "PX", 60_000)
    return [*(("EVALSHA", *sources.evalsha_args(c)) for c in calls), mark, wait]


def _acknowledged(answer: Any, wait: tuple[Any, ...], replicas: int, fsync: bool) -> bool:
    """Whether WAIT's (or WAITAOF's) answer counts enough acknowledgements."""
    if isinstance(answer, Exception):
        text = str(answer)
        if "unknown command" in text.lower():
            raise ConfigError(f"durable writes need {wait[0]}, which this server lacks "
                              f"({'Redis >= 7.2' if fsync else 'Redis >= 3.0'}): {text}")
        raise ConfigError(f"{wait[0]} refused: {text}")
    if fsync:
        return int(answer[0]) >= 1 and int(answer[1]) >= replicas
    return int(answer) >= replicas


class AsyncScriptRunner:
    """ScriptRunner for asyncio clients: a redis.asyncio.Redis (or FakeAsyncRedis), a
    ``ClusterTwin`` (see ``twin``: one pipeline per master, as ScriptRunner on a cluster),
    or redis.asyncio's RedisCluster (AsyncJobQueue's; run and run_many only). The twin of a
    sync client comes from ``twin.async_twin``."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self._sources = _Sources()
        self._twin: ClusterTwin | None = client if isinstance(client, ClusterTwin) else None
        self._native_cluster = self._twin is None and hasattr(client, "get_node_from_key")
        self._waits: ListWaits | None = None

    async def aclose(self) -> None:
        """Close what the runner opened (its blocking-wait connections); the client is the
        caller's."""
        if self._waits is not None:
            await self._waits.aclose()

    async def load(self, names: Sequence[str] | None = None, keys: Sequence[str] = ()) -> None:
        """Load the scripts. On a twinned cluster: on the masters serving ``keys`` (the ones
        that answered NOSCRIPT), every master when none are given."""
        names = list(names or SCRIPT_NAMES)
        if self._twin is None:
            await self._load_on(self.client, names)
            return
        twin = self._twin
        targets = [twin.node_of(key) for key in keys] if keys else twin.masters()
        nodes = {node.name: node for node in targets}
        await _gather_or_raise(
            [self._load_on(twin.client_for(node), names) for node in nodes.values()]
        )

    async def _load_on(self, client: Any, names: Sequence[str]) -> None:
        for name in names:
            try:
                await client.script_load(self._sources.source(name))
            except redis.exceptions.ResponseError as exc:
                if not self._sources.learn(exc):
                    raise
                await client.script_load(self._sources.source(name))

    async def run(self, call: Call) -> Any:
        if self._twin is not None:
            (reply,) = await self.run_many([call])
            return reply
        try:
            for attempt in range(_RECOVERIES + 1):
                try:
                    return await self.client.evalsha(*self._sources.evalsha_args(call))
                except redis.exceptions.ResponseError as exc:
                    if attempt == _RECOVERIES or not _reload(exc, self._sources):
                        raise
                    await self.load([call.script])
            raise AssertionError("unreachable")
        except (redis.exceptions.RedisError, *_CLUSTER_ERRORS) as exc:
            raise translate_error(call, exc) from exc

    async def _pipelined(self, calls: Sequence[Call]) -> list[Any]:
        if self._twin is not None:
            return await self._pipelined_on_masters(self._twin, calls)
        pipe = self.client.pipeline(transaction=False)
        for call in calls:
            pipe.execute_command("EVALSHA", *self._sources.evalsha_args(call))
        return list(await pipe.execute(raise_on_error=False))

    async def _pipelined_on_masters(self, twin: ClusterTwin, calls: Sequence[Call]) -> list[Any]:
        """ScriptRunner._pipelined_on_masters, every master's pipeline at once. When one
        fails the others still finish (their replies are read) before its error is raised."""
        replies: list[Any] = [None] * len(calls)

        async def send(indexes: list[int]) -> None:
            node = twin.node_of(calls[indexes[0]].keys[0])
            pipe = twin.client_for(node).pipeline(transaction=False)
            for i in indexes:
                pipe.execute_command("EVALSHA", *self._sources.evalsha_args(calls[i]))
            try:
                got = await pipe.execute(raise_on_error=False)
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
                await twin.refresh_slots()
                raise
            for i, reply in zip(indexes, got, strict=True):
                replies[i] = reply

        await _gather_or_raise([send(indexes) for indexes in self._by_node(calls)])
        return replies

    async def run_many(self, calls: Sequence[Call]) -> list[Any]:
        """ScriptRunner.run_many: one pipelined round trip (one per master on a twinned
        cluster); the first error reply is raised (a ServerRefused carries every reply)."""
        if not calls:
            return []
        replies = await self.run_many_replies(calls)
        return _raise_first_error(replies)

    async def run_many_replies(self, calls: Sequence[Call]) -> list[Any]:
        """ScriptRunner.run_many_replies: each error reply translated and returned in its
        call's place; a lost connection raises. Calls that did not run (NOSCRIPT, a shebang
        refused, MOVED) are sent again, those alone."""
        if not calls:
            return []
        try:
            replies: list[Any] = await self._pipelined(calls)
            for _ in range(_RESENDS):
                again = _not_run(replies, self._sources)
                moved = _redirected(replies)
                if not again and not moved:
                    break
                if self._twin is not None:
                    self._twin.follow_moved([replies[i] for i in moved])
                if again:
                    await self.load(
                        sorted({calls[i].script for i in again}),
                        keys=[calls[i].keys[0] for i in again],
                    )
                resend = sorted(set(again) | set(moved))
                _fill(replies, resend, await self._pipelined([calls[i] for i in resend]))
        except (redis.exceptions.RedisError, *_CLUSTER_ERRORS) as exc:
            raise translate_error(calls[0], exc) from exc
        return [
            translate_error(call, reply) if isinstance(reply, Exception) else reply
            for call, reply in zip(calls, replies, strict=True)
        ]

    async def run_each(self, calls: Sequence[Call]) -> list[Any]:
        """ScriptRunner.run_each: every call's reply, or the jobqueue error it met, as a
        value. On a twinned cluster each master's calls go out in a pipeline of their own,
        all masters at once: one that is down, refuses or times out fails its calls only."""
        self._refuse_native_cluster("run_each")
        if not calls:
            return []
        out: list[Any] = [None] * len(calls)

        async def group(indexes: list[int]) -> None:
            part = [calls[i] for i in indexes]
            try:
                replies = await self.run_many_replies(part)
            except (ConnectionFailed, ScriptError) as exc:
                replies = [exc] * len(part)
            for i, reply in zip(indexes, replies, strict=True):
                out[i] = reply

        await asyncio.gather(*(group(indexes) for indexes in self._by_node(calls)))
        return out

    async def run_durable(
        self, calls: Sequence[Call], replicas: int, fsync: bool, timeout_ms: int
    ) -> tuple[list[Any], bool]:
        """ScriptRunner.run_durable: per master on a twinned cluster (all at once), the
        calls then WAIT (or WAITAOF) on one connection (an asyncio pipeline keeps to one)."""
        if self._native_cluster:
            raise ConfigError(
                "durable writes (Settings.durable_replicas/durable_fsync) from the asyncio "
                "client need a single server; on a Redis Cluster enqueue with the sync JobQueue"
            )
        if not calls:
            return [], True
        replies: list[Any] = [None] * len(calls)
        acked: list[bool] = []

        async def group(indexes: list[int]) -> None:
            got, ok = await self._durable_group(
                [calls[i] for i in indexes], replicas, fsync, timeout_ms
            )
            acked.append(ok)
            for i, reply in zip(indexes, got, strict=True):
                replies[i] = reply

        await _gather_or_raise([group(indexes) for indexes in self._by_node(calls)])
        return _checked(calls, replies), all(acked)

    async def _durable_group(
        self, calls: Sequence[Call], replicas: int, fsync: bool, timeout_ms: int
    ) -> tuple[list[Any], bool]:
        wait = _wait_command(replicas, fsync, timeout_ms)
        try:
            client = self.client
            if self._twin is not None:
                client = self._twin.client_for(self._twin.node_of(calls[0].keys[0]))
            for _ in range(_RECOVERIES + 1):
                pipe = client.pipeline(transaction=False)
                for command in _durable_commands(calls, wait, self._sources):
                    pipe.execute_command(*command)
                replies = list(await pipe.execute(raise_on_error=False))
                replies = [*replies[:-2], replies[-1]]
                again = _not_run(replies[:-1], self._sources)
                if not again:
                    break
                await self.load(
                    sorted({calls[i].script for i in again}), keys=[calls[0].keys[0]]
                )
        except (redis.exceptions.RedisError, *_CLUSTER_ERRORS) as exc:
            raise translate_error(calls[0], exc) from exc
        return list(replies[:-1]), _acknowledged(replies[-1], wait, replicas, fsync)

    async def wait_on_lists(self, keys: list[str], timeout: float) -> str | None:
        """Block until a token is pushed to one of ``keys`` (wake lists): the key it was
        popped from, or None after ``timeout`` seconds. One BLPOP over every key on a single
        server; on a twinned cluster see ``ListWaits.wait``. On a connection of its own:
        cancelling the awaiting task leaves the client's pool clean."""
        self._refuse_native_cluster("wait_on_lists")
        if self._waits is None:
            self._waits = ListWaits(self.client)
        try:
            return await self._waits.wait(keys, timeout)
        except (redis.exceptions.RedisError, *_CLUSTER_ERRORS) as exc:
            raise translate_error(Call("wait_on_lists", tuple(keys), ()), exc) from exc

    def _by_node(self, calls: Sequence[Call]) -> list[list[int]]:
        if self._twin is None:
            return [list(range(len(calls)))]
        return self._twin.group_by_node([c.keys[0] for c in calls])

    def _refuse_native_cluster(self, what: str) -> None:
        if self._native_cluster:
            raise ConfigError(
                f"{what} on a Redis Cluster needs the asyncio twin of a sync RedisCluster "
                "(jobqueue.store.twin.async_twin), not redis.asyncio's RedisCluster"
            )


async def _gather_or_raise(steps: Sequence[Coroutine[Any, Any, Any]]) -> None:
    """Run every step to its end, then raise the first error met (none is abandoned midway:
    a pipeline cut off with its replies unread would leave calls that ran unreported)."""
    results = await asyncio.gather(*steps, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
