"""Records every keyed command a redis-py RedisCluster sends (plain, pipelined, and the ones
redis-py would split across slots by itself), so a test can show that none spans two slots.

redis-py routes by key in different places from one release to the next: ``determine_slot``
everywhere up to 7; from 8 on, ``_slot_of_keys`` (which ``determine_slot`` and the pipeline's
keyed fallback both call) and ``_split_multi_shard_command`` (DEL, EXISTS, ... whose keys it
may send per slot). Each hook that exists is wrapped, so the log is whole on every version
pyproject.toml allows; a command seen twice (``determine_slot`` calling ``_slot_of_keys``) is
recorded twice, which the set-based checks do not mind."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
import redis.cluster
import redis.commands.cluster
from redis.crc import key_slot

from jobqueue.store.twin import ListWaits


@dataclass
class CommandLog:
    commands: list[tuple[str, int]] = field(default_factory=list)  # (command, slot)
    split: list[tuple[Any, ...]] = field(default_factory=list)  # keys of a split command

    def names(self) -> set[str]:
        return {c for c, _ in self.commands}


def record_cluster_commands(monkeypatch: pytest.MonkeyPatch) -> CommandLog:
    """From now on, every command routed by key: its name and slot, and in ``split`` the keys
    of any multi-key command redis-py would quietly split per slot (DEL, EXISTS, UNLINK,
    TOUCH, MGET/MSET_NONATOMIC), which would hide a multi-slot need."""
    log = CommandLog()
    cluster = redis.cluster.RedisCluster

    def wrap_slot(name: str, command_of: Any) -> None:
        original = getattr(cluster, name)

        def hooked(self: Any, *args: Any) -> Any:
            slot = original(self, *args)
            if slot is not None:
                log.commands.append((str(command_of(args)).upper(), int(slot)))
            return slot

        monkeypatch.setattr(cluster, name, hooked)

    wrap_slot("determine_slot", lambda args: args[0])
    if hasattr(cluster, "_slot_of_keys"):  # redis-py 8: (command, keys)
        wrap_slot("_slot_of_keys", lambda args: args[0])

    if hasattr(cluster, "_split_multi_shard_command"):  # redis-py 8
        split_command = cluster._split_multi_shard_command

        def split_hooked(self: Any, *args: Any) -> Any:
            splits = split_command(self, *args)
            if splits:
                for slot, *_ in splits:
                    log.commands.append((str(args[0]).upper(), int(slot)))
                if len(splits) > 1:
                    log.split.append(tuple(key for *_, keys in splits for key in keys))
            return splits

        monkeypatch.setattr(cluster, "_split_multi_shard_command", split_hooked)

    by_slot = redis.commands.cluster.ClusterMultiKeyCommands._partition_keys_by_slot

    def partition(self: Any, keys: Any) -> Any:
        groups = by_slot(self, keys)
        if len(groups) > 1:
            log.split.append(tuple(keys))
        return groups

    monkeypatch.setattr(
        redis.commands.cluster.ClusterMultiKeyCommands, "_partition_keys_by_slot", partition
    )

    # The worker's event loop waits for work through its asyncio twin (jobqueue.store.twin),
    # on the master of each wake list: one BLPOP per node, whose keys must share its slot.
    blpop = ListWaits._blpop

    async def blpop_hooked(self: Any, pool: Any, name: str, keys: list[str], *rest: Any) -> Any:
        slots = {key_slot(k.encode()) for k in keys}
        if len(slots) > 1:
            log.split.append(tuple(keys))
        log.commands += [("BLPOP", slot) for slot in slots]
        return await blpop(self, pool, name, keys, *rest)

    monkeypatch.setattr(ListWaits, "_blpop", blpop_hooked)
    return log
