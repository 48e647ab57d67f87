"""Exact limits: a queue's concurrency and rate limits that hold across all its partitions,
through permits leased from the limit's own slot (permit_take, permit_settle, global_limit;
jobqueue.worker.permits). The scripts with an explicit clock, then workers claiming a queue
of four partitions."""

from __future__ import annotations

import hashlib
import threading
from typing import Any

import pytest
from helpers import Send, intercept_worker_calls, make_worker, running, wait_for

from jobqueue import JobQueue
from jobqueue.errors import ConfigError, ConnectionFailed
from jobqueue.store.exact import (
    GLOBAL_LIMIT,
    PERMIT_SETTLE,
    PERMIT_TAKE,
    ExactKeys,
    Settled,
    Taken,
)
from jobqueue.store.scripts import Call, Script, ScriptRunner, scripts

Q = ExactKeys("q")


def take(runner: ScriptRunner, want: int, now: int, hold: int = 10_000, token: str = "t") -> Taken:
    return PERMIT_TAKE.parse(runner.run(PERMIT_TAKE.call(Q, want, hold, token, now)))


def settle(runner: ScriptRunner, now: int, live: int = 10_000, **lists: Any) -> Settled:
    return PERMIT_SETTLE.parse(runner.run(PERMIT_SETTLE.call(Q, live, now=now, **lists)))


def limit(runner: ScriptRunner, name: str, value: int | str | None) -> bool:
    return bool(GLOBAL_LIMIT.parse(runner.run(GLOBAL_LIMIT.call(Q, name, value, now=0))))


# -- the scripts ------------------------------------------------------------------------------


def test_without_an_exact_limit_every_permit_asked_for_is_granted_and_nothing_written(
    runner: ScriptRunner, redis_client: Any
) -> None:
    got = take(runner, 7, now=1_000)
    assert (got.granted, got.limited) == (7, False)
    assert redis_client.exists(Q.permits, Q.grants) == 0


def test_an_exact_cap_grants_permits_up_to_it(runner: ScriptRunner) -> None:
    limit(runner, "concurrency", 3)
    assert take(runner, 2, now=1_000, token="a").granted == 2
    second = take(runner, 5, now=1_001, token="b")
    assert (second.granted, second.limited) == (1, True)
    third = take(runner, 1, now=1_002, token="c")
    assert third.granted == 0 and third.next_ms == 1_000 + 10_000  # the first expiry


def test_a_permit_given_back_frees_its_place(runner: ScriptRunner) -> None:
    limit(runner, "concurrency", 1)
    assert take(runner, 1, now=1_000, token="a").granted == 1
    assert settle(runner, 1_100, binds=[("a:1", "p|r1|5")]).bound == 1
    assert take(runner, 1, now=1_200, token="b").granted == 0
    assert settle(runner, 1_300, returns=["p|r1|5"]).returned == 1
    assert take(runner, 1, now=1_400, token="c").granted == 1


def test_unused_permits_are_dropped_at_once(runner: ScriptRunner) -> None:
    limit(runner, "concurrency", 2)
    assert take(runner, 2, now=1_000, token="a").granted == 2
    settle(runner, 1_100, binds=[("a:1", "p|r1|5")], unused=["a:2"])
    assert take(runner, 2, now=1_200, token="b").granted == 1


def test_a_permit_whose_worker_died_expires_and_frees_its_place(runner: ScriptRunner) -> None:
    limit(runner, "concurrency", 1)
    assert take(runner, 1, now=1_000, hold=5_000, token="a").granted == 1
    settle(runner, 1_100, live=5_000, binds=[("a:1", "p|r1|5")])  # expires at 6,100
    assert take(runner, 1, now=6_000, token="b").granted == 0
    assert take(runner, 1, now=6_101, token="c").granted == 1


def test_heartbeats_extend_a_live_permit_but_never_revive_an_expired_one(
    runner: ScriptRunner,
) -> None:
    limit(runner, "concurrency", 1)
    take(runner, 1, now=1_000, hold=5_000, token="a")
    settle(runner, 1_100, live=5_000, binds=[("a:1", "p|r1|5")])
    assert settle(runner, 5_000, live=5_000, extends=["p|r1|5"]).extended == 1  # to 10,000
    assert take(runner, 1, now=9_000, token="b").granted == 0
    assert settle(runner, 10_001, live=5_000, extends=["p|r1|5"]).extended == 0
    assert take(runner, 1, now=10_002, token="c").granted == 1


