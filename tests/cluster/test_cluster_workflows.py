"""A workflow's fan-in through a Redis Cluster failover (docs/workflows.md, "Exactly once";
docs/design.md, invariant 9 and "Workflows"): a 1,000-run chord spread over the three masters
and two queues, drained by real worker processes, while a master is SIGKILLed mid-flow and its
replica takes over. 1,000 fits: each case takes 3 to 16 s on a loaded 2-core machine.

What a failover may lose, and why the test still asserts exactly once (docs/guarantees.md,
"When Redis itself fails"): replication is asynchronous, so the dead master's last claims,
completions, outbox clearings and deliveries can be missing on its heir. A lost claim or
completion makes a header run run again, and its outcome is delivered again; a lost clearing
makes the relay deliver again; a lost delivery to the callback, whose outbox entry the relay
had already cleared on the header run's own (healthy) master, nothing relays again: the
workers' audit delivers it (every ``Settings.flow_audit_s``, to the runs that waited that
long, the outcomes of finished dependencies they never heard of). Each counts once, because
the callback's partition records a dependency by its run id. The three cases:

- callback-master-in-sync: the callback's master dies with its replica in sync, so nothing
  is lost; deliveries to it are refused during the outage and must wait in the outboxes
  until the heir takes them.
- header-master-lagging: another master dies, its replica cut off (stopped, its link closed)
  while 100 more header runs ran: the heir lacks their claims, completions and outbox
  clearings, so they run again and are delivered again, which must count nothing.
- callback-master-lagging: the callback's master dies, its replica cut off the same way:
  besides those losses for the header runs it holds, the heir lacks deliveries of header runs
  of the other masters whose outbox entries are gone. The test makes sure some are lost
  before the kill (acknowledged by the callback's master after its replica's link was
  closed, their outbox entries cleared on a master that does not fail), reads on the heir,
  before anything can write to it, that it lacks them, and finds in the workers' logs that
  the audit delivered at least as many outcomes to the callback's partition.

The audit's period is a second in the third case only (it acts at the workers' outbox sweeps,
every 2 s); in the first two it is an hour (it never acts within the test), and the test
asserts it delivered nothing: the relay alone rides those failovers out. The one write the docs
say a failover loses for good, an enqueue, is made durable with the library's own mechanism
(``Settings(durable_replicas=1)`` on the test's client: the chord is written only once a
replica has it). The workers' app does not use it: with it the relay would keep the outbox
entries until a replica has the deliveries, and the third case could lose none. The callback is
still waiting when the master dies (asserted), so the failover cannot cut into its execution:
it runs exactly once.

The worker processes run this module as their app (``--app test_cluster_workflows:app``, with
tests/cluster on PYTHONPATH): the tasks below. Each execution appends a line to a file in the
test's temp dir, a side effect no failover can take back. Every process started here is
killed at teardown, pass or fail, and dies with the test process (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import redis
from cluster_launcher import Cluster, Node
from helpers import FAILING_OVER, wait_for
from redis.crc import key_slot

from jobqueue import JobQueue
from jobqueue.context import FROM_WORKER, RunContext
from jobqueue.handles import RunHandle
from jobqueue.models import Run
from jobqueue.settings import Settings

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
LOG_DIR_ENV = "JQ_TEST_WORKFLOW_LOG_DIR"
AUDIT_ENV = "JQ_TEST_FLOW_AUDIT_S"  # the workers' Settings.flow_audit_s, set per case
# Two header queues of 16 partitions each (spread over the three masters) and the callback's
# queue of one: the chord crosses 33 partitions, so every delivery crosses slots.
PARTITIONS = {"a": 16, "b": 16, "c": 1}
N = 1000
KILL_AFTER = N * 3 // 10  # header runs executed before the master dies: mid-flow
LEASE_S = 4  # above twice the cluster's node timeout (1 s), as docs/guarantees.md asks
AUDIT_S = 1.0  # the audit's period where the case needs it: it acts within seconds
NO_AUDIT_S = 3600.0  # elsewhere: it never acts within the test (nothing waits an hour)
# What the audit logs (a WARNING) when it delivered outcomes a waiting run never heard of.
AUDITED = re.compile(r"delivered (\d+) outcomes to waiting runs of (\S+) that had not heard")
T = TypeVar("T")

# -- the app the worker processes run ------------------------------------------------------

# The CLI points it at --redis-url; the workers' audit period comes from the test (AUDIT_ENV).
app = JobQueue.from_url(partitions=PARTITIONS, settings=Settings(
    flow_audit_s=float(os.environ.get(AUDIT_ENV, Settings().flow_audit_s))))


def _record(name: str, entry: dict[str, Any]) -> None:
    """One line per execution, appended in one write (O_APPEND): survives any failover."""
    line = json.dumps(entry, separators=(",", ":")) + "\n"
    fd = os.open(Path(os.environ[LOG_DIR_ENV]) / f"{name}.jsonl",
                 os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


@app.task(max_attempts=20)
def leaf(i: int, ctx: RunContext = FROM_WORKER) -> int:
    _record("leaf", {"i": i, "run": ctx.run_id, "fence": ctx.fence})
    time.sleep(0.01)  # the work: a real duration
    return i


@app.task(max_attempts=20, queue="c")
def gather(results: list[int], ctx: RunContext = FROM_WORKER) -> int:
    _record("gather", {"run": ctx.run_id, "fence": ctx.fence, "results": results})
    return len(results)


# -- the harness ---------------------------------------------------------------------------


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def read_log(directory: Path, name: str) -> list[dict[str, Any]]:
    path = directory / f"{name}.jsonl"
    if not path.exists():
        return []
    # A line being appended right now may be incomplete: only whole lines count.
    return [json.loads(line) for line in path.read_text().splitlines(keepends=True)
            if line.endswith("\n")]


@contextlib.contextmanager
def worker_processes(
    url: str, count: int, log_dir: Path, queues: list[str], audit_s: float
) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``count`` ``jobqueue worker`` processes of this module's app, auditing the waiting runs
    every ``audit_s``; killed on the way out."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(HERE), str(HERE.parent), str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "PYTHONUNBUFFERED": "1",
        LOG_DIR_ENV: str(log_dir),
        AUDIT_ENV: str(audit_s),
    }
    env.pop("JOBQUEUE_REDIS_URL", None)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for n in range(count):
            cmd = [sys.executable, "-m", "jobqueue.cli", "--redis-url", url, "worker",
                   "--app", f"{Path(__file__).stem}:app", "--concurrency", "8",
                   "--lease", str(LEASE_S), "--grace", "1"]
            for q in queues:
                cmd += ["--queue", q]
            with (log_dir / f"worker-{n}.log").open("wb") as err:
                procs.append(subprocess.Popen(
                    cmd, cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL, stderr=err, preexec_fn=_die_with_parent))
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(10)


def worker_logs(log_dir: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                     for p in sorted(log_dir.glob("worker-*.log")))


def audited(log_dir: Path) -> dict[str, int]:
    """The outcomes the workers' audit delivered, by partition tag (from their logs)."""
    counts: dict[str, int] = {}
    for p in log_dir.glob("worker-*.log"):
        for m in AUDITED.finditer(p.read_text(errors="replace")):
            counts[m[2]] = counts.get(m[2], 0) + int(m[1])
    return counts


