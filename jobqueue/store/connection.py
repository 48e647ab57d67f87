"""Redis clients from URLs: redis://, rediss:// (TLS), unix://, and redis+cluster:// /
rediss+cluster:// for Redis Cluster. Credentials (ACL user and password) come from the URL.

Each client holds a bounded pool of connections (per node on a cluster): POOL_SIZE, or the
URL's ``max_connections=N``. A call that finds them all busy waits for one to come back, up
to POOL_TIMEOUT_S (the URL's ``timeout=S``), then raises ``PoolExhausted``: a burst of
concurrent calls (threads, asyncio tasks) queues up instead of failing at once."""

from __future__ import annotations

import asyncio
import re
from typing import Any
from urllib.parse import parse_qs, urlsplit

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.retry
import redis.backoff
import redis.cluster
import redis.retry

from jobqueue.errors import ConfigError, ConnectionFailed, PoolExhausted, Unreachable

_SCHEMES = {"redis", "rediss", "unix", "redis+cluster", "rediss+cluster"}

# redis-py's own bound for a pool it makes itself; ours blocks instead of raising.
POOL_SIZE = 100
POOL_TIMEOUT_S = 20.0
# What redis-py's blocking pools raise when no connection came back within their timeout.
_NO_CONNECTION = "No connection available"


def redact(url: str) -> str:
    """The URL with its password replaced, for messages and logs.

    The user info ends at the LAST '@' (a password may hold '@', '/', '?' or ':' unencoded);
    when a query string holds an '@' this hides more than the password, never less. A
    ``password=`` query parameter is hidden too."""
    scheme, sep, rest = url.partition("//")
    at = rest.rfind("@")
    if sep and at >= 0:
        user, colon, _ = rest[:at].partition(":")
        if colon:
            rest = f"{user}:***{rest[at:]}"
    return re.sub(r"([?&]password=)[^&]*", r"\1***", scheme + sep + rest)


def _split(url: str) -> tuple[str, bool]:
    try:
        scheme = urlsplit(url).scheme
    except ValueError as exc:  # e.g. 'redis://[::1/0': an IPv6 host not closed
        raise ConfigError(f"bad Redis URL {redact(url)!r}: {exc}") from None
    if scheme not in _SCHEMES:
        raise ConfigError(
            f"unsupported Redis URL {redact(url)!r}: use redis://, rediss://, unix://, "
            "redis+cluster:// or rediss+cluster://"
        )
    if scheme.endswith("+cluster"):
        return scheme.removesuffix("+cluster") + url[len(scheme) :], True
    return url, False


_COMMON: dict[str, Any] = {
    "decode_responses": True,
    # Bytes that are not UTF-8 (a record written by something else) must not make a reply
    # undecodable: a claim that leased runs would then lose them all until their leases expire.
    "encoding_errors": "replace",
    "socket_connect_timeout": 5,
    "socket_timeout": 10,  # above the worker's longest blocking wait (2 s)
    "health_check_interval": 30,
}
# RedisCluster drops health_check_interval silently (it is not one of its per-node options);
# a dead node's connections are found by the command that fails, which makes redis-py reload
# the topology (and the caller, e.g. the worker, retries with backoff).
_CLUSTER = {k: v for k, v in _COMMON.items() if k != "health_check_interval"}


_UNKNOWN_OPTION = re.compile(r"unexpected keyword argument '([^']*)'")


def _unknown_option(exc: TypeError, url: str) -> ConfigError | None:
    """redis-py passes a URL's unknown query options on to the connection class, which
    raises TypeError when it is built (at the first command): name the option instead."""
    found = _UNKNOWN_OPTION.search(str(exc))
    if found is None:
        return None
    return ConfigError(f"unknown URL option {found.group(1)} in {redact(url)!r}")


