"""The script contract: one contract object per Lua script (jobqueue.store.catalog), and each
one agrees with its script's header (KEYS by name, count and order, the fixed ARGV by name and
count, the variadic tail); the calls its builder makes pass exactly those; the script uses every
key it declares and no other KEYS or ARGV slot, and reads its clock first; and its parser reads
the script's real replies. A contract and a header that disagree fail here, not in
production."""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from helpers import claim, create

from jobqueue.store.admin import PAUSE, PURGE, REPAIR, SET_LIMIT, Purged, Repaired
from jobqueue.store.catalog import CONTRACTS
from jobqueue.store.contract import Contract, ContractError, Header, Wire, headers, parse_header
from jobqueue.store.exact import GLOBAL_LIMIT, PERMIT_SETTLE, PERMIT_TAKE, ExactKeys, Settled
from jobqueue.store.flows import (
    ATTACH,
    DELIVER,
    EXTEND,
    FLOW_ABORT,
    FLOW_COMMIT,
    FLOW_CREATE,
    FLOW_TIDY,
    RELAYED,
    Delivery,
    Edge,
    FlowCommit,
    NodeSpec,
)
from jobqueue.store.groups import GROUP_SET
from jobqueue.store.keys import PartitionKeys, SchedKeys, fire_run_id
from jobqueue.store.pages import INDEX_PAGE, IndexPage
from jobqueue.store.runs import (
    BOUNCE,
    CANCEL,
    CLAIM,
    COMPLETE,
    CREATE_RUN,
    DEDUPE,
    FAIL,
    FENCED_WRITE,
    HEARTBEAT,
    PROGRESS,
    READ_RECORDS,
    RELEASE,
    REQUEUE,
    Beats,
    Bounced,
    ClaimedRun,
    Deduped,
    FencedWrite,
    Outcome,
    Record,
    RunSpec,
    StateChange,
)
from jobqueue.store.schedules import (
    ADVANCE,
    HOLD_MS,
    SCHED_CREATE,
    SCHED_DEFINE,
    SCHED_DUE,
    SCHED_LEASE,
    SCHED_RELEASE,
    SCHED_UNHOLD,
    Due,
    DueSegment,
    Moved,
    RunGroup,
)
from jobqueue.store.scripts import LIB, SCRIPT_NAMES, Call, ScriptRunner, includes, lua_dir

PK = PartitionKeys("q", 3)
SK = SchedKeys(2)
GROUP = RunGroup("t", "{}", 3, 0, 0, 1)

# One call of every script, built the way the product builds it (with a non-empty tail).
BUILDERS: dict[str, Callable[[], Call]] = {
    "create_run": lambda: CREATE_RUN.call(PK, [RunSpec("r", "t", "{}")]),
    "dedupe": lambda: DEDUPE.call(PK, RunSpec("k@1", "t", "{}"), "k", "throttle", 1_000),
    "claim": lambda: CLAIM.call(PK, 1, "w", 1, 1),
    "heartbeat": lambda: HEARTBEAT.call(PK, [("r", 1)], 1),
    "complete": lambda: COMPLETE.call(PK, [("r", 1, "1")], 1),
    "fail": lambda: FAIL.call(PK, "r", 1, "e", 1, 1),
    "cancel": lambda: CANCEL.call(PK, "r", 1, "x"),
    "release": lambda: RELEASE.call(PK, "r", 1),
    "bounce": lambda: BOUNCE.call(
        PK, "r", 1, "w", "e", delay_ms=1, delay_cap_ms=2, window_ms=3, dead_retention_ms=4
    ),
    "requeue": lambda: REQUEUE.call(PK, "r"),
    "fenced_write": lambda: FENCED_WRITE.call(PK, "res", 1, "v", "r"),
    "progress": lambda: PROGRESS.call(PK, "r", 1, 50, "half"),
    "purge": lambda: PURGE.call(PK, ["r"]),
    "repair": lambda: REPAIR.call(PK, ["r"]),
    "pause": lambda: PAUSE.call(PK, True),
    "set_limit": lambda: SET_LIMIT.call(PK, "concurrency", 3),
    "group_set": lambda: GROUP_SET.call(PK, True, "g", 2),
    "permit_take": lambda: PERMIT_TAKE.call(ExactKeys("q"), 2, 1_000, "t"),
    "permit_settle": lambda: PERMIT_SETTLE.call(ExactKeys("q"), 1_000, [("t:1", "p|r|1")]),
    "global_limit": lambda: GLOBAL_LIMIT.call(ExactKeys("q"), "concurrency", 3),
    "sched_due": lambda: SCHED_DUE.call(SK, 1, 1),
    "advance": lambda: ADVANCE.call(SK, [((1, 2, 1, 0, 0, 0, "", 1, ""), ["j"])], token=7),
    "sched_define": lambda: SCHED_DEFINE.call(
        SK, "j", expected_definition=None, expected_next_ms=None, definition="{}", next_ms=1
    ),
    "sched_create": lambda: SCHED_CREATE.call(PK, [(GROUP, ["j", 1])]),
    "sched_release": lambda: SCHED_RELEASE.call(PK, [("j@x", "", 1)]),
    "sched_unhold": lambda: SCHED_UNHOLD.call(SK, [("j", "text")]),
    "sched_lease": lambda: SCHED_LEASE.call(SK, "s", "renew", 1, 7),
    "flow_create": lambda: FLOW_CREATE.call(
        PK, [NodeSpec("w", "t", "{}", deps=[Edge("r", "q")]), NodeSpec("r", "t", "{}")]
    ),
    "attach": lambda: ATTACH.call(PK, '["q","w"]', ["r"]),
    "extend": lambda: EXTEND.call(PK, "r", [("n", "q")], ["w"]),
    "deliver": lambda: DELIVER.call(PK, [Delivery("w", "r", "d1")], 1, 1000, 1),
    "relayed": lambda: RELAYED.call(PK, [("r", 1)], 1, 1),
    "flow_tidy": lambda: FLOW_TIDY.call(PK, 10),
    "flow_commit": lambda: FLOW_COMMIT.call(PK, "F", '["q","h","n1"]', "h", 1, 1000, 5000),
    "flow_abort": lambda: FLOW_ABORT.call(PK, "F", '["q","h","n1"]', "h"),
    "read_records": lambda: READ_RECORDS.call(PK, ["r", "s"]),
    "index_page": lambda: INDEX_PAGE.call(PK.done, "desc", "1", "2", ("1", "r"), True, 5),
}


