"""The built wheel carries the Lua scripts, and an installed (non-editable) jobqueue finds them."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from jobqueue.scripts import PRELUDE, SCRIPT_NAMES

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(out), str(ROOT)],
        check=True, capture_output=True,
    )
    (found,) = out.glob("jobqueue-*.whl")
    return found


def test_wheel_contains_every_lua_script(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for script in (PRELUDE, *SCRIPT_NAMES):
        assert f"jobqueue/lua/{script}.lua" in names


def test_wheel_is_marked_typed_with_py_typed(wheel: Path) -> None:
    assert "jobqueue/py.typed" in zipfile.ZipFile(wheel).namelist()


def test_installed_package_loads_its_scripts_from_inside_itself(wheel: Path,
                                                                tmp_path: Path) -> None:
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target),
         str(wheel)],
        check=True, capture_output=True,
    )
    probe = (
        "import jobqueue, jobqueue.scripts as s; "
        "print(jobqueue.__file__); print(s.lua_dir()); print(len(s.scripts()))"
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    out = subprocess.run([sys.executable, "-c", probe], env=env, cwd=tmp_path,
                         capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0].startswith(str(target)), "the installed copy, not the checkout, was imported"
    assert out[1] == str(target / "jobqueue" / "lua")
    assert int(out[2]) == len(SCRIPT_NAMES)
