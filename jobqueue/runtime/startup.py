"""A daemon started before its Redis (docker compose, Kubernetes): it waits for the server
instead of exiting, with a back-off and one log line per try, as it does after an outage
later on. Refused credentials or a bad URL are not waited for: they do not pass by
themselves."""

from __future__ import annotations

import logging
import threading

from jobqueue.client.sync import JobQueue
from jobqueue.errors import Unreachable
from jobqueue.policy.backoff import Backoff
from jobqueue.runtime.clock import REAL_CLOCK, Clock
from jobqueue.store.connection import redact

log = logging.getLogger("jobqueue")

FIRST_PAUSE_S = 0.5
PAUSE_CAP_S = 5.0


def connect_when_up(
    jq: JobQueue, timeout: float | None = None, *, clock: Clock = REAL_CLOCK
) -> None:
    """Connect ``jq``, trying again while Redis is unreachable: for ever, or for ``timeout``
    seconds, after which the last Unreachable is raised."""
    backoff = Backoff(FIRST_PAUSE_S, PAUSE_CAP_S)
    deadline = None if timeout is None else clock.monotonic() + timeout
    never = threading.Event()
    tries = 0
    while True:
        try:
            jq.connect()
        except Unreachable as exc:
            tries += 1
            left = None if deadline is None else deadline - clock.monotonic()
            if left is not None and left <= 0:
                raise Unreachable(
                    f"{exc} (still unreachable after {tries} tries in {timeout:g} s, "
                    "--connect-timeout)"
                ) from None
            pause = backoff.next() if left is None else min(backoff.next(), left)
            log.warning(
                "Redis not reachable yet (%s); try %d, the next in %.1fs%s",
                exc, tries, pause,
                "" if timeout is None else f" (giving up {timeout:g}s after the start)",
            )
            clock.wait(never, pause)
        else:
            if tries:
                log.info("connected to %s after %d tries", redact(jq.url or ""), tries + 1)
            return
