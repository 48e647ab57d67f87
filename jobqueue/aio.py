"""The asyncio client: ``from jobqueue.aio import AsyncJobQueue`` (it lives in
jobqueue.client.aio)."""

from jobqueue.client.aio import AsyncJobQueue

__all__ = ["AsyncJobQueue"]
