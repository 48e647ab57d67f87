"""Deprecated: the old name of ``jobqueue.queries`` (it shadowed the standard library's
``inspect`` for anyone importing it unqualified). Kept importable, with a DeprecationWarning,
for code written against it; it will be removed."""

import warnings

from jobqueue.queries import *  # noqa: F403
from jobqueue.queries import __all__ as __all__

warnings.warn(
    "jobqueue.inspect is deprecated: import jobqueue.queries instead",
    DeprecationWarning,
    stacklevel=2,
)