def _never_resend(retry_class: Any) -> Any:
    """No command is ever sent twice by redis-py: after a timeout or a connection lost while
    awaiting the reply, the server may have run it (a second claim would lease runs nobody
    starts). Pinned rather than left to redis-py's defaults, which have changed across
    versions. A connection the server closed while idle is replaced when the pool hands it
    out; the daemons retry failed calls with their own backoff."""
    return retry_class(redis.backoff.NoBackoff(), 0)


def is_cluster_url(url: str) -> bool:
    return _split(url)[1]


def pool_bound(url: str) -> tuple[int, float]:
    """The pool's size and how long a call waits for a free connection: the URL's
    ``max_connections`` and ``timeout`` options, else POOL_SIZE and POOL_TIMEOUT_S."""
    try:
        query = parse_qs(urlsplit(url).query)
    except ValueError:
        query = {}
    size, wait = POOL_SIZE, POOL_TIMEOUT_S
    try:
        if query.get("max_connections"):
            size = int(query["max_connections"][0])
        if query.get("timeout"):
            wait = float(query["timeout"][0])
    except ValueError:
        raise ConfigError(
            f"bad pool option in {redact(url)!r}: max_connections is a whole number, timeout "
            "a number of seconds"
        ) from None
    if size < 1 or not wait >= 0:  # NaN fails >= too
        raise ConfigError(
            f"bad pool option in {redact(url)!r}: max_connections must be at least 1 and "
            "timeout at least 0"
        )
    return size, wait


def _without_option(url: str, name: str) -> str:
    parts = urlsplit(url)
    kept = [q for q in parts.query.split("&") if q and q.split("=", 1)[0] != name]
    return parts._replace(query="&".join(kept)).geturl()


def _blocking(url: str) -> dict[str, Any]:
    """A blocking pool's bound, pool_bound(url) (the URL's own options win over these)."""
    size, wait = pool_bound(url)
    return {"max_connections": size, "timeout": wait}


def _pool(url: str, blocking: type) -> dict[str, Any]:
    """What makes a cluster client's node pools blocking pools of pool_bound(url)."""
    return {"connection_pool_class": blocking, **_blocking(url)}


def pool_exhausted(exc: BaseException) -> bool:
    """Whether ``exc`` is a blocking pool's "no connection came back in time"."""
    return isinstance(exc, redis.exceptions.ConnectionError) and _NO_CONNECTION in str(exc)


def exhausted(during: str) -> PoolExhausted:
    return PoolExhausted(
        f"no Redis connection came free in time for {during}: every connection of the "
        "client's pool stayed busy for its whole wait (the URL's max_connections=N and "
        f"timeout=S set them; {POOL_SIZE} and {POOL_TIMEOUT_S:g} s by default)"
    )


def sync_client(url: str) -> Any:
    plain, cluster = _split(url)
    try:
        if cluster:
            # The cluster client re-sends a command after a timeout or a lost connection by
            # default (its own retry, above the nodes' connections): pinned off too. MOVED,
            # ASK and TRYAGAIN redirections are still followed (a refused call did not run).
            return redis.cluster.RedisCluster.from_url(
                plain,
                retry=_never_resend(redis.retry.Retry),
                **_pool(url, redis.BlockingConnectionPool),
                **_CLUSTER,
            )
        blocking: Any = redis.BlockingConnectionPool.from_url(
            plain, retry=_never_resend(redis.retry.Retry), **_blocking(url), **_COMMON
        )
        client: Any = redis.Redis  # from_pool: the client owns the pool (closes it)
        return client.from_pool(blocking)
    except TypeError as exc:
        raise _unknown_option(exc, url) or exc from None
    # RedisCluster connects at once; when no startup node answers it raises
    # RedisClusterException, which is not a RedisError.
    except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException) as exc:
        raise Unreachable(f"cannot connect to {redact(url)}: {exc}") from None
    except ValueError as exc:
        raise ConfigError(f"bad Redis URL {redact(url)!r}: {exc}") from None


