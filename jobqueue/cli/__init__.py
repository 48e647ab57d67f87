"""The ``jobqueue`` command line. ``main`` is the command (``jobqueue.cli.root``: light, its
subcommands imported when run)."""

from typing import TYPE_CHECKING, Any

from jobqueue.cli.root import main

if TYPE_CHECKING:
    from jobqueue.cli.common import State


def __getattr__(name: str) -> Any:
    if name == "State":  # the CLI's state, with the client behind it: imported at first use
        from jobqueue.cli.common import State

        return State
    raise AttributeError(f"module 'jobqueue.cli' has no attribute {name!r}")


__all__ = ["State", "main"]
