"""The shared vocabulary (lua/lib/*.lua, which scripts include by their '-- uses:' line): the
steps several scripts share are spelled there once, and a fire's run id built in Lua is the one
jobqueue.store.keys.fire_run_id builds."""

from __future__ import annotations

import random
import re
from typing import Any

import pytest

from jobqueue.store.keys import PartitionKeys, fire_instant, fire_run_id
from jobqueue.store.schedules import SCHED_CREATE, RunGroup
from jobqueue.store.scripts import LIB, SCRIPT_NAMES, ScriptRunner, assemble, lua_dir

PK = PartitionKeys("default", 0)
LO_MS, HI_MS = -2_208_988_800_000, 253_402_300_799_999  # 1900-01-01 .. 9999-12-31T23:59:59.999
JOB_CHARS = "abcXYZ019-_.:{}#/ é中🙂"


def libs() -> str:
    """Every lib's text (what the prelude was)."""
    return "\n".join(p.read_text() for p in sorted((lua_dir() / LIB).glob("*.lua")))


def code(name: str) -> str:
    """A script without its comments."""
    text = (lua_dir() / f"{name}.lua").read_text()
    return "\n".join(re.sub(r"--.*$", "", line) for line in text.splitlines())


def fires(n: int, seed: int) -> list[tuple[str, int]]:
    """(job id, fire ms) pairs: ids of many characters and lengths, instants of whole seconds
    and with milliseconds, and the edges."""
    rng = random.Random(seed)
    out = [("j", 0), ("j", -1), ("nightly-report", 1_795_946_400_000), ("x", HI_MS),
           ("y", LO_MS), ("z", 1_795_946_400_250)]
    while len(out) < n:
        job = "".join(rng.choice(JOB_CHARS) for _ in range(rng.randint(1, 40)))
        ms = rng.randint(LO_MS, HI_MS)
        out.append((job, ms if rng.random() < 0.5 else ms - ms % 1000))
    return out


def test_the_lib_builds_the_run_id_the_python_function_builds(redis_client: Any) -> None:
    pairs = fires(500, seed=17)
    script = assemble("""-- uses: core, records
local out = {}
for i = 1, #ARGV, 2 do out[#out + 1] = fire_run_id(ARGV[i], ARGV[i + 1]) end
return out
""")
    args = [x for job, ms in pairs for x in (job, fire_instant(ms))]
    assert redis_client.eval(script, 0, *args) == [fire_run_id(job, ms) for job, ms in pairs]


def test_sched_create_names_each_run_by_the_python_fire_run_id(
    runner: ScriptRunner, redis_client: Any
) -> None:
    pairs = fires(300, seed=71)
    by_fire: dict[int, list[str | int]] = {}
    for job, ms in pairs:
        by_fire.setdefault(ms, []).extend((job, ms))
    groups = [(RunGroup("t", "{}", 3, 0, 0, ms), flat) for ms, flat in by_fire.items()]
    created = SCHED_CREATE.parse(runner.run(SCHED_CREATE.call(PK, groups, now=1)))
    assert created == len({fire_run_id(job, ms) for job, ms in pairs})
    for job, ms in pairs:
        assert redis_client.hget(PK.run(fire_run_id(job, ms)), "job") == job


def test_a_manual_fire_has_a_run_id_no_scheduled_fire_can_take() -> None:
    assert fire_run_id("report", 1_795_946_400_000) == "report@2026-11-29T10:00:00Z"
    assert fire_run_id("report", 1_795_946_400_000, manual=True) == (
        "report@manual-2026-11-29T10:00:00Z"
    )


# What each shared step looks like when a script spells it itself instead of calling the
# prelude's helper (named in the key).
RAW_STEPS = {
    "wake (a wake token pushed or the list cut)": r"'LPUSH'|'RPUSH'|'LTRIM'",
    "issue_fence/save_fences (a fence computed or the counter written)":
        r"next_fence\(|'SET',\s*KEYS",
    "bury (a record dead-lettered)": r"'state',\s*'dead'",
    "write_pending (a new pending record)": r"'state',\s*'pending',\s*'task'",
    "lease_until (a lease's length: the run's own or the default)":
        r"whole_or\([^,)]*lease[^,)]*,\s*1,",
    "trim_index (an index trimmed)": r"'ZREMRANGEBY",
    "fire_run_id (a run id built from a job id)": r"\.\.\s*'@'",
    "history (a history entry)": r"'hist',\s*1",
    "expire_record (a record set to expire)": r"'PEXPIRE',\s*prefix\s*\.\.\s*'run:'",
}


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_the_script_spells_no_shared_step_itself(name: str) -> None:
    found = [step for step, raw in RAW_STEPS.items() if re.search(raw, code(name))]
    assert found == [], f"{name}.lua spells instead of calling: {found}"


@pytest.mark.parametrize(
    "helper",
    ["waker", "wake", "fence_counter", "issue_fence", "save_fences", "lease_until",
     "write_pending", "bury", "trim_index", "fire_run_id", "history", "expire_record", "clock"],
)
def test_a_lib_defines_each_shared_step(helper: str) -> None:
    assert re.search(rf"^local function {helper}\(", libs(), re.M), helper
