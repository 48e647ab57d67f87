"""What the daemons need at run time: signal handling, logs, metrics."""
