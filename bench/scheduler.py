"""Capacity of recurring jobs: Redis memory per job and the runs/s one scheduler creates.

    .venv/bin/python bench/scheduler.py [--url URL] [--n N] [--quick] [--flush]

1. Register N hourly jobs (``0 * * * *``, UTC, jitter 60 s, fire-once) in pipelined batches of
   10,000: the exact definition JSON and next-fire entry ``Recurring.schedule`` writes (the
   per-job validation is done once for the shared schedule: it is the same for every job).
   Redis ``used_memory`` before and after gives bytes per recurring job.
2. Make them all fall due at once and time ONE ``Scheduler.tick`` (explicit clock) that turns
   them into N runs: runs/s for one scheduler process, end to end (read due jobs, plan, create
   runs in the queue slot, advance next fire times in the scheduler slot). Besides the wall
   clock, the CPU time the scheduler process and the Redis server each spent per run: on a
   shared machine the wall clock swings with the load, the CPU times much less, and they say
   what one scheduler does with a core of its own next to a server with a core of its own
   (the tick overlaps its planning with the server's script time: the larger one bounds it).
3. Extrapolate to 5,000,000 hourly jobs (the sizing example in docs/design.md).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import redis
from _common import (
    BenchError,
    add_common_args,
    bench_server,
    describe_environment,
    fail,
    fmt_int,
    runs_from_args,
    say,
)

from jobqueue import JobQueue
from jobqueue.errors import JobQueueError
from jobqueue.scheduler.daemon import Scheduler
from jobqueue.schedules.recurring import first_fire_after, make_definition
from jobqueue.store.keys import SchedKeys

DEFAULT_N = 1_000_000
QUICK_N = 50_000
PIPELINE_BATCH = 10_000
SIZING_JOBS = 5_000_000  # the sizing example in docs/design.md
HERD_WINDOW_S = 60  # pre-create the top-of-hour herd inside a 60 s lookahead
TARGET_BYTES_PER_JOB = 300
TARGET_RUNS_PER_S = 50_000
T0 = 1_800_000_000_000  # 2027-01-15T08:00:00Z

T = TypeVar("T")


def timed(fn: Callable[[], T]) -> tuple[T, float]:
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def used_memory(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def server_cpu_s(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def register(jq: JobQueue, n: int) -> None:
    template = make_definition(jq, "job-0", "report", cron="0 * * * *", jitter=60)
    first = first_fire_after(template, T0)
    assert first is not None
    text = template.to_json()
    sk = SchedKeys(0)
    client = jq.redis
    for start in range(0, n, PIPELINE_BATCH):
        ids = [f"job-{i}" for i in range(start, min(n, start + PIPELINE_BATCH))]
        pipe = client.pipeline(transaction=False)
        pipe.hset(sk.defs, mapping=dict.fromkeys(ids, text))
        pipe.zadd(sk.next, dict.fromkeys(ids, first))
        pipe.execute()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(parser, default_n=DEFAULT_N, quick_n=QUICK_N)
    args = parser.parse_args(argv)
    n = runs_from_args(args)
    try:
        with bench_server(args.url, allow_flush=args.flush) as server:
            env = describe_environment(server)
            for line in env.lines():
                say(line)
            jq = JobQueue.from_url(server.url)
            jq.recurring.partitions  # noqa: B018 (records K = 1 before measuring)
            jq.register_queue("default")
            client = server.client
            before = used_memory(client)
            _, reg_s = timed(lambda: register(jq, n))
            after = used_memory(client)
            per_job = (after - before) / n
            say(
                f"\nregistered {fmt_int(n)} hourly jobs in {reg_s:.1f} s "
                f"({fmt_int(n / reg_s)} jobs/s, pipelined batches of {fmt_int(PIPELINE_BATCH)})"
            )
            say(
                f"redis memory: {fmt_int(after - before)} bytes -> {per_job:.0f} bytes per "
                f"recurring job (target <= {TARGET_BYTES_PER_JOB}: "
                f"{'PASS' if per_job <= TARGET_BYTES_PER_JOB else 'MISS'})"
            )

            sched = Scheduler(jq, lookahead=0, batch=1000, install_signal_handlers=False)
            fire_at = T0 + 3_600_000
            cpu_server, cpu_client = server_cpu_s(client), time.process_time()
            report, fire_s = timed(lambda: sched.tick(now=fire_at + 10))
            cpu_client = (time.process_time() - cpu_client) / n * 1e6
            cpu_server = (server_cpu_s(client) - cpu_server) / n * 1e6
            sched.close()
            if report.runs_created != n or report.advanced != n:
                raise BenchError(
                    f"tick created {report.runs_created:,} runs and advanced "
                    f"{report.advanced:,} jobs; expected {n:,} each"
                )
            rate = n / fire_s
            state_bytes = int(client.memory_usage(SchedKeys(0).state, samples=0) or 0)
            say(
                f"one scheduler, all {fmt_int(n)} due at once: {fmt_int(n)} runs in "
                f"{fire_s:.1f} s -> {fmt_int(rate)} runs/s (target >= "
                f"{fmt_int(TARGET_RUNS_PER_S)}: {'PASS' if rate >= TARGET_RUNS_PER_S else 'MISS'})"
            )
            bound = 1e6 / max(cpu_client, cpu_server)
            say(
                f"CPU per run: scheduler process {cpu_client:.1f} us, redis-server "
                f"{cpu_server:.1f} us -> {fmt_int(bound)} runs/s with a core each "
                f"({'PASS' if bound >= TARGET_RUNS_PER_S else 'MISS'}; "
                f"{fmt_int(1e6 / (cpu_client + cpu_server))} runs/s on one core)"
            )
            say(
                f"after the first fire each job also has counters: "
                f"{state_bytes / n:.0f} bytes per job more"
            )
    except (BenchError, JobQueueError, redis.exceptions.RedisError) as exc:
        return fail(str(exc))

    need = SIZING_JOBS / HERD_WINDOW_S
    say(
        f"\nextrapolated to {fmt_int(SIZING_JOBS)} hourly jobs "
        "(the sizing example in docs/design.md):"
    )
    say(
        f"  definitions: {fmt_int(SIZING_JOBS * per_job / 1e6)} MB "
        f"(+{fmt_int(SIZING_JOBS * state_bytes / n / 1e6)} MB of counters once fired)"
    )
    say(
        f"  one scheduler creates the whole top-of-hour herd in {SIZING_JOBS / rate:.0f} s "
        f"({SIZING_JOBS / bound:.0f} s with a core of its own)"
    )
    client_rate, server_rate = 1e6 / cpu_client, 1e6 / cpu_server
    say(
        f"  pre-creating it inside a {HERD_WINDOW_S} s lookahead needs {fmt_int(need)} runs/s. "
        f"Scheduler side: {math.ceil(need / client_rate)} process(es) (one plans "
        f"{fmt_int(client_rate)} runs/s of CPU; {math.ceil(need / rate)} at this run's wall "
        f"rate on this shared machine), on distinct scheduler partitions (K >= processes). "
        f"Server side: one Redis runs {fmt_int(server_rate)} runs/s of these scripts on its "
        f"single thread, so {math.ceil(need / server_rate)} server(s) or cluster shard(s) "
        f"(queue and scheduler partitions spread over them), or a lookahead of "
        f"{math.ceil(SIZING_JOBS / server_rate):.0f} s or more with one server"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
