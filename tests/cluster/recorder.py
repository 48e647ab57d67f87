"""Records every keyed command a redis-py RedisCluster sends (plain, pipelined, and the ones
redis-py would split across slots by itself), so a test can show that none spans two slots."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
import redis.cluster
import redis.commands.cluster


@dataclass
class CommandLog:
    commands: list[tuple[str, int]] = field(default_factory=list)  # (command, slot)
    split: list[tuple[Any, ...]] = field(default_factory=list)  # keys of a split command

    def names(self) -> set[str]:
        return {c for c, _ in self.commands}


def record_cluster_commands(monkeypatch: pytest.MonkeyPatch) -> CommandLog:
    """From now on, every command routed by key: its name and slot. ``determine_slot`` is
    where redis-py routes each keyed command, single or pipelined; a multi-key command whose
    keys span slots is recorded in ``split`` (redis-py would quietly split DEL, EXISTS,
    UNLINK, TOUCH, MGET/MSET_NONATOMIC per slot, hiding a multi-slot need)."""
    log = CommandLog()
    determine = redis.cluster.RedisCluster.determine_slot
    by_slot = redis.commands.cluster.ClusterMultiKeyCommands._partition_keys_by_slot

    def determine_slot(self: Any, *args: Any) -> Any:
        slot = determine(self, *args)
        log.commands.append((str(args[0]).upper(), int(slot)))
        return slot

    def partition(self: Any, keys: Any) -> Any:
        groups = by_slot(self, keys)
        if len(groups) > 1:
            log.split.append(tuple(keys))
        return groups

    monkeypatch.setattr(redis.cluster.RedisCluster, "determine_slot", determine_slot)
    monkeypatch.setattr(
        redis.commands.cluster.ClusterMultiKeyCommands, "_partition_keys_by_slot", partition
    )
    return log
