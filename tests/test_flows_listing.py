"""`jobqueue flows` (docs/workflows.md, "Seeing a flow"): the newest workflows and batches with
their progress k/n counted over every run in every queue, one flow's runs and edges, expired
records counted as finished, and flows whose records all expired forgotten by the workers'
tidy. Both backends; the CLI runs in this process on the test's client."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner
from helpers import server_time_past
from starlette.testclient import TestClient

from jobqueue.cli import main
from jobqueue.cli.common import State
from jobqueue.client.relay import tidy_flows_steps
from jobqueue.client.sync import JobQueue
from jobqueue.dashboard.app import create_app
from jobqueue.dashboard.flow_drawing import layers
from jobqueue.errors import Fatal
from jobqueue.ops import flow_queries
from jobqueue.ops.flow_queries import FlowEdge, FlowRun
from jobqueue.testing import run_due


@pytest.fixture
def app(jq: JobQueue) -> JobQueue:
    @jq.task
    def step(x: int = 0) -> int:
        return x

    @jq.task(max_attempts=1)
    def boom() -> None:
        raise Fatal("boom")

    return jq


def cli(jq: JobQueue, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args), obj=State(None, jq))
    return result.exit_code, result.stdout, result.stderr


def cli_json(jq: JobQueue, *args: str) -> Any:
    code, out, err = cli(jq, *args, "--json")
    assert code == 0, err
    return json.loads(out)


def step(jq: JobQueue) -> Any:
    return jq.resolve_task("step")


def test_flows_lists_each_flow_with_its_progress_and_runs_by_state(app: JobQueue) -> None:
    s = step(app)
    app.chain(s.s(1), s.s(2), s.s(3), flow_id="c")
    (row,) = cli_json(app, "flows")
    assert (row["flow_id"], row["progress"], row["runs"]) == ("c", "0/3", 3)
    assert row["states"] == {"waiting": 2, "pending": 1, "running": 0, "done": 0, "dead": 0,
                             "cancelled": 0, "expired": 0}
    run_due(app)
    (row,) = cli_json(app, "flows")
    assert (row["progress"], row["states"]["done"]) == ("3/3", 3)


def test_flows_counts_the_dead_and_the_cancelled_as_finished_and_failed(app: JobQueue) -> None:
    s, boom = step(app), app.resolve_task("boom")
    app.chord([boom.s(), s.s(1)], s.s(), flow_id="f")  # the callback dies with boom
    run_due(app)
    (row,) = cli_json(app, "flows")
    assert (row["progress"], row["states"]["dead"]) == ("3/3", 2)
    code, out, _ = cli(app, "flows")
    assert code == 0
    header, line = out.splitlines()
    assert header.split()[:3] == ["FLOW", "FINISHED", "FAILED"]
    assert line.split()[:3] == ["f", "3/3", "2"]


def test_flows_lists_the_newest_first_and_stops_at_the_limit(app: JobQueue) -> None:
    s = step(app)
    for name in ("first", "second", "third"):
        app.group([s.s()], flow_id=name)
        server_time_past(app, app.server_time_ms())  # (created in different milliseconds)
    assert [r["flow_id"] for r in cli_json(app, "flows")] == ["third", "second", "first"]
    assert [r["flow_id"] for r in cli_json(app, "flows", "--limit", "2")] == ["third", "second"]


def test_a_flow_grown_into_another_queue_later_keeps_its_place_by_creation(
    app: JobQueue,
) -> None:
    """A child of the old flow adds a run to queue b after the new flow was made: the old
    flow is still the older, and does not push the new one out of a listing of one."""
    s = step(app)

    @app.task
    def grower(ctx: Any) -> None:
        ctx.add_to_flow(s.s(1).with_options(queue="b"))

    app.batch([grower.s()], on_complete=s.s(), batch_id="old")
    server_time_past(app, app.server_time_ms())
    app.group([s.s()], flow_id="new")  # the newest in old's only partition so far
    server_time_past(app, app.server_time_ms())
    run_due(app, ["default"])  # old's child grows it into queue b now
    assert [r["flow_id"] for r in cli_json(app, "flows", "--limit", "1")] == ["new"]
    assert [r["flow_id"] for r in cli_json(app, "flows")] == ["new", "old"]


def test_a_flow_over_two_queues_and_many_partitions_is_counted_in_full(
    redis_client: Any,
) -> None:
    jq = JobQueue(redis_client, partitions={"a": 4, "b": 4})
    s = jq.task(lambda x=0: x, name="step")
    header = [s.s(i).with_options(queue="a" if i % 2 else "b") for i in range(20)]
    jq.chord(header, s.s().with_options(queue="a"), flow_id="wide")
    for queue in ("a", "b", None):
        rows = cli_json(jq, "flows", *(("--queue", queue) if queue else ()))
        assert [(r["flow_id"], r["runs"], r["queues"]) for r in rows] == [
            ("wide", 21, ["a", "b"])
        ]


def test_a_batch_counts_the_children_a_running_child_added(app: JobQueue) -> None:
    s = step(app)

    @app.task
    def adder(ctx: Any) -> None:
        ctx.add_to_flow(s.s(1), s.s(2))

    app.batch([adder.s()], on_complete=s.s(), batch_id="b")
    run_due(app)
    (row,) = cli_json(app, "flows")
    assert (row["flow_id"], row["progress"]) == ("b", "4/4")


def test_flows_with_an_id_prints_its_runs_and_what_each_waits_on(app: JobQueue) -> None:
    s = step(app)
    app.workflow({"a": s.s(), "b": s.s(), "c": s.s().after("a").after("b", on_failure="ignore")},
                 flow_id="w")
    code, out, err = cli(app, "flows", "w")
    assert code == 0, err
    assert out.splitlines()[0] == "flow w: 0/3 finished, 0 failed (1 waiting, 2 pending)"
    (c_line,) = [line for line in out.splitlines() if line.startswith("w:c ")]
    assert c_line.split()[-3:] == ["w:a,", "w:b", "(ignore)"]
    detail = cli_json(app, "flows", "w")
    assert [(e["dependency"], e["waiting"], e["policy"]) for e in detail["edges"]] == [
        ("w:a", "w:c", "fail"), ("w:b", "w:c", "ignore")
    ]
    assert [r["run_id"] for r in detail["runs"]] == ["w:a", "w:b", "w:c"]


def test_flows_of_an_unknown_id_is_an_error_line(app: JobQueue) -> None:
    code, _, err = cli(app, "flows", "nope")
    assert code == 1
    assert err.strip() == "error: no flow 'nope' (never created, or its records all expired)"


def test_a_run_whose_record_expired_counts_as_finished(app: JobQueue) -> None:
    s = step(app)
    flow = app.group([s.s(1), s.s(2)], flow_id="g")
    app.redis.delete(app.keys_for("default", "g:0").run("g:0"))  # its retention ran out
    (row,) = cli_json(app, "flows")
    assert (row["progress"], row["states"]["expired"]) == ("1/2", 1)
    assert flow.runs[1].refresh().state == "pending"


def test_the_workers_tidy_forgets_a_flow_whose_records_all_expired(app: JobQueue) -> None:
    s = step(app)
    app.group([s.s(1), s.s(2)], flow_id="old")
    app.group([s.s(3)], flow_id="new")
    run_due(app)
    for run_id in ("old:0", "old:1"):
        app.redis.delete(app.keys_for("default", run_id).run(run_id))
    assert {r.flow_id for r in flow_queries.flows(app)} == {"old", "new"}
    run_due(app)  # a worker's first sweep tidies the flows index of what it serves
    assert [r.flow_id for r in flow_queries.flows(app)] == ["new"]
    assert flow_queries.flow(app, "old") is None


def test_a_flows_index_of_another_type_is_reported_and_the_rest_listed(
    redis_client: Any,
) -> None:
    jq = JobQueue(redis_client, partitions={"default": 2})
    s = jq.task(lambda x=0: x, name="step")
    made = jq.group([s.s(i) for i in range(8)], flow_id="g")
    spoiled = next(k for k in jq.all_partition_keys("default")
                   if k != jq.keys_for("default", made.runs[0].run_id))
    redis_client.delete(spoiled.flows)
    redis_client.set(spoiled.flows, "foreign")
    code, out, err = cli(jq, "flows")
    assert code == 0
    assert spoiled.flows in err and "holds another type" in err
    assert out.splitlines()[1].split()[0] == "g"


# -- the dashboard -----------------------------------------------------------------------------


def test_the_dashboards_flows_page_lists_each_flow_with_its_progress(app: JobQueue) -> None:
    s = step(app)
    app.chain(s.s(1), s.s(2), flow_id="c<1>")
    page = TestClient(create_app(app)).get("/flows").text
    assert '<a href="/flow?id=c%3C1%3E">c&lt;1&gt;</a>' in page
    assert '<progress max="2" value="0"></progress> 0/2' in page


def test_the_dashboard_draws_a_flow_a_box_per_run_and_a_line_per_edge(app: JobQueue) -> None:
    s = step(app)
    flow = app.workflow({"a": s.s(), "b": s.s(), "c": s.s().after("a", "b"),
                         "d": s.s().after("c", on_failure="ignore")}, flow_id="w")
    client = TestClient(create_app(app))
    page = client.get("/flow?id=w").text
    drawing = page[page.index('<svg id="flow-drawing"'):page.index("</svg>")]
    assert drawing.count("<rect ") == 4
    assert drawing.count("<line ") == 3
    assert drawing.count('class="edge policy-ignore"') == 1
    assert '<g class="node state-waiting">' in drawing
    run_page = client.get(f"/run?id={flow['c'].run_id}").text
    assert '<a href="/flow?id=w">w</a>' in run_page


def test_a_big_layer_is_drawn_as_one_box_counting_its_runs_by_state(app: JobQueue) -> None:
    s = step(app)
    app.chord([s.s(i) for i in range(300)], s.s(), flow_id="big")
    page = TestClient(create_app(app)).get("/flow?id=big").text
    drawing = page[page.index('<svg id="flow-drawing"'):page.index("</svg>")]
    assert (drawing.count("<rect "), drawing.count("<line ")) == (2, 1)
    assert "300 runs" in drawing and "300 pending" in drawing


def test_the_dashboard_answers_404_for_an_unknown_flow(app: JobQueue) -> None:
    reply = TestClient(create_app(app)).get("/flow?id=nope")
    assert reply.status_code == 404


def test_layers_put_each_run_one_past_the_deepest_run_it_waits_on() -> None:
    runs = [FlowRun(r, "q", "t", "pending") for r in "abcd"]
    edges = [FlowEdge("a", "b", "fail"), FlowEdge("b", "d", "fail"), FlowEdge("a", "d", "fail"),
             FlowEdge("c", "d", "fail")]
    assert [[r.run_id for r in layer] for layer in layers(runs, edges)] == [["a", "c"], ["b"],
                                                                            ["d"]]


def test_layers_of_a_cycle_found_in_redis_put_its_runs_last() -> None:
    runs = [FlowRun(r, "q", "t", "pending") for r in "abc"]
    edges = [FlowEdge("b", "c", "fail"), FlowEdge("c", "b", "fail")]
    assert [[r.run_id for r in layer] for layer in layers(runs, edges)] == [["a"], ["b", "c"]]


@pytest.mark.real_only
def test_the_tidy_scans_a_big_flow_with_one_run_left_once_not_at_every_pass(
    app: JobQueue, redis_client: Any
) -> None:
    """1,000 runs, 999 of them expired: the first pass looks at the set until it finds the
    one alive, the next ones look at that one (its witness) alone."""
    s = step(app)
    app.group([s.s(i) for i in range(1000)], flow_id="big")
    keys = app.keys_for("default", "big:0")
    # (in the order a script's SMEMBERS gives, which the tidy's scan follows)
    order = redis_client.eval("return redis.call('SMEMBERS', KEYS[1])", 1, keys.flow("big"))
    redis_client.delete(*[keys.run(r) for r in order[:-1]])  # the last one scanned lives

    def exists_calls() -> int:
        redis_client.config_resetstat()
        app.run_steps(tidy_flows_steps(app, [keys]))
        return int(redis_client.info("commandstats").get("cmdstat_exists", {}).get("calls", 0))

    assert exists_calls() == 1000  # the scan, to the one alive
    assert exists_calls() == 1  # the witness
    assert [r.flow_id for r in flow_queries.flows(app)] == ["big"]
