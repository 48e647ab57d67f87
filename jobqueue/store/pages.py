"""The contract of index_page.lua: a page of one partition's run index from a keyset place
(the listings of ``jobqueue.ops.listing``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from jobqueue.store.contract import Contract, NowArg, Wire, now_arg, text


class IndexPage(NamedTuple):
    """How many entries the score range holds, and the page: (member, score as Redis wrote
    it) in the order asked. The score stays text so that a place built from it names the
    very same score (no float round trip)."""

    in_range: int
    entries: list[tuple[str, str]]


def _index_page(
    index_key: str,
    order: str,
    low: str = "-inf",
    high: str = "+inf",
    after: tuple[str, str] | None = None,
    inclusive: bool = False,
    count: int = 100,
    now: NowArg = None,
) -> Wire:
    score, member = after if after is not None else ("", "")
    return Wire(
        {"index": index_key},
        {
            "now": now_arg(now),
            "order": order,
            "low": low,
            "high": high,
            "after_score": score,
            "after_member": member,
            "inclusive": "1" if inclusive else "0",
            "count": count,
        },
    )


def _parse_index_page(reply: Sequence[Any] | None) -> IndexPage | None:
    """None when the index holds another type than a sorted set."""
    if reply is None:
        return None
    flat = [text(v) for v in reply[1:]]
    return IndexPage(int(reply[0]), list(zip(flat[0::2], flat[1::2], strict=True)))


INDEX_PAGE = Contract(
    "index_page",
    build=_index_page,
    parse=_parse_index_page,
)

CONTRACTS = (INDEX_PAGE,)