def until(call: Callable[[], T | None], deadline: float, what: str) -> T:
    """call()'s first true value, retried while the cluster is failing over (jobqueue's clients
    never re-send a command; the caller tries again, as the daemons do)."""
    value: T = wait_for(call, deadline - time.monotonic(), what, 0.05, retrying=FAILING_OVER)
    return value


def master_port(cluster_jq: JobQueue, key: str) -> int:
    return int(cluster_jq.redis.get_node_from_key(key).port)


def finished_run(jq: JobQueue, handle: RunHandle[Any]) -> Run[Any] | None:
    run = jq.get_run(handle.run_id, handle.queue)
    return run if run.finished else None


def header_states(jq: JobQueue, runs: list[RunHandle[Any]]) -> set[str]:
    pipe = jq.redis.pipeline(transaction=False)
    for h in runs:
        pipe.hget(jq.keys_for(h.queue, h.run_id).run(h.run_id), "state")
    return set(pipe.execute())


def take_over(cluster: Cluster, heir: Node, slots: list[Any], deadline: float) -> None:
    """The lagging replica takes its dead master's slots (no vote needed), unless the cluster
    already promoted it."""
    with heir.client() as c:

        def taken() -> bool:
            if cluster.slots_of(heir.port) == slots:
                return True
            with contextlib.suppress(redis.exceptions.RedisError):
                c.execute_command("CLUSTER", "FAILOVER", "TAKEOVER")
            return False

        wait_for(taken, deadline - time.monotonic(), "the lagging replica to take over", 0.1)


# -- the test ------------------------------------------------------------------------------

