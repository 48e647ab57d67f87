"""Print a pip constraints file pinning every runtime dependency of jobqueue (and of its
extras) to the lowest version pyproject.toml allows: `bin/test --lowest` installs with it."""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

project = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())
requirements = list(project["project"]["dependencies"])
for extra in project["project"].get("optional-dependencies", {}).values():
    requirements += extra
floors: dict[str, str] = {}
for requirement in requirements:
    match = re.fullmatch(r"\s*([A-Za-z0-9_.-]+)(\[[^\]]*\])?\s*>=\s*([^,;\s]+)\s*", requirement)
    if match is None:
        sys.exit(f"bin/_floors.py: no '>=' floor in requirement {requirement!r}")
    name = re.sub(r"[-_.]+", "-", match[1]).lower()
    floors[name] = match[3]
for name, version in sorted(floors.items()):
    print(f"{name}=={version}")
