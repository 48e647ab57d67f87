"""The ``jobqueue`` command line."""

from jobqueue.cli.common import State
from jobqueue.cli.core import main

__all__ = ["State", "main"]
