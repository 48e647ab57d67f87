"""Fair shares between groups: the group_set script's contract and reading a queue's groups
(claim.lua serves them; see docs/concepts.md#groups-and-fair-shares)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from jobqueue.anomalies import Anomaly
from jobqueue.store.contract import Contract, NowArg, Wire, now_arg
from jobqueue.store.keys import PartitionKeys

GROUP_WEIGHT_MAX = 1000  # as lua/lib/groups.lua's GROUP_WEIGHT_MAX


def _flag(value: bool | None) -> str:
    return "" if value is None else "1" if value else "0"


def _group_set(
    pk: PartitionKeys,
    fair: bool | None = None,
    group: str = "",
    weight: int | None = None,
    max_size: int | None = None,
    paused: bool | None = None,
    now: NowArg = None,
) -> Wire:
    return Wire(
        pk,
        {
            "now": now_arg(now),
            "prefix": pk.prefix,
            "fair": _flag(fair),
            "group": group,
            "weight": "" if weight is None else weight,
            "max_size": "" if max_size is None else max_size,
            "paused": _flag(paused),
        },
    )


def _parse_changed(reply: Any) -> bool:
    return int(reply) == 1


GROUP_SET = Contract(
    "group_set",
    build=_group_set,
    parse=_parse_changed,
)

CONTRACTS = (GROUP_SET,)


@dataclass(frozen=True)
class GroupInfo:
    """One group of a queue, summed over its partitions. ``waiting``: runs in the group's
    queue (pending, due or not; a cancelled one until a claim passes it); ``served``: runs
    claimed from it while fair shares were on; ``running``: leased runs whose limit_key is
    the group. ``weight`` 1 and ``max_size`` None are the defaults. ``anomalies``: foreign
    data met in the group's own keys and fields (read as the defaults, or as 0)."""

    name: str
    weight: int
    max_size: int | None
    paused: bool
    waiting: int
    running: int
    served: int
    anomalies: tuple[Anomaly, ...] = ()