def body(name: str) -> str:
    """The script without its header comment."""
    text = (lua_dir() / f"{name}.lua").read_text()
    return "\n".join(line for line in text.splitlines() if not line.startswith("--"))


def code(name: str) -> str:
    """The script without any comment."""
    return "\n".join(re.sub(r"--.*$", "", line) for line in body(name).splitlines())


@cache
def own_libs(name: str) -> tuple[str, ...]:
    """The libs no other script includes: the script's own steps, kept in lua/lib/ (claim's
    steps, say). What they do counts as the script's."""
    used = {n: set(includes((lua_dir() / f"{n}.lua").read_text(), n)) for n in SCRIPT_NAMES}
    others = set().union(*(libs for n, libs in used.items() if n != name))
    return tuple(sorted(used[name] - others))


def own_code(name: str) -> str:
    """The script and its own libs, without any comment."""
    texts = [body(name)] + [(lua_dir() / LIB / f"{lib}.lua").read_text()
                            for lib in own_libs(name)]
    return "\n".join(re.sub(r"--.*$", "", line) for t in texts for line in t.splitlines())


def disagreements(contract: Contract[..., Any], header: Header) -> list[str]:
    """How a contract differs from its script's header (nothing, when they agree)."""
    found = []
    if contract.keys != header.keys:
        found.append(f"keys {contract.keys} != header {header.keys}")
    if contract.args != header.args:
        found.append(f"ARGV {contract.args} != header {header.args}")
    if contract.tail != header.tail:
        found.append(f"tail {contract.tail} != header {header.tail}")
    if header.tail_at is not None and header.tail_at != len(header.args) + 1:
        found.append(f"tail at ARGV[{header.tail_at}..], after {len(header.args)} fixed")
    return found


# -- one contract per script -------------------------------------------------------------------


def test_every_script_in_lua_has_a_contract() -> None:
    on_disk = {p.stem for p in lua_dir().glob("*.lua")}  # (lua/lib/ holds no script)
    assert set(CONTRACTS) == on_disk


def test_every_contract_names_a_script_that_exists() -> None:
    for name in CONTRACTS:
        assert (lua_dir() / f"{name}.lua").is_file(), name


def test_the_runner_loads_exactly_the_scripts_that_have_contracts() -> None:
    assert sorted(SCRIPT_NAMES) == sorted(CONTRACTS)


def test_each_contract_is_filed_under_its_own_name() -> None:
    for name, contract in CONTRACTS.items():
        assert contract.name == name


def test_every_script_has_a_builder_here() -> None:
    assert set(BUILDERS) == set(CONTRACTS)


# -- contract and header agree -----------------------------------------------------------------


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_the_contract_agrees_with_its_header(name: str) -> None:
    assert disagreements(CONTRACTS[name], headers()[name]) == []


@pytest.mark.parametrize(
    "change",
    [
        {"keys": ("leases", "due", "dead", "stats", "fences", "orphans")},  # order
        {"keys": ("due", "leases", "dead", "stats", "fences")},  # count
        {"keys": ("due", "leases", "dead", "stats", "fence", "orphans")},  # a name
        {"args": ("now", "prefix", "limit", "owner", "lease_ms")},  # fixed ARGV count
        {"args": ("now", "prefix", "limit", "owner", "lease", "dead_retention_ms")},  # a name
        {"tail": "runs"},  # a tail the script does not read
    ],
    ids=["key-order", "key-count", "key-name", "argv-count", "argv-name", "tail"],
)
def test_a_contract_that_differs_from_its_header_is_caught(change: dict[str, Any]) -> None:
    good = CLAIM
    wrong = Contract(
        good.name,
        keys=change.get("keys", good.keys),
        args=change.get("args", good.args),
        tail=change.get("tail", good.tail),
        build=lambda: Wire(PK, {}),
        parse=lambda reply: reply,
    )
    assert disagreements(wrong, headers()["claim"]) != []