def test_a_bind_of_an_expired_permit_is_refused_so_its_run_does_not_run(
    runner: ScriptRunner,
) -> None:
    limit(runner, "concurrency", 1)
    take(runner, 1, now=1_000, hold=500, token="a")
    got = settle(runner, 2_000, binds=[("a:1", "p|r1|5")])
    assert (got.bound, got.refused) == (0, ["p|r1|5"])


def test_an_exact_rate_grants_at_most_n_permits_in_any_window(runner: ScriptRunner) -> None:
    limit(runner, "rate", "3 1000")
    assert take(runner, 2, now=1_000, token="a").granted == 2
    assert take(runner, 2, now=1_500, token="b").granted == 1
    assert take(runner, 1, now=1_999, token="c").granted == 0
    # the window of 2,000 is (1000, 2000]: the grants of 1,000 have left it, 1,500's has not
    assert take(runner, 5, now=2_000, token="d").granted == 2
    assert take(runner, 1, now=2_499, token="e").granted == 0


def test_an_unused_permit_is_not_counted_as_a_claim_by_the_rate(runner: ScriptRunner) -> None:
    limit(runner, "rate", "2 1000")
    assert take(runner, 2, now=1_000, token="a").granted == 2
    settle(runner, 1_001, unused=["a:1", "a:2"])
    assert take(runner, 2, now=1_002, token="b").granted == 2


def test_bad_limits_are_refused_with_a_clear_error(jq: JobQueue) -> None:
    with pytest.raises(ConfigError, match="whole queue only"):
        jq.set_queue_concurrency("q", 3, per_key=True, exact=True)
    with pytest.raises(ConfigError, match="whole queue only"):
        jq.set_queue_rate("q", 3, 1.0, per_key=True, exact=True)
    with pytest.raises(ConfigError):
        jq.set_queue_concurrency("q", -1, exact=True)


# -- workers over four partitions --------------------------------------------------------------

MAX_RUNNING = """
local n = redis.call('INCR', KEYS[1])
if n > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], n) end
return n
"""


def exact_queue(redis_client: Any) -> JobQueue:
    jq = JobQueue(redis_client, partitions={"wide": 4})

    @jq.task(queue="wide")
    def busy() -> None:
        redis_client.eval(MAX_RUNNING, 2, "t:running", "t:max")
        try:
            threading.Event().wait(0.02)
        finally:
            redis_client.decr("t:running")

    return jq


def drain_under_an_exact_cap(redis_client: Any, runs: int = 60) -> int:
    jq = exact_queue(redis_client)
    assert jq.set_queue_concurrency("wide", 3, exact=True)
    handles = [jq.enqueue("busy") for _ in range(runs)]
    workers = [make_worker(jq, queues=["wide"], concurrency=8) for _ in range(2)]
    with running(workers[0]), running(workers[1]):
        wait_for(lambda: all(jq.get_run(h.run_id, "wide").state == "done" for h in handles),
                 timeout=60, what="every run done")
    return int(redis_client.get("t:max"))


def test_an_exact_cap_holds_across_partitions_and_workers(redis_client: Any) -> None:
    """Two workers of 8 slots each over 4 partitions: never more than 3 running at once."""
    assert 1 <= drain_under_an_exact_cap(redis_client) <= 3


