"""The shared vocabulary (lua/lib/*.lua, which scripts include by their '-- uses:' line): the
steps several scripts share are spelled there once, and a fire's run id built in Lua is the one
jobqueue.store.keys.fire_run_id builds."""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

import pytest

from jobqueue.errors import ScriptError
from jobqueue.store.keys import PartitionKeys, fire_instant, fire_run_id
from jobqueue.store.schedules import SCHED_CREATE, RunGroup
from jobqueue.store.scripts import (
    LIB,
    SCRIPT_NAMES,
    ScriptRunner,
    assemble,
    header_of,
    includes,
    lua_dir,
    scripts,
    uses,
)

PK = PartitionKeys("default", 0)
LO_MS, HI_MS = -2_208_988_800_000, 253_402_300_799_999  # 1900-01-01 .. 9999-12-31T23:59:59.999
JOB_CHARS = "abcXYZ019-_.:{}#/ é中🙂"


def libs() -> str:
    """Every lib's text (what the prelude was)."""
    return "\n".join(p.read_text() for p in sorted((lua_dir() / LIB).glob("*.lua")))


def uncommented(text: str) -> str:
    return "\n".join(re.sub(r"--.*$", "", line) for line in text.splitlines())


def lib_names() -> list[str]:
    return sorted(p.stem for p in (lua_dir() / LIB).glob("*.lua"))


def lib_text(name: str) -> str:
    return (lua_dir() / LIB / f"{name}.lua").read_text()


def script_text(name: str) -> str:
    return (lua_dir() / f"{name}.lua").read_text()


def code(name: str) -> str:
    """A script without its comments, with the libs no other script includes (its own steps,
    kept in lua/lib/: claim's)."""
    used = {n: set(includes(script_text(n), n)) for n in SCRIPT_NAMES}
    others = set().union(*(libs for n, libs in used.items() if n != name))
    own = sorted(used[name] - others)
    return uncommented("\n".join([script_text(name), *(lib_text(lib) for lib in own)]))


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


# -- includes: '-- uses:' lines, resolved at load ------------------------------------------------


def fake_libs(libs: dict[str, str]) -> Any:
    def read(name: str, chain: list[str]) -> str:
        if name not in libs:
            raise ScriptError(f"{' -> '.join(chain)} uses {name}, which does not exist")
        return libs[name]

    return read


def test_includes_come_transitively_each_once_after_what_they_use() -> None:
    libs = {"a": "-- uses: (none)\n", "b": "-- uses: a\n", "c": "-- uses: b, a\n",
            "d": "-- uses: a\n"}
    assert includes("-- uses: c, d\n", "x", fake_libs(libs)) == ["a", "b", "c", "d"]
    assert includes("-- uses: d, c, b\n", "x", fake_libs(libs)) == ["a", "d", "b", "c"]


def test_a_uses_list_may_go_on_over_lines() -> None:
    assert uses("-- x.lua: y\n--\n-- uses: a, b,\n--       c\n--\n-- KEYS[1] k zset\n") == (
        "a", "b", "c")


def test_a_missing_lib_is_an_error_naming_who_uses_it() -> None:
    with pytest.raises(ScriptError, match=r"x -> b uses nope"):
        includes("-- uses: b\n", "x", fake_libs({"b": "-- uses: nope\n"}))
    with pytest.raises(ScriptError, match=r"lua/lib/nope\.lua does not exist"):
        includes("-- uses: core, nope\n", "x")


def test_an_include_cycle_is_an_error_naming_the_cycle() -> None:
    libs = {"a": "-- uses: b\n", "b": "-- uses: c\n", "c": "-- uses: a\n"}
    with pytest.raises(ScriptError, match=r"include cycle: x -> a -> b -> c -> a"):
        includes("-- uses: a\n", "x", fake_libs(libs))


@pytest.mark.parametrize("header", ["-- no uses line\n", "-- uses: a\n-- uses: b\n",
                                    "-- uses: a, a\n", "-- uses: ../a\n"])
def test_a_header_without_one_clear_uses_line_is_an_error(header: str) -> None:
    with pytest.raises(ScriptError, match="uses"):
        includes(header, "x", fake_libs({"a": "-- uses: (none)\n", "b": "-- uses: (none)\n"}))


def test_an_assembled_script_past_luas_local_limit_is_an_error_at_load() -> None:
    body = "-- uses: core\n" + "".join(f"local v{i} = {i}\n" for i in range(200))
    with pytest.raises(ScriptError, match="top-level locals"):
        assemble(body, "x")


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_the_loaded_script_is_its_libs_then_its_text(name: str) -> None:
    text = script_text(name)
    libs = includes(text, name)
    assert libs[0] == "core"
    assert scripts()[name].plain == "\n".join([*(lib_text(lib) for lib in libs), text])


def top_level_names(text: str) -> set[str]:
    names = set(re.findall(r"^local function (\w+)", text, re.M))
    for listed in re.findall(r"^local ([\w, ]+?)\s*=", text, re.M):
        names |= {n.strip() for n in listed.split(",")}
    return names


def referenced(text: str) -> set[str]:
    code = "\n".join(  # strings out, then comments, line by line
        re.sub(r"--.*$", "", re.sub(r"'(?:[^'\\]|\\.)*'", "''", line))
        for line in text.splitlines()
    )
    code = re.sub(r"([{,]\s*)\w+(\s*=[^=])", r"\1\2", code)  # table fields, not names
    return set(re.findall(r"(?<![.:\w])([A-Za-z_]\w*)", code))


@pytest.mark.parametrize("path", [f"{n}.lua" for n in SCRIPT_NAMES] +
                         [f"{LIB}/{n}.lua" for n in lib_names()])
def test_a_file_uses_every_lib_whose_names_it_calls(path: str) -> None:
    """A name a lib defines, called from a file that does not include that lib, would be a nil
    global at run time: each file's '-- uses:' names every lib it calls (libs included by
    what it uses count), and no lib it does not call."""
    text = (lua_dir() / path).read_text()
    own = top_level_names(text)
    called = {lib for lib in lib_names()
              if (referenced(text) - own) & top_level_names(lib_text(lib))}
    listed = set(uses(text, path))
    assert listed == called - ({Path(path).stem} if path.startswith(LIB) else set())
    assert called <= set(includes(text, path)) | {Path(path).stem}


@pytest.mark.parametrize("name", lib_names())
def test_a_lib_begins_with_its_header(name: str) -> None:
    """Its name, what it is for, what it uses and what it provides (each function, what it
    needs and returns)."""
    header = header_of(lib_text(name))
    assert header.startswith(f"-- lib/{name}.lua: ")
    assert re.search(r"^-- uses: ", header, re.M)
    assert re.search(r"^-- Provides", header, re.M)
    for function in re.findall(r"^local function (\w+)", lib_text(name), re.M):
        assert function in header, f"lib/{name}.lua's header does not tell of {function}"


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_a_script_begins_with_its_header(name: str) -> None:
    header = header_of(script_text(name))
    assert header.startswith(f"-- {name}.lua: ")
    for part in (r"^-- uses: ", r"^-- (KEYS\[1\]|KEYS: none)", r"^-- ARGV\[1\]", r"^-- Returns"):
        assert re.search(part, header, re.M), (name, part)
