"""Task signatures are checked end to end by type checkers: mypy (strict) and pyright accept
every good call of tests/typing/api_calls.py and refuse exactly the lines marked ``# bad``."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import mypy.api

CALLS = Path(__file__).resolve().parent / "typing" / "api_calls.py"
ROOT = CALLS.parents[2]


def bad_lines() -> set[int]:
    lines = CALLS.read_text().splitlines()
    return {n for n, line in enumerate(lines, 1) if line.rstrip().endswith("# bad")}


def test_the_calls_file_has_bad_calls_to_refuse() -> None:
    assert len(bad_lines()) >= 8


def test_mypy_refuses_exactly_the_bad_calls() -> None:
    out, _, _ = mypy.api.run(
        ["--strict", "--no-incremental", "--cache-dir", "/dev/null", "--config-file",
         str(ROOT / "pyproject.toml"), str(CALLS)]
    )
    flagged = {int(m.group(1)) for m in re.finditer(r"api_calls\.py:(\d+): error", out)}
    assert flagged == bad_lines(), out


def test_pyright_refuses_exactly_the_bad_calls() -> None:
    pyright = Path(sys.executable).parent / "pyright"
    done = subprocess.run(
        [str(pyright), "--outputjson", "--pythonpath", sys.executable, str(CALLS)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    report = json.loads(done.stdout)
    flagged = {
        d["range"]["start"]["line"] + 1
        for d in report["generalDiagnostics"]
        if d["severity"] == "error"
    }
    assert flagged == bad_lines(), done.stdout