class _PatientAsyncPool(redis.asyncio.BlockingConnectionPool):  # type: ignore[type-arg]
    """A blocking pool whose connect that timed out is tried again within the pool's wait.
    An event loop busy with a burst (5,000 gathered enqueues on a loaded machine) can get back
    to a connecting socket only after socket_connect_timeout has passed, though the server
    answered at once; nothing was sent on it, so trying again sends nothing twice. A server
    that does not answer still fails: after the wait, or after 3 more tries."""

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self.timeout if self.timeout is not None else POOL_TIMEOUT_S)
        for _ in range(3):
            try:
                return await super().get_connection(*args, **kwargs)
            except redis.exceptions.TimeoutError:  # only a connect raises it here
                if loop.time() >= deadline:
                    raise
        return await super().get_connection(*args, **kwargs)


def async_client(url: str) -> Any:
    """An asyncio client. On a cluster its nodes' pools raise at once when full (redis-py
    has no blocking pool there): ``AsyncJobQueue`` makes calls wait for a free connection
    instead, with a semaphore of the same bound."""
    plain, cluster = _split(url)
    try:
        if cluster:
            size, _ = pool_bound(url)
            # the wait is AsyncJobQueue's (this client has no blocking pool to give it to)
            return redis.asyncio.cluster.RedisCluster.from_url(
                _without_option(plain, "timeout"),
                retry=_never_resend(redis.asyncio.retry.Retry),
                max_connections=size,
                **_CLUSTER,
            )
        blocking: Any = _PatientAsyncPool.from_url(
            plain, retry=_never_resend(redis.asyncio.retry.Retry), **_blocking(url), **_COMMON
        )
        client: Any = redis.asyncio.Redis
        return client.from_pool(blocking)
    except ValueError as exc:
        raise ConfigError(f"bad Redis URL {redact(url)!r}: {exc}") from None


def check(client: Any, url: str) -> None:
    """PING once so that a wrong password or an unreachable server is one clear error."""
    try:
        client.ping()
    except TypeError as exc:
        raise _unknown_option(exc, url) or exc from None
    except redis.exceptions.AuthenticationError as exc:
        raise ConnectionFailed(f"Redis at {redact(url)} refused the credentials: {exc}") from None
    except redis.exceptions.ResponseError as exc:
        if "NOAUTH" in str(exc) or "WRONGPASS" in str(exc) or "NOPERM" in str(exc):
            raise ConnectionFailed(f"Redis at {redact(url)} refused: {exc}") from None
        if "DB index" in str(exc) or "invalid DB" in str(exc):
            # SELECT of the URL's /db (or ?db=) failed: a setting, not the server's state.
            raise ConfigError(f"Redis at {redact(url)} refused the URL's database: {exc}") from None
        raise ConnectionFailed(f"Redis at {redact(url)} refused the connection: {exc}") from None
    except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException) as exc:
        error = ConnectionFailed if _tls_hint(url, str(exc)) else Unreachable
        raise error(
            f"cannot reach Redis at {redact(url)}: {exc}{_tls_hint(url, str(exc))}"
        ) from None


def _tls_hint(url: str, error: str) -> str:
    """What to put in the URL, for TLS refusals whose OpenSSL text does not say it.

    A server that requires a client certificate (tls-auth-clients yes) refuses one without it
    with a TLS 1.3 alert that races the client's first write: the client sees either the
    alert or a bare EOF, so both get the hint when the URL names no certificate."""
    if "CERTIFICATE_VERIFY_FAILED" in error:
        return " (the server's certificate is not trusted: add ssl_ca_certs=<CA file> to the URL)"
    refused = "CERTIFICATE_REQUIRED" in error or "EOF occurred in violation of protocol" in error
    if refused and urlsplit(url).scheme.startswith("rediss") and "ssl_certfile=" not in url:
        return (
            " (if the server requires client certificates, add "
            "ssl_certfile=<cert file>&ssl_keyfile=<key file> to the URL)"
        )
    return ""