def test_without_permits_the_cap_check_fails(
    redis_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check is not vacuous: workers whose claims skip the permits exceed the cap."""
    from jobqueue.worker.permits import Permits

    async def no_permits(self: Permits, queue: str, want: int) -> tuple[str, int, None]:
        return "", want, None

    monkeypatch.setattr(Permits, "take", no_permits)
    assert drain_under_an_exact_cap(redis_client) > 3


def test_the_scripts_expired_permits_check_catches_a_script_that_keeps_them(
    runner: ScriptRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A permit_take that counts expired permits too never frees a dead worker's place."""
    old = "local live = read('ZCOUNT', KEYS[1], '(' .. int(now), '+inf')"
    new = "local live = read('ZCARD', KEYS[1])"
    good = scripts()["permit_take"]
    source, plain = good.source.replace(old, new), good.plain.replace(old, new)
    assert source != good.source
    monkeypatch.setitem(scripts(), "permit_take", Script(
        "permit_take", source, hashlib.sha1(source.encode()).hexdigest(),
        plain, hashlib.sha1(plain.encode()).hexdigest(),
    ))
    with pytest.raises(AssertionError):
        test_a_permit_whose_worker_died_expires_and_frees_its_place(runner)


def test_an_exact_rate_holds_across_partitions_in_every_window(
    redis_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """20 claims per second over 4 partitions and 2 workers: the permits used by claims,
    each at its grant's time on the limit's clock (as the replies say), number at most 20 in
    any second (a permit no claim used is dropped and leaves the count), so 50 runs' claims
    spread over more than a second."""
    jq = JobQueue(redis_client, partitions={"wide": 4})
    granted_at: dict[str, int] = {}  # token -> grant time
    used: list[str] = []  # the token of each permit a claim bound

    def record(calls: list[Call], send: Send) -> list[Any]:
        replies = send(calls)
        for call, reply in zip(calls, replies, strict=True):
            if isinstance(reply, Exception):
                continue
            if call.script == "permit_take" and int(reply[1]) > 0:
                granted_at[str(call.args[3])] = int(reply[0])
            if call.script == "permit_settle":
                binds = int(call.args[2])
                refused = {str(r) for r in reply[3:]}
                pairs = call.args[3 : 3 + 2 * binds]
                used.extend(
                    str(taken).rsplit(":", 1)[0]
                    for taken, member in zip(pairs[::2], pairs[1::2], strict=True)
                    if str(member) not in refused
                )
        return replies

    @jq.task(queue="wide")
    def quick() -> None: ...

    assert jq.set_queue_rate("wide", 20, 1.0, exact=True)
    intercept_worker_calls(monkeypatch, record)
    handles = [jq.enqueue(quick) for _ in range(50)]
    workers = [make_worker(jq, queues=["wide"], concurrency=8) for _ in range(2)]
    with running(workers[0]), running(workers[1]):
        wait_for(lambda: all(jq.get_run(h.run_id, "wide").state == "done" for h in handles),
                 timeout=60, what="every run done")
    assert len(used) == 50
    times = sorted(granted_at[token] for token in used)
    for i, t in enumerate(times):
        assert sum(1 for u in times[: i + 1] if u > t - 1_000) <= 20, t
    starts = sorted(jq.get_run(h.run_id, "wide").started_ms or 0 for h in handles)
    assert starts[-1] - starts[0] >= 1_000


def test_the_cli_sets_exact_limits_and_refuses_them_per_key(jq: JobQueue) -> None:
    from click.testing import CliRunner

    from jobqueue.cli import State, main

    def invoke(*args: str) -> Any:
        return CliRunner().invoke(main, list(args), obj=State(None, jq))

    ok = invoke("queue", "concurrency", "q", "5", "--exact")
    assert ok.exit_code == 0 and "exact concurrency limit 5" in ok.output
    assert "already" in invoke("queue", "concurrency", "q", "5", "--exact").output
    rate = invoke("queue", "rate", "q", "100", "--per", "1", "--exact")
    assert rate.exit_code == 0 and "exact rate limit 100 per 1s" in rate.output
    bad = invoke("queue", "concurrency", "q", "5", "--exact", "--per-key")
    assert bad.exit_code == 2 and "Traceback" not in bad.output


def test_a_worker_whose_first_look_at_the_limits_fails_still_takes_permits(
    redis_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The limit's master unreachable when the worker starts: its first look at the queue's
    exact limits fails. It must not claim without permits meanwhile (seen on a cluster: 7
    runs started beside 5 under a cap of 5, until the next look 5 s later)."""
    probes: list[int] = []

    def first_probe_fails(calls: list[Call], send: Send) -> list[Any]:
        replies = send(calls)
        out = []
        for call, reply in zip(calls, replies, strict=True):
            if call.script == "permit_take" and call.args[3] == "probe":
                probes.append(1)
                if len(probes) <= 2:  # each worker's first look
                    reply = ConnectionFailed("the limit's master is down")
            out.append(reply)
        return out

    intercept_worker_calls(monkeypatch, first_probe_fails)
    assert 1 <= drain_under_an_exact_cap(redis_client) <= 3
    assert len(probes) >= 2
