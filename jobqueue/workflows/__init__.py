"""Workflows: chains, groups, chords and general dependency graphs of runs (see
docs/workflows.md). ``task.s(...)`` and ``task.receiving(...)`` make the steps; the client's
``chain``, ``group``, ``chord`` and ``workflow`` create them."""

from jobqueue.workflows.canvas import POLICIES, Dependency, Signature

__all__ = ["POLICIES", "Dependency", "Signature"]
