"""The app-facing clients (sync and asyncio) and the read and admin operations the CLI
and the dashboard go through (queries, repair, repartition)."""

from jobqueue.client.sync import JobQueue, RunHandle

__all__ = ["JobQueue", "RunHandle"]
