"""The app-facing clients: the sync ``JobQueue`` and the asyncio ``AsyncJobQueue`` (``aio``),
both driving the operations of ``core``, and what they share (waits, events, flows, groups,
the relay). What operators use over them is ``jobqueue.ops``."""
