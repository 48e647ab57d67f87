"""A redis-py cluster client's slot map, corrected by the MOVED replies that prove it stale.

A MOVED reply names the master that serves its slot now, and the node that gave it knows: it
has just handed the slot over or been demoted. Asking the cluster for its whole map again
(CLUSTER SLOTS) is no substitute: in the seconds after a failover the node asked may not have
heard of it yet and answer with the old master, and a call sent there is MOVED again."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import redis


def follow_moved(client: Any, moved: Iterable[redis.exceptions.MovedError]) -> None:
    """Point each MOVED reply's slot at the master it names, in ``client``'s map (a
    ``RedisCluster``; nothing to do for a single server). In memory: no I/O."""
    nodes = getattr(client, "nodes_manager", None)
    if nodes is None:
        return
    move_slot = getattr(nodes, "move_slot", None)
    for exc in moved:
        if move_slot is not None:
            move_slot(exc)
        else:
            # redis-py before move_slot keeps one pending MOVED and applies it at the next
            # look-up of any slot: look the slot up now, so that the next one is not lost.
            nodes.update_moved_exception(exc)
            nodes.get_node_from_slot(exc.slot_id)
