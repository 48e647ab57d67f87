"""Public module names: the read functions' home is ``jobqueue.queries``; ``jobqueue.inspect``,
its old name (which shadowed the standard library's ``inspect``), is a deprecated alias."""

from __future__ import annotations

import importlib
import sys

import pytest

import jobqueue.queries
from jobqueue.client import queries as implementation


def test_jobqueue_queries_offers_every_listing_function_of_the_client() -> None:
    names = ["runs", "leases", "stats", "workers", "schedules", "throughput", "top_snapshot"]
    assert [getattr(jobqueue.queries, n) for n in names] == [
        getattr(implementation, n) for n in names
    ]


def test_jobqueue_inspect_still_imports_but_warns_that_it_is_deprecated(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delitem(sys.modules, "jobqueue.inspect", raising=False)
    with pytest.warns(DeprecationWarning, match="import jobqueue.queries instead"):
        old = importlib.import_module("jobqueue.inspect")
    assert old.runs is jobqueue.queries.runs
