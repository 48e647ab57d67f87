"""Public module names: the read functions' public home is ``jobqueue.queries`` (they live in
``jobqueue.ops.queries``)."""

from __future__ import annotations

import jobqueue.queries
from jobqueue.ops import queries as implementation


def test_jobqueue_queries_offers_every_listing_function_of_the_client() -> None:
    names = ["runs", "leases", "stats", "workers", "schedules", "throughput", "top_snapshot"]
    assert [getattr(jobqueue.queries, n) for n in names] == [
        getattr(implementation, n) for n in names
    ]

