"""The app-facing clients (sync and asyncio, both driving the operations of ``core``) and the
read and admin operations the CLI and the dashboard go through (queries, repair,
repartition, health, capacity)."""

from jobqueue.client.sync import JobQueue
from jobqueue.handles import RunHandle

__all__ = ["JobQueue", "RunHandle"]