# case -> (the victim is the callback's master, its replica is cut off before the kill)
CASES = {
    "callback-master-in-sync": (True, False),
    "header-master-lagging": (False, True),
    "callback-master-lagging": (True, True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_1000_run_chord_over_three_masters_gathers_once_through_a_master_failover(
    cluster: Cluster, cluster_url: str, tmp_path: Path, case: str
) -> None:
    """Two worker processes drain a 1,000-run chord whose header alternates between queues
    'a' and 'b' (16 partitions each, on all three masters) and whose callback lives in queue
    'c'. Once 30% of the header has run, a master holding header runs of both queues is
    SIGKILLed and its replica takes over:

    - the callback's master, its replica in sync: deliveries to it are refused during the
      outage and must stay in the outboxes until the heir takes them;
    - another master, whose replica was cut off (stopped, its link closed) while 100 more
      header runs ran: the heir lacks their claims, completions and outbox clearings, so they
      run again and their outcomes are delivered again, which must count nothing;
    - the callback's master, its replica cut off the same way: the heir also lacks deliveries
      whose outbox entries were cleared on the other masters (at least one, made sure of
      before the kill and read on the heir): the workers' audit must deliver them again.

    Either way the workers ride it out, and the callback runs exactly once, with the 1,000
    results in header order; every header run is done and each was counted once."""
    hits_callback_master, lagging = CASES[case]
    audits = hits_callback_master and lagging  # the one case that needs the audit
    started = time.monotonic()
    deadline = started + 90  # the whole test, failover included; in practice 3-16 s
    jq = JobQueue.from_url(cluster_url, partitions=PARTITIONS, tasks=app,
                           settings=Settings(durable_replicas=1, durable_timeout_s=5))
    header = [leaf.s(i).with_options(queue="ab"[i % 2]) for i in range(N)]
    flow = jq.chord(header, gather.receiving(), flow_id="failover-chord")
    callback = flow.last
    header_runs = flow.runs[:N]
    assert flow.created and callback.queue == "c"
    callback_keys = jq.keys_for("c", callback.run_id)
    got_key = callback_keys.got(callback.run_id)  # the dependencies the callback heard of

    def master_of(h: RunHandle[Any]) -> int:
        return master_port(jq, jq.keys_for(h.queue, h.run_id).due)

    callback_master = cluster.master_of_slot(key_slot(callback_keys.due.encode()))
    assert len({master_of(h) for h in header_runs}) == 3  # the header is on every master
    victim = callback_master if hits_callback_master else next(
        n for n in cluster.master_nodes() if n.port != callback_master.port)
    on_victim = [h for h in header_runs if master_of(h) == victim.port]
    assert {h.queue for h in on_victim} == {"a", "b"}  # the failover hits both header queues
    elsewhere = {h.run_id: h for h in header_runs if master_of(h) != victim.port}
    victim_slots = cluster.slots_of(victim.port)
    heir = cluster.replica_of(victim)

    def executed() -> int:
        return len({e["i"] for e in read_log(tmp_path, "leaf")})

    def lost_for_good(victim_client: redis.Redis[str], before_cut: set[str]) -> set[str]:
        """The header runs of the masters that do not fail whose deliveries the victim
        acknowledged after its replica's link was closed (so the heir cannot have them), and
        whose outbox entries are gone (so nothing relays them again; a run done on a master
        that does not fail never has an entry again)."""
        after_cut = [elsewhere[r] for r in set(victim_client.hkeys(got_key)) - before_cut
                     if r in elsewhere]
        pipe = jq.redis.pipeline(transaction=False)
        for h in after_cut:
            pipe.zscore(jq.keys_for(h.queue, h.run_id).outbox, h.run_id)
        return {h.run_id for h, entry in zip(after_cut, pipe.execute(), strict=True)
                if entry is None}

    lost: set[str] = set()
    try:
        with worker_processes(cluster_url, 2, tmp_path, ["a", "b", "c"],
                              AUDIT_S if audits else NO_AUDIT_S) as workers:
            until(lambda: executed() >= KILL_AFTER, deadline, f"{KILL_AFTER} header runs")
            # Mid-flow: the header is partly done and the callback still waits on it, so its
            # claim and its execution can only happen after the failover.
            assert jq.get_run(callback.run_id, "c").state == "waiting"
            if not lagging:
                victim.kill()
                killed = time.monotonic()
                until(lambda: cluster.slots_of(heir.port) == victim_slots, deadline,
                      "the replica to be promoted")
            else:
                assert heir.process is not None
                if audits:  # only the test promotes it: its data stay as cut off until then
                    with heir.client() as c:
                        c.config_set("cluster-replica-no-failover", "yes")
                heir.process.send_signal(signal.SIGSTOP)
                try:  # whatever happens, the replica is let go (a stopped node breaks the rest)
                    with victim.client() as c:
                        assert c.client_kill_filter(_type="slave") == 1  # "slave": redis-py 6.1
                        # What the callback heard of so far; anything later is the victim's.
                        before_cut = set(c.hkeys(got_key)) if audits else set()
                        until(lambda: executed() >= KILL_AFTER + 100, deadline, "100 more runs")
                        # Kept: a window for their commits and relays, acknowledged by the
                        # victim (no sign of the last one to wait for).
                        time.sleep(0.2)
                        if audits:
                            lost = until(lambda: lost_for_good(c, before_cut), deadline,
                                         "a delivery that only the callback's master has")
                    victim.kill()
                    killed = time.monotonic()
                finally:
                    heir.process.send_signal(signal.SIGCONT)
                if audits:
                    # Before it is promoted nothing writes to the heir: it lacks the lost ones.
                    with heir.client() as c:
                        c.execute_command("READONLY")
                        role, heir_got = c.execute_command("ROLE")[0], set(c.hkeys(got_key))
                    assert role == "slave"
                    assert not lost & heir_got, sorted(lost & heir_got)
                take_over(cluster, heir, victim_slots, deadline)
            promoted = time.monotonic()
            try:
                run = until(lambda: finished_run(jq, callback), deadline,
                            "the callback to finish")
            except AssertionError as exc:  # (what the workers said: a failing audit, say)
                raise AssertionError(f"{exc}\n{worker_logs(tmp_path)}") from None
            finished = time.monotonic()
            assert all(p.poll() is None for p in workers), worker_logs(tmp_path)  # rode it out
            # A header run whose completion the failover lost may still be running on the heir
            # (its outcome was delivered before): it runs again once its lease expires, and
            # its second delivery must change nothing.
            until(lambda: header_states(jq, header_runs) == {"done"}, deadline,
                  "every header run to be done")
            outboxes = [jq.partition_keys(q, p).outbox
                        for q, n in PARTITIONS.items() for p in range(n)]
            until(lambda: sum(int(jq.redis.zcard(k)) for k in outboxes) == 0 or None,
                  deadline, "every outbox to be relayed")
            for p in workers:
                p.send_signal(signal.SIGTERM)
            for p in workers:
                assert p.wait(10) == 0, worker_logs(tmp_path)

        # The callback ran once, with every header result in the header's order.
        assert run.state == "done", (run, worker_logs(tmp_path))
        assert run.result == N
        executions = read_log(tmp_path, "gather")
        assert len(executions) == 1, [len(e["results"]) for e in executions]
        assert executions[0]["results"] == list(range(N))
        assert executions[0]["fence"] == run.fence  # its accepted commit is that execution's
        stats = jq.redis.hgetall(callback_keys.stats)
        assert int(stats.get("released", 0)) == 1  # released once

        # Each dependency heard of once, done, with its own result.
        heard = callback.dependencies()
        assert [(d.run_id, d.outcome, d.result) for d in heard] == [
            (h.run_id, "done", i) for i, h in enumerate(header_runs)]

        # The lost deliveries were made again by the audit, and only by it (nothing else
        # could): it delivered at least as many to the callback's partition. Where the audit
        # is kept out of the way, it delivered nothing: the relay alone rode it out.
        delivered_by_audit = audited(tmp_path)
        if audits:
            assert lost  # (waited for above)
            assert delivered_by_audit.get(callback_keys.tag, 0) >= len(lost), (
                len(lost), delivered_by_audit, worker_logs(tmp_path))
        else:
            assert not delivered_by_audit, delivered_by_audit

        # No header run lost: each ran and is done (waited for above). Where the failover lost
        # a claim or a completion the run ran again: certain when the replica lagged (else
        # that case tested nothing), rare otherwise.
        ran = read_log(tmp_path, "leaf")
        assert {e["i"] for e in ran} == set(range(N))
        again = len(ran) - N
        assert again > 0 or not lagging, "the lagging failover lost no completion"
    finally:
        jq.close()
        if audits:
            with contextlib.suppress(redis.exceptions.RedisError), heir.client() as c:
                c.config_set("cluster-replica-no-failover", "no")
        cluster.restore(victim)

    print(f"\nchord over a failover ({case}): header={N} on_victim={len(on_victim)} "
          f"re-executed={again} lost_deliveries={len(lost)} "
          f"audited={sum(delivered_by_audit.values())} kill_at={killed - started:.1f}s "
          f"failover={promoted - killed:.1f}s callback_done={finished - started:.1f}s")
