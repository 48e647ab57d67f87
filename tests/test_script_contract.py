"""The script contract: each Lua file's header names its KEYS and ARGV (read by
jobqueue.store.contract), the builders in jobqueue.store.ops and jobqueue.store.sched_ops pass
exactly those, and each script uses every key it declares and no other KEYS or ARGV slot. A
builder and a header that disagree fail here, not in production."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

from jobqueue.store import ops
from jobqueue.store.contract import Contract, contracts
from jobqueue.store.keys import PartitionKeys
from jobqueue.store.sched_ops import (
    RunGroup,
    sched_create_call,
    sched_lease_call,
    sched_release_call,
    sched_unhold_call,
)
from jobqueue.store.scripts import SCRIPT_NAMES, Call, lua_dir

PK = PartitionKeys("q", 3)
SK = ops.SchedKeys(2)
GROUP = RunGroup("t", "{}", 3, 0, 0, "@x", 1)

# One call of every script, built the way the product builds it.
BUILDERS: dict[str, Callable[[], Call]] = {
    "create_run": lambda: ops.create_call(PK, [ops.RunSpec("r", "t", "{}")]),
    "claim": lambda: ops.claim_call(PK, 1, "w", 1, 1),
    "heartbeat": lambda: ops.heartbeat_call(PK, [("r", 1)], 1),
    "complete": lambda: ops.complete_many_call(PK, [("r", 1, "1")], 1),
    "fail": lambda: ops.fail_call(PK, "r", 1, "e", 1, 1),
    "cancel": lambda: ops.cancel_call(PK, "r", 1, "x"),
    "release": lambda: ops.release_call(PK, "r", 1),
    "requeue": lambda: ops.requeue_call(PK, "r"),
    "fenced_write": lambda: ops.fenced_write_call(PK, "res", 1, "v", "r"),
    "purge": lambda: ops.purge_call(PK, ["r"]),
    "repair": lambda: ops.repair_call(PK, ["r"]),
    "sched_due": lambda: ops.sched_due_call(SK, 1, 1),
    "advance": lambda: ops.advance_call(SK, [ops.Advance("j", 1, 2)], token=7),
    "sched_define": lambda: ops.sched_define_call(
        SK, "j", expected_definition=None, expected_next_ms=None, definition="{}", next_ms=1
    ),
    "sched_create": lambda: sched_create_call(PK, [(GROUP, ["j", 1])]),
    "sched_release": lambda: sched_release_call(PK, [("j@x", "", 1)]),
    "sched_unhold": lambda: sched_unhold_call(SK, [("j", "text")]),
    "sched_lease": lambda: sched_lease_call(SK, "s", "renew", 1, 7),
}


def body(name: str) -> str:
    """The script without its header comment."""
    text = (lua_dir() / f"{name}.lua").read_text()
    return "\n".join(line for line in text.splitlines() if not line.startswith("--"))


def test_every_script_has_a_builder_here() -> None:
    assert set(BUILDERS) == set(SCRIPT_NAMES)


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_the_builder_passes_the_keys_the_header_names_in_its_order(name: str) -> None:
    contract: Contract = contracts()[name]
    call = BUILDERS[name]()
    assert call.script == name
    assert len(call.keys) == len(contract.keys)
    for key, key_name in zip(call.keys, contract.keys, strict=True):
        suffix = {"defs": "def", "resource": "fenced:res", "run": "run:r"}.get(key_name, key_name)
        assert key.endswith(":" + suffix), (key, key_name)


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_the_builder_passes_the_fixed_arguments_the_header_names(name: str) -> None:
    contract = contracts()[name]
    call = BUILDERS[name]()
    if contract.tail is None:
        assert len(call.args) == len(contract.args)
    else:
        assert len(call.args) > len(contract.args)  # the tail follows the fixed ones
    assert contract.args[0] == "now"  # every script takes now first


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_the_script_uses_every_key_it_declares_and_no_other(name: str) -> None:
    contract = contracts()[name]
    used = {int(i) for i in re.findall(r"KEYS\[(\d+)\]", body(name))}
    loops = re.search(r"for \w+ = 1, 5 do", body(name))  # repair.lua checks its 5 in a loop
    if loops:
        used |= set(range(1, 6))
    assert used == set(range(1, len(contract.keys) + 1)), (used, contract.keys)


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_the_script_reads_no_argv_slot_its_header_does_not_name(name: str) -> None:
    contract = contracts()[name]
    used = {int(i) for i in re.findall(r"ARGV\[(\d+)\]", body(name))}
    if contract.tail is None:
        assert used <= set(range(1, len(contract.args) + 1)), used
