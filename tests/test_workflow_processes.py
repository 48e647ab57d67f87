"""A workflow through real worker crashes (docs/workflows.md, "Exactly once"): worker
processes on a real Redis server, SIGKILLed and SIGSTOPped while they run a chord's header.
Real server only; every process started here is killed at teardown, pass or fail."""

from __future__ import annotations

import random
import signal
import time
from collections.abc import Callable

import pytest
from test_worker_processes import (  # the worker-process harness, shared
    Procs,
    client_for,
    kill_one,
    procs_factory,
    server,
    stop_gracefully,
    stop_holding,
    wait_for,
)

from jobqueue.store.embedded import EmbeddedServer
from jobqueue.store.keys import PartitionKeys

pytestmark = pytest.mark.slow

__all__ = ["procs_factory", "server"]  # fixtures, used by name

PK = PartitionKeys("default", 0)
N = 1000


def test_a_1000_run_chord_under_sigkills_and_a_sigstop_gathers_once_with_every_result(
    server: EmbeddedServer, procs_factory: Callable[[str], Procs]
) -> None:
    """3 workers run a chord of 1,000 leaves; every 0.5 s one of them that holds runs is
    SIGKILLed and replaced, and once a worker holding runs is SIGSTOPped past its lease (its
    late commits are refused when it wakes). The gathering step is released once, its commit
    accepted once, with the 1,000 results in order; each leaf counted once."""
    args = ("--concurrency", "4", "--lease", "2", "--grace", "1")
    procs = procs_factory(server.url)
    jq = client_for(server.url)
    leaf = jq.declare_task("leaf", max_attempts=20)
    gather = jq.declare_task("gather", max_attempts=20)
    r = jq.redis
    rng = random.Random(30)
    live = [procs.worker(*args) for _ in range(3)]
    flow = jq.chord([leaf.s(i) for i in range(N)], gather.receiving(), flow_id="chaos-chord")
    last = flow.last

    killed: set[int] = set()
    paused = None
    deadline = time.monotonic() + 120
    while not last.refresh().finished:
        assert time.monotonic() < deadline, f"{r.zcard(PK.done)} of {N} leaves done"
        time.sleep(0.5)  # kept: the chaos's pace, a kill every 0.5 s
        if paused is None and len(killed) >= 2:
            # One worker holding runs is stopped for longer than its lease, then woken.
            for p in live:
                held = stop_holding(r, p)
                if held:
                    paused = p
                    break
                p.popen.send_signal(signal.SIGCONT)
            if paused is not None:
                live.remove(paused)
                live.append(procs.worker(*args))
                # Woken only once every run it held was claimed again (a newer fence): what
                # it still does with them is stale by construction.
                def reclaimed(held: dict[str, int] = held) -> bool:
                    return all(int(r.hget(PK.run(k), "fence") or 0) > f for k, f in held.items())

                wait_for(reclaimed, 30, "its runs to be reclaimed")
                paused.popen.send_signal(signal.SIGCONT)
                live.append(paused)
            continue
        if last.refresh().finished:
            break
        victim = kill_one(r, live, rng, holding=True)
        if victim is None:
            continue
        live.remove(victim)
        killed.add(victim.pid)
        live.append(procs.worker(*args))

    run = last.refresh()
    assert run.state == "done", run
    assert run.result["n"] == N and run.result["in_order"] is True
    assert run.result["fence"] == run.fence  # the accepted commit is the last claim's
    executions = int(r.hget("wf:gather", "executions") or 0)
    assert 1 <= executions <= run.attempt  # more only where its own worker was killed
    stats = r.hgetall(PK.stats)
    assert int(stats["released"]) == 1  # the gathering step was released once
    heard = last.dependencies()
    assert len(heard) == N and {d.outcome for d in heard} == {"done"}
    assert [d.result for d in heard] == list(range(N))
    assert {v.state for v in (h.refresh() for h in flow.runs[:N])} == {"done"}
    assert int(stats["completed"]) == N + 1  # one accepted commit per run
    wait_for(lambda: r.zcard(PK.outbox) == 0, 10, "the outbox to be relayed")
    assert len(killed) >= 2 and paused is not None
    for proc in live:
        assert stop_gracefully(proc, r) == 0, proc.text()[-2000:]
    print(
        f"\nchord: leaves={N} kills={len(killed)} paused=1 "
        f"lease_expiries={stats.get('lease_expired', 0)} rejected={stats.get('rejected', 0)} "
        f"gather_attempt={run.attempt} gather_executions={executions}"
    )
