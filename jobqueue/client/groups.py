"""Fair shares between groups, the client's side: I/O-free steps that turn them on or off,
set one group's weight, max_size and pause, and read a queue's groups. A run's group is its
limit_key; claims serve a queue's groups in weighted turns (claim.lua, docs/concepts.md)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from jobqueue.anomalies import Anomaly, Listing, checked, stored_int, unique
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


def read_fair(core: ClientCore, queue: str) -> Steps[tuple[bool, list[Anomaly]]]:
    """Whether fair shares are on for ``queue`` (its first partition's ``fair`` field: one
    HGET), and the anomaly of a gconf key of another type (read as off)."""
    keys = core.all_partition_keys(queue)[0]
    found: list[Anomaly] = []
    (reply,) = yield commands(cmd("hget", keys.gconf, "fair"))
    return checked(reply, keys.gconf, "hash", found, None) is not None, found


def read_groups(core: ClientCore, queue: str) -> Steps[tuple[bool, Listing[GroupInfo]]]:
    """Whether fair shares are on (in the first partition) and the queue's groups: those
    with settings, runs in line, or runs served, summed over its partitions. Foreign data
    (a key of another type, a setting or count that is not a number jobqueue writes) is an
    anomaly of the listing or of the group it concerns, read as absent."""
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
    found: list[Anomaly] = []  # the listing's
    marks: dict[str, list[Anomaly]] = {}  # each group's
    conf: dict[str, int | None] = {}
    served: dict[str, int] = {}
    names: set[str] = set()
    leased: list[tuple[int, str]] = []
    fair = False
    for i, keys in enumerate(parts):
        r = replies[5 * i : 5 * i + 5]
        gconf = checked(r[0], keys.gconf, "hash", found, {})
        gserved = checked(r[1], keys.gserved, "hash", found, {})
        ready = checked(r[2], keys.gready, "sorted set", found, [])
        waiting = checked(r[3], keys.gwait, "sorted set", found, [])
        leases = checked(r[4], keys.leases, "sorted set", found, [])
        for field, value in _pairs(gconf):
            if field == "fair":
                fair = fair or (i == 0)
                continue
            kind, _, name = field.partition(":")
            if kind not in ("w", "max", "p"):
                continue
            names.add(name)
            number = stored_int(value)
            if kind == "w" and not (number is not None and 1 <= number <= GROUP_WEIGHT_MAX):
                number = _foreign(marks, name, keys.gconf, field, value, "not a weight")
            elif kind == "max" and not (number is not None and number >= 0):
                number = _foreign(marks, name, keys.gconf, field, value, "not a max_size")
            conf.setdefault(f"{kind}:{name}", number)
        for field, value in _pairs(gserved):
            names.add(field)
            number = stored_int(value)
            if number is None or number < 0:
                number = _foreign(marks, field, keys.gserved, field, value, "not a count", 0)
            served[field] = served.get(field, 0) + (number or 0)
        for member in [*ready, *waiting]:
            names.add(text(member))
        leased += [(i, text(run_id)) for run_id in leases]
    ordered = sorted(names)
    if not ordered:  # no group: the running runs' keys would name none shown
        leased = []
    counts = yield commands(
        *(cmd("zcard", keys.gq(name)) for keys in parts for name in ordered),
        *(cmd("hget", parts[i].run(run_id), "limit_key") for i, run_id in leased),
    )
    waiting_of = dict.fromkeys(ordered, 0)
    for j, n in enumerate(counts[: len(parts) * len(ordered)]):
        name = ordered[j % len(ordered)]
        key = parts[j // len(ordered)].gq(name)
        waiting_of[name] += checked(n, key, "sorted set", marks.setdefault(name, []), 0)
    running: dict[str, int] = {}
    for (i, run_id), reply in zip(leased, counts[len(parts) * len(ordered) :], strict=True):
        wrong: list[Anomaly] = []
        limit_key = checked(reply, parts[i].run(run_id), "hash", wrong, None)
        if wrong:  # a record of another type: its group is not known
            found += wrong
            continue
        name = "" if limit_key is None else text(limit_key)
        running[name] = running.get(name, 0) + 1
    groups = [
        GroupInfo(
            name=name,
            weight=_or(conf.get(f"w:{name}"), 1),
            max_size=conf.get(f"max:{name}"),
            paused=f"p:{name}" in conf,
            waiting=waiting_of[name],
            running=running.get(name, 0),
            served=served.get(name, 0),
            anomalies=tuple(unique(marks.get(name, []))),
        )
        for name in ordered
    ]
    return fair, Listing(groups, unique(found))


def busiest(groups: Sequence[GroupInfo], limit: int) -> tuple[list[GroupInfo], list[GroupInfo]]:
    """The ``limit`` groups with the most runs waiting and running (ties: by name), in name
    order, and the others: what an operator's view shows when a queue has many groups."""
    ranked = sorted(groups, key=lambda g: (-(g.waiting + g.running), g.name))
    shown = {g.name for g in ranked[:limit]}
    return ([g for g in groups if g.name in shown],
            [g for g in groups if g.name not in shown])  # fmt: skip


def _foreign(
    marks: dict[str, list[Anomaly]], group: str, key: str, field: str, value: str, what: str,
    read_as: int | None = None,
) -> int | None:
    """Mark ``group`` with a field that is not what jobqueue writes; what it is read as."""
    marks.setdefault(group, []).append(Anomaly(key, f"field {field!r} is {value[:60]!r}, {what}"))
    return read_as


def _pairs(reply: Any) -> list[tuple[str, str]]:
    if not isinstance(reply, dict):
        return []
    return [(text(k), text(v)) for k, v in reply.items()]


def _or(value: int | None, default: int) -> int:
    return default if value is None else value