def test_a_header_whose_tail_does_not_follow_the_fixed_arguments_is_caught() -> None:
    header = parse_header(
        "x", "-- KEYS[1]  due  zset\n-- ARGV[1]  now\n-- ARGV[3..] runs\n"
    )
    contract = Contract(
        "x", keys=("due",), args=("now",), tail="runs",
        build=lambda: Wire(PK, {}), parse=lambda reply: reply,
    )
    assert disagreements(contract, header) != []
    assert disagreements(contract, replace(header, tail_at=2)) == []


def test_no_contract_spells_the_keys_or_arguments_its_header_names() -> None:
    """The header is the one spelling: a contract in jobqueue/store takes its KEYS, ARGV and
    tail from it."""
    store = Path(__file__).resolve().parent.parent / "jobqueue" / "store"
    spelled = []
    for path in sorted(store.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id == "Contract"):
                spelled += [f"{path.name}:{node.lineno} {k.arg}" for k in node.keywords
                            if k.arg in ("keys", "args", "tail")]
    assert spelled == []


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_the_builder_names_exactly_what_the_header_names(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A builder's Wire names the header's ARGV (its dict keys) and its KEYS (a dict's keys,
    or a keys object's attributes), no more and no fewer."""
    header, contract = headers()[name], CONTRACTS[name]
    wires: list[Wire] = []
    build = contract._build

    def spy(*args: Any, **kwargs: Any) -> Wire:
        wires.append(build(*args, **kwargs))
        return wires[-1]

    monkeypatch.setattr(contract, "_build", spy)
    call = BUILDERS[name]()
    (wire,) = wires
    assert sorted(wire.args) == sorted(header.args)
    if isinstance(wire.keys, dict):
        assert sorted(wire.keys) == sorted(header.keys)
    else:
        assert all(hasattr(wire.keys, key) for key in header.keys)
    assert call.args[: len(header.args)] == tuple(wire.args[a] for a in header.args)
    assert (header.tail is None) == (len(call.args) == len(header.args))


def test_a_contract_of_a_script_in_lua_reads_the_header() -> None:
    contract = Contract("heartbeat", build=lambda: Wire(PK, {}), parse=lambda reply: reply)
    header = headers()["heartbeat"]
    assert (contract.keys, contract.args, contract.tail) == (header.keys, header.args,
                                                             header.tail)


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_every_script_takes_now_first(name: str) -> None:
    assert headers()[name].args[0] == "now"
    assert CONTRACTS[name].args[0] == "now"


# -- the calls built agree with the header -----------------------------------------------------


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_the_builder_passes_the_keys_the_header_names_in_its_order(name: str) -> None:
    header = headers()[name]
    call = BUILDERS[name]()
    assert call.script == name
    assert len(call.keys) == len(header.keys)
    for key, key_name in zip(call.keys, header.keys, strict=True):
        named = {"defs": "def", "resource": "fenced:res", "run": "run:r", "dedupe": "dedupe:k",
                 "index": "done", "buffered": "held"}  # buffered: a historical key name
        suffix = named.get(key_name, key_name)
        assert key.endswith(":" + suffix), (key, key_name)


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_the_builder_passes_the_fixed_arguments_then_the_tail_the_header_names(name: str) -> None:
    header = headers()[name]
    call = BUILDERS[name]()
    if header.tail is None:
        assert len(call.args) == len(header.args)
    else:
        assert len(call.args) > len(header.args)  # the tail follows the fixed ones


@pytest.mark.parametrize(
    "call",
    [
        lambda: HEARTBEAT.call(PK, [], 1),
        lambda: COMPLETE.call(PK, [], 1),
        lambda: PURGE.call(PK, []),
        lambda: SCHED_UNHOLD.call(SK, []),
    ],
    ids=["heartbeat", "complete", "purge", "sched_unhold"],
)
def test_an_empty_tail_passes_the_fixed_arguments_alone(call: Callable[[], Call]) -> None:
    built = call()
    assert len(built.args) == len(headers()[built.script].args)


def test_a_builder_that_names_other_arguments_than_its_contract_is_refused() -> None:
    contract = Contract(
        "x", keys=("due",), args=("now", "limit"),
        build=lambda: Wire(PK, {"now": "", "lmit": 1}), parse=lambda reply: reply,
    )
    with pytest.raises(ContractError, match="takes ARGV"):
        contract.call()


def test_a_builder_that_passes_a_tail_to_a_script_without_one_is_refused() -> None:
    contract = Contract(
        "x", keys=("due",), args=("now",),
        build=lambda: Wire(PK, {"now": ""}, ["extra"]), parse=lambda reply: reply,
    )
    with pytest.raises(ContractError, match="no ARGV beyond"):
        contract.call()


def test_keys_given_by_name_must_be_exactly_the_contracts() -> None:
    contract = Contract(
        "x", keys=("resource", "run"), args=("now",),
        build=lambda: Wire({"resource": "jq:{q#0}:fenced:a"}, {"now": ""}),
        parse=lambda reply: reply,
    )
    with pytest.raises(ContractError, match="takes keys"):
        contract.call()


def test_an_advance_group_header_of_the_wrong_length_is_refused() -> None:
    with pytest.raises(ContractError, match="header fields"):
        ADVANCE.call(SK, [((1, 2, 1, 0, 0, 0, "", 1), ["j"])])


# -- the scripts keep to their headers ---------------------------------------------------------


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_the_script_uses_every_key_it_declares_and_no_other(name: str) -> None:
    header = headers()[name]
    used = {int(i) for i in re.findall(r"KEYS\[(\d+)\]", body(name))}
    loops = re.search(r"for \w+ = 1, 5 do", body(name))  # repair.lua checks its 5 in a loop
    if loops:
        used |= set(range(1, 6))
    assert used == set(range(1, len(header.keys) + 1)), (used, header.keys)


def test_no_lib_reads_keys_or_argv() -> None:
    """A lib is handed its keys and arguments by the script that includes it (claim's steps
    get claim's KEYS by name), so each script's header stays the whole of its interface."""
    for path in sorted((lua_dir() / LIB).glob("*.lua")):
        text = "\n".join(re.sub(r"--.*$", "", line) for line in path.read_text().splitlines())
        assert not re.search(r"\b(KEYS|ARGV)\b", text), path.name


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_the_script_reaches_no_partition_key_but_records_and_histories_by_prefix(
    name: str,
) -> None:
    """Indexes, counters and wake lists are KEYS (declared, passed by the caller); only the
    records and histories of the runs a call names are built from the prefix, and, in claim,
    the deduplication key a claimed run's record names (released at the run's first claim,
    see dedupe.lua): a key per record, like the record itself; and the keys of the per-key
    and per-task caps a run's record names (held:, parked: <group>, and in claim krate:<key>),
    which the scripts that take or free a slot reach the same way, and the prio index a run put
    back in line (unparked) is re-hinted in; and the keys of fair shares, a queue's opt-in
    setting (gconf; the group queues gq:<group>, named by a run's limit_key like held:; the
    ring gready, gwait, gpass, gvt, gserved and gof), which every script that puts a run in
    line reaches through the shared libs (lua/lib/), by the prefix, in the partition's slot."""
    built = re.findall(r"(?:prefix|ARGV\[2\])\s*\.\.\s*'([^']*)'", own_code(name))
    allowed = {"run:", "hist:"} | ({"dedupe:", "held:", "krate:"} if name == "claim" else set())
    if name in ("claim", "cancel", "set_limit"):
        allowed |= {"parked:"}
    if name == "set_limit":
        allowed |= {"prio"}
    if name in ("create_run", "dedupe", "claim"):
        allowed |= {"gconf", "gq:"}  # (an enqueue checks its group's max_size)
    if name == "claim":
        allowed |= {"gready", "gwait", "gpass", "gvt", "gserved", "gof"}
    if name in ("flow_create", "extend", "deliver", "relayed", "flow_commit", "flow_abort",
                "complete"):
        allowed |= {"deps:", "got:"}  # a waiting run's own keys, named like its record
    if name in ("flow_create", "flow_tidy", "flow_commit", "flow_abort"):
        allowed |= {"flow:"}  # a flow's run ids in the partition, named by its id
    if name in ("flow_create", "flow_commit", "flow_abort"):
        allowed |= {"flowmark:"}  # a flow's commit, named by its id
    assert set(built) <= allowed, built


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_the_script_reads_no_argv_slot_its_header_does_not_name(name: str) -> None:
    header = headers()[name]
    used = {int(i) for i in re.findall(r"ARGV\[(\d+)\]", body(name))}
    if header.tail is None:
        assert used <= set(range(1, len(header.args) + 1)), used


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_the_script_reads_its_clock_first(name: str) -> None:
    first = next(line for line in code(name).splitlines() if line.strip())
    assert re.fullmatch(r"local (now|_) = clock\(ARGV\[1\]\)\s*", first), first


# -- each contract parses its script's real replies --------------------------------------------

NOW = 1_000_000
P = PartitionKeys("default", 0)
K = SchedKeys(0)

def create_in_p(runner: ScriptRunner, *run_ids: str) -> None:
    """Runs of partition P, payload '{}', created at NOW."""
    create(runner, P, *run_ids, now=NOW, payload="{}")


def claim_in_p(runner: ScriptRunner, limit: int = 10) -> list[ClaimedRun]:
    """The runs of partition P due at NOW, claimed by 'w'."""
    return claim(runner, P, NOW, limit, owner="w", retention_ms=60_000).runs


def parses_create_run(runner: ScriptRunner, redis_client: Any) -> None:
    create_in_p(runner, "old")
    reply = runner.run(CREATE_RUN.call(P, [RunSpec("new", "t", "{}"), RunSpec("old", "t", "{}")],
                                       now=NOW))
    assert CREATE_RUN.parse(reply) == [True, False]


def parses_dedupe(runner: ScriptRunner, redis_client: Any) -> None:
    def call(run_id: str, mode: str) -> Deduped:
        spec = RunSpec(run_id, "t", "{}")
        return DEDUPE.parse(runner.run(DEDUPE.call(P, spec, "k", mode, None, now=NOW)))

    assert [call("k@1", "throttle"), call("k@2", "throttle"), call("k@3", "debounce")] == [
        Deduped("created", "k@1"), Deduped("deduplicated", "k@1"), Deduped("replaced", "k@1")
    ]


def parses_claim(runner: ScriptRunner, redis_client: Any) -> None:
    runner.run(CREATE_RUN.call(P, [
        RunSpec("a", "t", '{"args":[1]}', max_attempts=5, timeout_ms=700, job_id="j",
                scheduled_for_ms=NOW - 1),
        RunSpec("later", "t", "{}", delay_ms=5_000),
    ], now=NOW))
    result = CLAIM.parse(runner.run(CLAIM.call(P, 10, "w", 30_000, 60_000, now=NOW)))
    assert (result.now_ms, result.next_wake_ms) == (NOW, NOW + 5_000)
    (run,) = result.runs
    assert run == ClaimedRun("a", run.fence, 1, 5, "t", '{"args":[1]}', NOW + 30_000, 700, "j",
                             NOW - 1, NOW)
    assert run.fence > 0


def parses_heartbeat(runner: ScriptRunner, redis_client: Any) -> None:
    create_in_p(runner, "a")
    (a,) = claim_in_p(runner)
    reply = runner.run(HEARTBEAT.call(P, [("a", a.fence), ("gone", 1)], 40_000, now=NOW + 1))
    assert HEARTBEAT.parse(reply) == Beats(NOW + 1, [NOW + 40_001, "unknown"])


def parses_complete(runner: ScriptRunner, redis_client: Any) -> None:
    create_in_p(runner, "a", "b")
    a, b = claim_in_p(runner)
    call = COMPLETE.call(P, [("a", a.fence, "1"), ("b", b.fence + 1, "2")], 60_000, now=NOW)
    assert COMPLETE.parse(runner.run(call)) == [
        Outcome(True, "done"), Outcome(False, "fenced", current_fence=b.fence)
    ]


def parses_fail(runner: ScriptRunner, redis_client: Any) -> None:
    create_in_p(runner, "a", "b")
    a, b = claim_in_p(runner)
    retry = FAIL.call(P, "a", a.fence, "boom", 2_000, 60_000, now=NOW + 1)
    assert FAIL.parse(runner.run(retry)) == Outcome(True, "retry", retry_at_ms=NOW + 2_001)
    dead = FAIL.call(P, "b", b.fence, "fatal", None, 60_000, now=NOW + 1)
    assert FAIL.parse(runner.run(dead)) == Outcome(True, "dead")


def parses_release(runner: ScriptRunner, redis_client: Any) -> None:
    create_in_p(runner, "a")
    (a,) = claim_in_p(runner)
    assert RELEASE.parse(runner.run(RELEASE.call(P, "a", a.fence, now=NOW))) == Outcome(
        True, "released"
    )
    again = RELEASE.call(P, "a", a.fence, now=NOW)
    assert RELEASE.parse(runner.run(again)) == Outcome(False, "not-running", current_fence=a.fence)


def parses_bounce(runner: ScriptRunner, redis_client: Any) -> None:
    create_in_p(runner, "a", "b")
    a, b = claim_in_p(runner)

    def bounce(run_id: str, fence: int, window_ms: int) -> Bounced:
        call = BOUNCE.call(
            P, run_id, fence, "w1", "no worker has task t", delay_ms=1_000,
            delay_cap_ms=60_000, window_ms=window_ms, dead_retention_ms=60_000, now=NOW,
        )
        return BOUNCE.parse(runner.run(call))

    assert bounce("a", a.fence, 3_600_000) == Bounced(True, "bounced", 1, due_ms=NOW + 1_000)
    assert bounce("a", a.fence, 3_600_000) == Bounced(
        False, "not-running", current_fence=a.fence
    )
    assert bounce("b", b.fence, 0) == Bounced(True, "dead", 1)


def parses_cancel(runner: ScriptRunner, redis_client: Any) -> None:
    create_in_p(runner, "a")
    call = CANCEL.call(P, "a", 60_000, "stop", now=NOW)
    assert CANCEL.parse(runner.run(call)) == StateChange(True, "pending")
    assert CANCEL.parse(runner.run(call)) == StateChange(False, "cancelled")


def parses_requeue(runner: ScriptRunner, redis_client: Any) -> None:
    create_in_p(runner, "a")
    runner.run(CANCEL.call(P, "a", 60_000, "stop", now=NOW))
    call = REQUEUE.call(P, "a", now=NOW)
    assert REQUEUE.parse(runner.run(call)) == StateChange(True, "cancelled")
    assert REQUEUE.parse(runner.run(call)) == StateChange(False, "pending")


def parses_fenced_write(runner: ScriptRunner, redis_client: Any) -> None:
    create_in_p(runner, "a")
    (a,) = claim_in_p(runner)
    call = FENCED_WRITE.call(P, "res", a.fence, "v", "a", now=NOW)
    assert FENCED_WRITE.parse(runner.run(call)) == FencedWrite(True, a.fence)
    stale = FENCED_WRITE.call(P, "res", a.fence - 1, "v", "a", now=NOW)
    assert FENCED_WRITE.parse(runner.run(stale)) == FencedWrite(False, a.fence)


def parses_progress(runner: ScriptRunner, redis_client: Any) -> None:
    create_in_p(runner, "a")
    (a,) = claim_in_p(runner)
    call = PROGRESS.call(P, "a", a.fence, 50, "half", now=NOW)
    assert PROGRESS.parse(runner.run(call)) == Outcome(True, "written")
    stale = PROGRESS.call(P, "a", a.fence - 1, 60, "", now=NOW)
    assert PROGRESS.parse(runner.run(stale)) == Outcome(False, "fenced", current_fence=a.fence)


def parses_purge(runner: ScriptRunner, redis_client: Any) -> None:
    create_in_p(runner, "dead", "alive")
    dead = next(r for r in claim_in_p(runner) if r.run_id == "dead")
    runner.run(FAIL.call(P, "dead", dead.fence, "boom", None, 60_000, now=NOW))
    assert PURGE.parse(runner.run(PURGE.call(P, ["dead", "alive"], now=NOW))) == Purged(1, 1)


def parses_repair(runner: ScriptRunner, redis_client: Any) -> None:
    create_in_p(runner, "lost", "fine")
    redis_client.zrem(P.due, "lost")
    call = REPAIR.call(P, ["lost", "fine"], dry_run=True, now=NOW)
    assert REPAIR.parse(runner.run(call)) == Repaired(1, 0, 0, 1)


def define(runner: ScriptRunner, job: str, definition: str, next_ms: int) -> bool:
    return SCHED_DEFINE.parse(runner.run(SCHED_DEFINE.call(
        K, job, expected_definition=None, expected_next_ms=None, definition=definition,
        next_ms=next_ms, now=NOW,
    )))


def parses_sched_due(runner: ScriptRunner, redis_client: Any) -> None:
    herd = '{"task":"t","every_ms":60000}'
    policed = '{"task":"t","every_ms":60000,"overlap":"forbid"}'
    for job in ("h1", "h2"):
        define(runner, job, herd, 60_000)
    define(runner, "p", policed, 120_000)
    redis_client.zadd(K.next, {"vanished": 180_000})
    due = SCHED_DUE.parse(runner.run(SCHED_DUE.call(K, 1_000_000, 10, now=NOW)))
    assert due == Due(NOW, [herd, policed], [
        DueSegment(60_000, 1, "", ["h1", "h2"]),
        DueSegment(120_000, 2, "|", ["p"]),
        DueSegment(180_000, 0, "", ["vanished"]),
    ])


def parses_advance(runner: ScriptRunner, redis_client: Any) -> None:
    define(runner, "a", '{"task":"t"}', 60_000)
    define(runner, "b", '{"task":"t"}', 90_000)
    header = (60_000, 120_000, 1, 0, 0, 0, "", 60_000, "")
    lease = SCHED_LEASE.parse(runner.run(SCHED_LEASE.call(K, "s", "acquire", 5_000, now=NOW)))
    stale = ADVANCE.call(K, [(header, ["a", "b"])], now=NOW, token=lease.token - 1)
    assert ADVANCE.parse(runner.run(stale)) == [Moved.FENCED, Moved.FENCED]
    call = ADVANCE.call(K, [(header, ["a", "b"])], now=NOW, token=lease.token)
    assert ADVANCE.parse(runner.run(call)) == [Moved.ADVANCED, Moved.REFUSED]


def parses_sched_define(runner: ScriptRunner, redis_client: Any) -> None:
    assert define(runner, "a", '{"task":"t"}', 60_000) is True
    assert define(runner, "a", '{"task":"t"}', 60_000) is False  # it exists: a conflict


def parses_sched_create(runner: ScriptRunner, redis_client: Any) -> None:
    group = RunGroup("t", "{}", 3, 0, 0, 60_000)
    call = SCHED_CREATE.call(P, [(group, ["a", 60_000, "b", 60_500])], now=NOW)
    assert SCHED_CREATE.parse(runner.run(call)) == 2
    assert SCHED_CREATE.parse(runner.run(call)) == 0


def parses_sched_release(runner: ScriptRunner, redis_client: Any) -> None:
    group = RunGroup("t", "{}", 3, 0, 0, 60_000)
    runner.run(SCHED_CREATE.call(P, [(group, ["a", HOLD_MS, "b", HOLD_MS])], now=NOW))
    buffered = [(fire_run_id("a", 60_000), "", 60_000), (fire_run_id("b", 60_000), "a-running", 1)]
    create_in_p(runner, "a-running")
    claim_in_p(runner)
    replies = runner.run(SCHED_RELEASE.call(P, [*buffered, ("gone", "", 1)], now=NOW))
    assert SCHED_RELEASE.parse(replies) == [1, 0, 2]


def parses_sched_lease(runner: ScriptRunner, redis_client: Any) -> None:
    mine = SCHED_LEASE.parse(runner.run(SCHED_LEASE.call(K, "s1", "acquire", 5_000, now=NOW)))
    assert (mine.now_ms, mine.held, mine.owner, mine.until_ms) == (NOW, True, "s1", NOW + 5_000)
    theirs = SCHED_LEASE.parse(runner.run(SCHED_LEASE.call(K, "s2", "acquire", 5_000, now=NOW)))
    assert (theirs.held, theirs.token, theirs.owner) == (False, mine.token, "s1")


def parses_sched_unhold(runner: ScriptRunner, redis_client: Any) -> None:
    redis_client.hset(K.buffered, mapping={"a": "1 -1 1 default", "b": "2 -1 2 default"})
    call = SCHED_UNHOLD.call(K, [("a", "1 -1 1 default"), ("b", "stale text")], now=NOW)
    assert SCHED_UNHOLD.parse(runner.run(call)) == 1


def parses_pause(runner: ScriptRunner, redis_client: Any) -> None:
    assert PAUSE.parse(runner.run(PAUSE.call(P, True, now=NOW))) is True
    assert PAUSE.parse(runner.run(PAUSE.call(P, True, now=NOW))) is False


def parses_set_limit(runner: ScriptRunner, redis_client: Any) -> None:
    call = SET_LIMIT.call(P, "concurrency", 3, now=NOW)
    assert [SET_LIMIT.parse(runner.run(call)), SET_LIMIT.parse(runner.run(call))] == [True, False]


def parses_group_set(runner: ScriptRunner, redis_client: Any) -> None:
    call = GROUP_SET.call(P, True, "g", 3, now=NOW)
    assert [GROUP_SET.parse(runner.run(call)), GROUP_SET.parse(runner.run(call))] == [True, False]


def parses_permit_take(runner: ScriptRunner, redis_client: Any) -> None:
    assert GLOBAL_LIMIT.parse(runner.run(GLOBAL_LIMIT.call(ExactKeys("q"), "concurrency", 2)))
    taken = PERMIT_TAKE.parse(runner.run(PERMIT_TAKE.call(ExactKeys("q"), 3, 1_000, "t", NOW)))
    assert (taken.now_ms, taken.granted, taken.limited) == (NOW, 2, True)
    again = PERMIT_TAKE.parse(runner.run(PERMIT_TAKE.call(ExactKeys("q"), 1, 1_000, "u", NOW)))
    assert (again.granted, again.next_ms) == (0, NOW + 1_000)  # when the first may free


def parses_permit_settle(runner: ScriptRunner, redis_client: Any) -> None:
    runner.run(GLOBAL_LIMIT.call(ExactKeys("q"), "concurrency", 2))
    runner.run(PERMIT_TAKE.call(ExactKeys("q"), 1, 1_000, "t", NOW))
    binds = [("t:1", "p|r|1"), ("t:2", "p|s|1")]
    call = PERMIT_SETTLE.call(ExactKeys("q"), 1_000, binds, now=NOW)
    assert PERMIT_SETTLE.parse(runner.run(call)) == Settled(1, 0, 0, ["p|s|1"])


def parses_global_limit(runner: ScriptRunner, redis_client: Any) -> None:
    call = GLOBAL_LIMIT.call(ExactKeys("q"), "rate", "5 1000", now=NOW)
    assert [GLOBAL_LIMIT.parse(runner.run(call)), GLOBAL_LIMIT.parse(runner.run(call))] == [
        True, False,
    ]


def _flow(runner: ScriptRunner) -> None:
    nodes = [NodeSpec("w", "t", "{}", deps=[Edge("r", "q")]), NodeSpec("r", "t", "{}")]
    assert FLOW_CREATE.parse(runner.run(FLOW_CREATE.call(P, nodes, now=NOW))) == [True, True]


def parses_flow_create(runner: ScriptRunner, redis_client: Any) -> None:
    _flow(runner)
    again = FLOW_CREATE.call(P, [NodeSpec("r", "t", "{}")], now=NOW)
    assert FLOW_CREATE.parse(runner.run(again)) == [False]


def parses_attach(runner: ScriptRunner, redis_client: Any) -> None:
    _flow(runner)
    call = ATTACH.call(P, '["q","w"]', ["r", "nobody"], now=NOW)
    assert ATTACH.parse(runner.run(call)) == [True, False]


def parses_extend(runner: ScriptRunner, redis_client: Any) -> None:
    _flow(runner)
    call = EXTEND.call(P, "r", [("n", "q")], ["w", "r", "nobody"], now=NOW)
    assert EXTEND.parse(runner.run(call)) == [True, False, False]
    assert EXTEND.parse(runner.run(call)) == [True, False, False]  # a retried add


def parses_deliver(runner: ScriptRunner, redis_client: Any) -> None:
    _flow(runner)
    call = DELIVER.call(P, [Delivery("w", "r", "d1"), Delivery("w", "r", "d1")], 1, 1000, 1, NOW)
    assert DELIVER.parse(runner.run(call)) == ([True, False], 0)


def parses_flow_tidy(runner: ScriptRunner, redis_client: Any) -> None:
    _flow(runner)  # (flow id '': in no flow)
    nodes = [NodeSpec("f1", "t", "{}", flow="F"), NodeSpec("f2", "t", "{}", flow="G")]
    FLOW_CREATE.parse(runner.run(FLOW_CREATE.call(P, nodes, now=NOW)))
    redis_client.delete(P.run("f2"))
    assert FLOW_TIDY.parse(runner.run(FLOW_TIDY.call(P, 10, now=NOW))) == (2, 1)
    assert FLOW_TIDY.parse(runner.run(FLOW_TIDY.call(P, 10, now=NOW))) == (1, 0)


HOME = '["q","h","n1"]'  # the mark of attempt n1, whose home run is h


def _staged(runner: ScriptRunner, mark: str = HOME) -> None:
    nodes = [NodeSpec("h", "t", "{}", flow="F"), NodeSpec("w", "t", "{}", flow="F",
                                                           deps=[Edge("h", "q")])]
    call = FLOW_CREATE.call(P, nodes, now=NOW, staged=mark)
    assert FLOW_CREATE.parse(runner.run(call)) == [True, True]


def parses_flow_commit(runner: ScriptRunner, redis_client: Any) -> None:
    _staged(runner)
    commit = FLOW_COMMIT.call(P, "F", HOME, "h", 1, 1000, 60_000, now=NOW)
    # h released (counted as created: it waited on nothing but the commit); w waits on h
    assert FLOW_COMMIT.parse(runner.run(commit)) == FlowCommit(True, 0)
    assert FLOW_COMMIT.parse(runner.run(commit)) == FlowCommit(True, 0)  # (again: nothing)
    other = FLOW_COMMIT.call(P, "F", '["q","h","n2"]', "h", 1, 1000, 60_000, now=NOW)
    assert FLOW_COMMIT.parse(runner.run(other)) == FlowCommit(False, refused="other")
    gone = FLOW_COMMIT.call(P, "G", HOME, "nobody", 1, 1000, 60_000, now=NOW)
    assert FLOW_COMMIT.parse(runner.run(gone)) == FlowCommit(False, refused="aborted")


def parses_flow_abort(runner: ScriptRunner, redis_client: Any) -> None:
    _staged(runner)
    assert FLOW_ABORT.parse(runner.run(FLOW_ABORT.call(P, "F", HOME, "h", now=NOW))) == 2
    _staged(runner)
    runner.run(FLOW_COMMIT.call(P, "F", HOME, "h", 1, 1000, 60_000, now=NOW))
    assert FLOW_ABORT.parse(runner.run(FLOW_ABORT.call(P, "F", HOME, "h", now=NOW))) is None


def parses_relayed(runner: ScriptRunner, redis_client: Any) -> None:
    redis_client.zadd(P.outbox, {"r": 5, "s": 6})
    call = RELAYED.call(P, [("r", 5), ("s", 5)], 1_000, 1_000, now=NOW)
    assert RELAYED.parse(runner.run(call)) == 1  # s changed since it was read: it stays


def parses_read_records(runner: ScriptRunner, redis_client: Any) -> None:
    create_in_p(runner, "a", "b")
    (a,) = claim_in_p(runner, limit=1)
    redis_client.set(P.run("foreign"), "x")
    reply = runner.run(READ_RECORDS.call(P, ["a", "gone", "foreign", "b"], now=NOW))
    got, gone, foreign, b = READ_RECORDS.parse(reply)
    assert got.fields is not None and got.fields["state"] == "running"
    assert got.fields["fence"] == str(a.fence)
    assert gone == Record({}, [])
    assert foreign == Record(None, None)
    assert b.fields is not None and b.fields["state"] == "pending"


def parses_index_page(runner: ScriptRunner, redis_client: Any) -> None:
    redis_client.zadd(P.done, {"a": 1, "b": 2, "c": 2, "d": 3})
    page = INDEX_PAGE.parse(runner.run(INDEX_PAGE.call(P.done, "desc", "2", "3", ("3", "d"))))
    assert page == IndexPage(3, [("c", "2"), ("b", "2")])
    redis_client.set(P.due, "x")
    assert INDEX_PAGE.parse(runner.run(INDEX_PAGE.call(P.due, "asc"))) is None


REPLIES: dict[str, Callable[[ScriptRunner, Any], None]] = {
    "flow_create": parses_flow_create,
    "attach": parses_attach,
    "extend": parses_extend,
    "deliver": parses_deliver,
    "relayed": parses_relayed,
    "flow_tidy": parses_flow_tidy,
    "flow_commit": parses_flow_commit,
    "flow_abort": parses_flow_abort,
    "create_run": parses_create_run,
    "dedupe": parses_dedupe,
    "claim": parses_claim,
    "heartbeat": parses_heartbeat,
    "complete": parses_complete,
    "fail": parses_fail,
    "release": parses_release,
    "bounce": parses_bounce,
    "cancel": parses_cancel,
    "requeue": parses_requeue,
    "fenced_write": parses_fenced_write,
    "progress": parses_progress,
    "purge": parses_purge,
    "repair": parses_repair,
    "pause": parses_pause,
    "set_limit": parses_set_limit,
    "group_set": parses_group_set,
    "permit_take": parses_permit_take,
    "permit_settle": parses_permit_settle,
    "global_limit": parses_global_limit,
    "sched_due": parses_sched_due,
    "advance": parses_advance,
    "sched_define": parses_sched_define,
    "sched_create": parses_sched_create,
    "sched_release": parses_sched_release,
    "sched_unhold": parses_sched_unhold,
    "sched_lease": parses_sched_lease,
    "read_records": parses_read_records,
    "index_page": parses_index_page,
}


def test_every_contracts_parser_is_checked_against_real_replies_here() -> None:
    assert set(REPLIES) == set(CONTRACTS)


@pytest.mark.parametrize("name", sorted(REPLIES))
def test_the_contract_parses_its_scripts_real_reply(
    name: str, runner: ScriptRunner, redis_client: Any
) -> None:
    REPLIES[name](runner, redis_client)
