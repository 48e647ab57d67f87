"""The wheel carries the dashboard's templates and static files (package data, not code)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "jobqueue" / "dashboard"


def test_wheel_contains_every_dashboard_template_and_static_file(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("jobqueue-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    data = [p for d in ("templates", "static") for p in (DASHBOARD / d).iterdir()]
    assert len(data) >= 10
    for path in data:
        assert path.relative_to(ROOT).as_posix() in names
