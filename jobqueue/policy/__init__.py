"""Pure rules, no I/O: cron, jitter, misfire, retry back-off, hashing, time parsing, the
capacity arithmetic and the health checks of a Redis setup."""
