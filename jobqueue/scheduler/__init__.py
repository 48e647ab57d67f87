"""The scheduler daemon."""

from jobqueue.scheduler.daemon import Scheduler, apply_overlap, plan_fires

__all__ = ["Scheduler", "apply_overlap", "plan_fires"]
