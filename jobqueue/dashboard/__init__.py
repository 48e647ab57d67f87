"""The web view of the same data as the ops CLI (its command is ``jobqueue.cli.dashboard``).

Importing this package needs nothing beyond jobqueue itself; the web stack (the
``dashboard`` extra: Starlette, Jinja2, uvicorn) is imported by ``app`` and ``security``.
"""
