"""Redis clients from URLs: redis://, rediss:// (TLS), unix://, and redis+cluster:// /
rediss+cluster:// for Redis Cluster. Credentials (ACL user and password) come from the URL."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.retry
import redis.backoff
import redis.cluster
import redis.retry

from jobqueue.errors import ConfigError, ConnectionFailed

_SCHEMES = {"redis", "rediss", "unix", "redis+cluster", "rediss+cluster"}


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


def sync_client(url: str) -> Any:
    plain, cluster = _split(url)
    try:
        if cluster:
            # The cluster client re-sends a command after a timeout or a lost connection by
            # default (its own retry, above the nodes' connections): pinned off too. MOVED,
            # ASK and TRYAGAIN redirections are still followed (a refused call did not run).
            return redis.cluster.RedisCluster.from_url(
                plain, retry=_never_resend(redis.retry.Retry), **_CLUSTER
            )
        return redis.Redis.from_url(
            plain, retry=_never_resend(redis.retry.Retry), **_COMMON
        )
    except TypeError as exc:
        raise _unknown_option(exc, url) or exc from None
    # RedisCluster connects at once; when no startup node answers it raises
    # RedisClusterException, which is not a RedisError.
    except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException) as exc:
        raise ConnectionFailed(f"cannot connect to {redact(url)}: {exc}") from None
    except ValueError as exc:
        raise ConfigError(f"bad Redis URL {redact(url)!r}: {exc}") from None


def async_client(url: str) -> Any:
    plain, cluster = _split(url)
    try:
        if cluster:
            return redis.asyncio.cluster.RedisCluster.from_url(
                plain, retry=_never_resend(redis.asyncio.retry.Retry), **_CLUSTER
            )
        return redis.asyncio.Redis.from_url(
            plain, retry=_never_resend(redis.asyncio.retry.Retry), **_COMMON
        )
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
        raise ConnectionFailed(
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
