"""The AsyncScriptRunner on the asyncio twin of a sync RedisCluster (jobqueue.store.twin) on a
real 3-master cluster: one pipeline per master, all at once; a master down fails its own
calls only; a MOVED after a slot moved is sent again to the new master; a wait hears a token
on any master; durable writes wait on each master for its own replica."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest
import redis.asyncio.client
from cluster_launcher import Cluster, Node
from helpers import spec
from redis.crc import key_slot

from jobqueue.errors import ConnectionFailed
from jobqueue.store.keys import PartitionKeys, queue_partitions
from jobqueue.store.runs import CLAIM, CREATE_RUN
from jobqueue.store.scripts import AsyncScriptRunner, Call, ScriptRunner
from jobqueue.store.twin import ClusterTwin, async_twin

T = TypeVar("T")
PARTITIONS = queue_partitions("default", 16, True)


def slot_of(pk: PartitionKeys) -> int:
    return key_slot(pk.due.encode())


def creates(tag: str) -> list[Call]:
    return [CREATE_RUN.call(pk, [spec(f"{tag}{i}")], now=0) for i, pk in
            enumerate(PARTITIONS)]  # fmt: skip


def claims() -> list[Call]:
    return [CLAIM.call(pk, 5, "w", 30_000, 60_000, now=1_000) for pk in PARTITIONS]


async def with_runner(cluster_client: Any, scenario: Any) -> Any:
    twin = async_twin(cluster_client)
    assert isinstance(twin, ClusterTwin)
    runner = AsyncScriptRunner(twin)
    try:
        return await scenario(runner)
    finally:
        await runner.aclose()
        await twin.aclose()


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def test_run_each_sends_one_pipeline_to_each_of_the_three_masters_and_equals_the_sync_runner(
    cluster: Cluster, cluster_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    sync_created = ScriptRunner(cluster_client).run_each(creates("s"))
    sync_claimed = ScriptRunner(cluster_client).run_each(claims())
    cluster.flush()
    sent: list[tuple[Any, int]] = []
    original = redis.asyncio.client.Pipeline.execute

    async def counting(self: Any, raise_on_error: bool = True) -> Any:
        kwargs = self.connection_pool.connection_kwargs
        sent.append((kwargs["port"], len(self.command_stack)))
        return await original(self, raise_on_error)

    monkeypatch.setattr(redis.asyncio.client.Pipeline, "execute", counting)

    async def scenario(runner: AsyncScriptRunner) -> tuple[list[Any], list[Any]]:
        return await runner.run_each(creates("s")), await runner.run_each(claims())

    created, claimed = run(with_runner(cluster_client, scenario))
    assert (created, claimed) == (sync_created, sync_claimed)
    assert all(len(CLAIM.parse(reply).runs) == 1 for reply in claimed)
    masters = {n.port for n in cluster.master_nodes()}
    per_master = [port for port, _ in sent[: len(masters)]]
    assert sorted(per_master) == sorted(masters)  # the first round: one pipeline each
    assert sum(size for _, size in sent[:3]) == len(PARTITIONS)


def test_a_master_down_fails_only_its_own_calls(cluster: Cluster, cluster_client: Any) -> None:
    ScriptRunner(cluster_client).run_each(creates("d"))
    cluster.wait_replicated()
    victim = cluster.master_nodes()[0]
    on_victim = [cluster.serves(victim.port, slot_of(pk)) for pk in PARTITIONS]
    assert any(on_victim) and not all(on_victim)

    async def scenario(runner: AsyncScriptRunner) -> list[Any]:
        await runner.load()  # every master has the scripts: no reload meets the dead one
        victim.kill()
        return await runner.run_each(claims())

    try:
        started = time.monotonic()
        replies = run(with_runner(cluster_client, scenario))
        took = time.monotonic() - started
    finally:
        cluster.restore(victim)
    for dead, reply in zip(on_victim, replies, strict=True):
        if dead:
            assert isinstance(reply, ConnectionFailed), reply
        else:
            assert len(CLAIM.parse(reply).runs) == 1, reply
    assert took < 5, took  # a refused connection, not a wait for the failover


def move_empty_slot(cluster: Cluster, slot: int, target: Node) -> None:
    """Give a slot that holds no key to another master (as `redis-cli --cluster reshard`
    would, with no key to migrate)."""
    source = cluster.master_of_slot(slot)
    source_id, target_id = cluster.node_id(source), cluster.node_id(target)
    with source.client() as src, target.client() as dst:
        assert src.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) == 0
        dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
    for node in cluster.master_nodes():
        with node.client() as c:
            c.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)


def test_a_moved_reply_after_a_slot_moved_is_sent_again_to_its_new_master(
    cluster: Cluster, cluster_client: Any
) -> None:
    pk = PARTITIONS[0]
    slot = slot_of(pk)
    source = cluster.master_of_slot(slot)
    target = next(n for n in cluster.master_nodes() if n.port != source.port)
    assert cluster_client.get_node_from_key(pk.due).port == source.port  # the map in memory
    move_empty_slot(cluster, slot, target)
    try:

        async def scenario(runner: AsyncScriptRunner) -> list[Any]:
            return await runner.run_each([CREATE_RUN.call(pk, [spec("m")], now=0)])

        assert run(with_runner(cluster_client, scenario)) == [[0, 1]]
        assert cluster_client.get_node_from_key(pk.due).port == target.port  # refreshed
        with target.client() as c:
            assert c.exists(pk.run("m")) == 1
    finally:
        with target.client() as c:
            for key in c.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 1000):
                c.delete(key)
        move_empty_slot(cluster, slot, source)
        cluster.wait_healthy()


@pytest.mark.parametrize("runner_kind", ["sync", "async"])
def test_a_call_moved_to_a_master_without_scripts_runs_there_though_the_cluster_map_lags(
    cluster: Cluster, cluster_client: Any, monkeypatch: pytest.MonkeyPatch, runner_kind: str
) -> None:
    """As just after a failover: the master that now serves the slot has no scripts, and the
    node asked for the slot map (CLUSTER SLOTS) has not heard of the change yet (forced: the
    client's map refresh changes nothing). The MOVED reply names the new master: the call is
    sent there, answered NOSCRIPT, the scripts loaded, and it runs, once."""
    pk = PARTITIONS[0]
    slot = slot_of(pk)
    source = cluster.master_of_slot(slot)
    target = next(n for n in cluster.master_nodes() if n.port != source.port)
    move_empty_slot(cluster, slot, target)
    with target.client() as c:
        c.script_flush()
    monkeypatch.setattr(cluster_client.nodes_manager, "initialize", lambda *a, **k: None)
    call = CREATE_RUN.call(pk, [spec("lag")], now=0)
    try:
        if runner_kind == "sync":
            replies = ScriptRunner(cluster_client).run_each([call])
        else:

            async def scenario(runner: AsyncScriptRunner) -> list[Any]:
                return await runner.run_each([call])

            replies = run(with_runner(cluster_client, scenario))
        assert replies == [[0, 1]]
        with target.client() as c:
            assert c.exists(pk.run("lag")) == 1
    finally:
        monkeypatch.undo()
        with target.client() as c:
            for key in c.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 1000):
                c.delete(key)
        move_empty_slot(cluster, slot, source)
        cluster.wait_healthy()


def test_wait_on_lists_hears_a_token_pushed_to_a_key_on_another_master(
    cluster: Cluster, cluster_client: Any
) -> None:
    by_master: dict[int, PartitionKeys] = {}
    for pk in PARTITIONS:
        by_master.setdefault(cluster.master_of_slot(slot_of(pk)).port, pk)
    assert len(by_master) == 3
    keys = [pk.wake for pk in by_master.values()]

    async def scenario(runner: AsyncScriptRunner) -> tuple[str | None, float]:
        async def push() -> None:
            await asyncio.sleep(0.3)  # kept: the token comes while the wait is under way
            await asyncio.to_thread(cluster_client.lpush, keys[2], "1")

        pusher = asyncio.create_task(push())
        started = time.monotonic()
        woken = await runner.wait_on_lists(keys, 10)
        await pusher
        return woken, time.monotonic() - started

    woken, took = run(with_runner(cluster_client, scenario))
    assert woken == keys[2]
    assert took < 3, took


def test_run_durable_waits_on_each_master_for_its_own_replica(
    cluster: Cluster, cluster_client: Any
) -> None:
    async def scenario(runner: AsyncScriptRunner) -> tuple[list[Any], bool]:
        return await runner.run_durable(creates("w"), 1, False, 5_000)

    replies, durable = run(with_runner(cluster_client, scenario))
    assert replies == [[0, 1]] * len(PARTITIONS)
    assert durable
