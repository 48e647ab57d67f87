"""Fair shares between groups, the client's side: I/O-free steps that turn them on or off,
set one group's weight, max_size and pause, and read a queue's groups. A run's group is its
limit_key; claims serve a queue's groups in weighted turns (claim.lua, docs/concepts.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from jobqueue.errors import ConfigError
from jobqueue.store.contract import text
from jobqueue.store.groups import GROUP_SET, GROUP_WEIGHT_MAX, GroupInfo
from jobqueue.store.io import Scripts, Steps, cmd, commands

if TYPE_CHECKING:
    from jobqueue.client.core import ClientCore

# Leases read per partition to count the running runs of each group (an operator's view).
RUNNING_LOOK = 10_000


def check_group(group: object) -> str:
    """A group name: a limit_key, or '' for the runs without one."""
    if group == "":
        return ""
    from jobqueue.client.base import check_limit_key

    try:
        return check_limit_key(group)
    except ConfigError as exc:
        raise ConfigError(str(exc).replace("limit_key", "group", 1)) from None


def set_groups(
    core: ClientCore,
    queue: str,
    *,
    fair: bool | None = None,
    group: str = "",
    weight: int | None = None,
    max_size: int | None = None,
    paused: bool | None = None,
) -> Steps[bool]:
    """group_set on every partition of ``queue``; True when one changed."""
    group = check_group(group)
    if weight is not None and (
        isinstance(weight, bool) or not isinstance(weight, int)
        or not 1 <= weight <= GROUP_WEIGHT_MAX
    ):
        raise ConfigError(f"a group weight must be an integer from 1 to {GROUP_WEIGHT_MAX}")
    if max_size is not None and (
        isinstance(max_size, bool) or not isinstance(max_size, int) or max_size < 0
    ):
        raise ConfigError("a group max_size must be a whole number (0: no limit)")
    yield from core._register_queue(queue)
    calls = [
        GROUP_SET.call(keys, fair, group, weight, max_size, paused)
        for keys in core.all_partition_keys(queue)
    ]
    replies = yield Scripts(calls)
    return any([GROUP_SET.parse(reply) for reply in replies])


def read_groups(core: ClientCore, queue: str) -> Steps[tuple[bool, list[GroupInfo]]]:
    """Whether fair shares are on (in the first partition) and the queue's groups: those
    with settings, runs in line, or runs served, summed over its partitions."""
    parts = core.all_partition_keys(queue)
    reads = []
    for keys in parts:
        reads += [
            cmd("hgetall", keys.gconf),
            cmd("hgetall", keys.gserved),
            cmd("zrange", keys.gready, 0, -1),
            cmd("zrange", keys.gwait, 0, -1),
            cmd("zrange", keys.leases, 0, RUNNING_LOOK - 1),
        ]
    replies = yield commands(*reads)
    conf: dict[str, str] = {}
    served: dict[str, int] = {}
    names: set[str] = set()
    leased: list[tuple[int, str]] = []
    fair = False
    for i in range(len(parts)):
        gconf, gserved, ready, waiting, leases = (
            r if not isinstance(r, Exception) else None for r in replies[5 * i : 5 * i + 5]
        )
        for field, value in _pairs(gconf):
            if field == "fair":
                fair = fair or (i == 0)
                continue
            kind, _, name = field.partition(":")
            if kind in ("w", "max", "p"):
                conf.setdefault(f"{kind}:{name}", value)
                names.add(name)
        for field, value in _pairs(gserved):
            served[field] = served.get(field, 0) + (int(value) if value.isdigit() else 0)
            names.add(field)
        for member in [*(ready or []), *(waiting or [])]:
            names.add(text(member))
        leased += [(i, text(run_id)) for run_id in leases or []]
    ordered = sorted(names)
    counts = yield commands(
        *(cmd("zcard", keys.gq(name)) for keys in parts for name in ordered),
        *(cmd("hget", parts[i].run(run_id), "limit_key") for i, run_id in leased),
    )
    waiting_of = dict.fromkeys(ordered, 0)
    for j, n in enumerate(counts[: len(parts) * len(ordered)]):
        if isinstance(n, int):
            waiting_of[ordered[j % len(ordered)]] += n
    running: dict[str, int] = {}
    for key in counts[len(parts) * len(ordered) :]:
        name = "" if key is None or isinstance(key, Exception) else text(key)
        running[name] = running.get(name, 0) + 1
    groups = [
        GroupInfo(
            name=name,
            weight=_int(conf.get(f"w:{name}"), 1),
            max_size=_int(conf.get(f"max:{name}"), None),
            paused=f"p:{name}" in conf,
            waiting=waiting_of[name],
            running=running.get(name, 0),
            served=served.get(name, 0),
        )
        for name in ordered
    ]
    return fair, groups


def _pairs(reply: Any) -> list[tuple[str, str]]:
    if not isinstance(reply, dict):
        return []
    return [(text(k), text(v)) for k, v in reply.items()]


def _int(value: str | None, default: Any) -> Any:
    return int(value) if value is not None and value.isdigit() else default
