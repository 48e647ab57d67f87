"""The schedulers' health checks (``checks``); the scheduler daemon itself is
``jobqueue.recurring.daemon``."""
