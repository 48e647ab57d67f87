"""What gets installed: the wheel carries the Lua scripts, the dashboard's files, the license
and a version; the sdist carries everything its tests need; a wheel installed (not editable)
in a fresh virtual environment runs the CLI and the demo."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest

import jobqueue
from jobqueue.store.embedded import EmbeddedServer
from jobqueue.store.scripts import LIB, SCRIPT_NAMES, lua_dir

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "jobqueue" / "dashboard"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
DIST_NAME = PYPROJECT["project"]["name"]


def _build(kind: str, out: Path) -> Path:
    """Build with the installed hatchling: no network, no build isolation."""
    probe = (
        "import sys, hatchling.build as b; "
        f"print(b.build_{kind}(sys.argv[1]))"
    )
    name = subprocess.run(
        [sys.executable, "-c", probe, str(out)], cwd=ROOT, check=True, capture_output=True,
        text=True,
    ).stdout.strip().splitlines()[-1]
    return out / name


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build("wheel", tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="module")
def sdist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build("sdist", tmp_path_factory.mktemp("sdist"))


def _wheel_names(wheel: Path) -> set[str]:
    return set(zipfile.ZipFile(wheel).namelist())


def _metadata(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as z:
        (meta,) = (n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        return z.read(meta).decode()


def test_the_distribution_name_differs_from_the_import_name_only_where_an_index_needs_it(
) -> None:
    # An index refuses a name equal to an existing one once '-', '_' and '.' are removed
    # ("job-queue" exists, so "jobqueue" is taken); the import and the command stay jobqueue.
    assert re.sub(r"[-_.]", "", DIST_NAME) != "jobqueue"
    assert PYPROJECT["project"]["scripts"] == {"jobqueue": "jobqueue.cli:main"}


def test_the_wheel_is_named_after_the_distribution_and_the_package_version(wheel: Path) -> None:
    assert wheel.name.startswith(f"{DIST_NAME.replace('-', '_')}-{jobqueue.__version__}-")
    assert f"Version: {jobqueue.__version__}" in _metadata(wheel)


def test_the_wheel_contains_every_lua_script(wheel: Path) -> None:
    names = _wheel_names(wheel)
    for script in SCRIPT_NAMES:
        assert f"jobqueue/lua/{script}.lua" in names
    libs = sorted(p.stem for p in (lua_dir() / LIB).glob("*.lua"))
    assert libs, "no lua/lib/*.lua found"
    for lib in libs:  # the helpers the scripts include at load
        assert f"jobqueue/lua/{LIB}/{lib}.lua" in names


def test_the_wheel_is_marked_typed_with_py_typed(wheel: Path) -> None:
    assert "jobqueue/py.typed" in _wheel_names(wheel)


def test_the_wheel_contains_every_dashboard_template_and_static_file(wheel: Path) -> None:
    names = _wheel_names(wheel)
    data = [p for d in ("templates", "static") for p in (DASHBOARD / d).iterdir()]
    assert len(data) >= 10
    for path in data:
        assert path.relative_to(ROOT).as_posix() in names


def test_the_wheel_carries_the_license_and_its_classifiers(wheel: Path) -> None:
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in _wheel_names(wheel))
    meta = _metadata(wheel)
    assert "License-Expression: MIT" in meta
    assert "Classifier: Programming Language :: Python :: 3.11" in meta
    assert "Classifier: Typing :: Typed" in meta


def test_the_wheel_offers_users_no_test_tools(wheel: Path) -> None:
    extras = set(re.findall(r"^Provides-Extra: (\S+)$", _metadata(wheel), re.M))
    assert extras == {"embedded", "metrics", "dashboard", "reload", "sentry", "otel", "uvloop"}
    required = " ".join(re.findall(r"^Requires-Dist: (.+)$", _metadata(wheel), re.M))
    for tool in ("pytest", "fakeredis", "mypy", "playwright", "hypothesis", "pyright"):
        assert tool not in required


def test_the_sdist_carries_what_its_tests_read(sdist: Path) -> None:
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    for needed in ("LICENSE", "README.md", "pyproject.toml", "lua/claim.lua",
                   "docker/Dockerfile", "docker/compose.yaml", "tests/test_docker.py",
                   "docs/guarantees.md", "bin/test", "bin/demo"):
        assert needed in names, needed


def test_an_installed_package_loads_its_scripts_from_inside_itself(
    wheel: Path, tmp_path: Path
) -> None:
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target),
         str(wheel)],
        check=True, capture_output=True,
    )
    probe = (
        "import jobqueue, jobqueue.store.scripts as s; "
        "print(jobqueue.__file__); print(s.lua_dir()); print(len(s.scripts()))"
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    out = subprocess.run([sys.executable, "-c", probe], env=env, cwd=tmp_path,
                         capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0].startswith(str(target)), "the installed copy, not the checkout, was imported"
    assert out[1] == str(target / "jobqueue" / "lua")
    assert int(out[2]) == len(SCRIPT_NAMES)


@pytest.mark.slow
def test_a_wheel_installed_in_a_fresh_venv_runs_check_and_the_demo(
    wheel: Path, tmp_path: Path, real_server: EmbeddedServer
) -> None:
    """Not editable, not from the checkout: the wheel and its declared dependencies only."""
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python, cli = env_dir / "bin" / "python", env_dir / "bin" / "jobqueue"
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", f"{wheel}[embedded]"],
        check=True, capture_output=True, text=True, timeout=600,
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBQUEUE_")}
    env["PYTHONPATH"] = ""
    version = subprocess.run([str(cli), "--version"], env=env, cwd=tmp_path,
                             capture_output=True, text=True, check=True).stdout
    assert version.strip() == f"jobqueue, version {jobqueue.__version__}"
    check = subprocess.run([str(cli), "--redis-url", real_server.url, "check"], env=env,
                           cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert "Traceback" not in check.stderr
    assert "connected; server" in check.stdout and "scripts loaded" in check.stdout, check.stdout
    # The test server keeps nothing (AOF off, no snapshots): check says so and exits 1.
    assert "WARN  persistence: appendonly no" in check.stdout, check.stdout
    assert check.returncode == 1, check.stdout + check.stderr
    demo = subprocess.run([str(python), "-m", "jobqueue.demo"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert demo.returncode == 0, demo.stdout + demo.stderr
    where = subprocess.run([str(python), "-c", "import jobqueue; print(jobqueue.__file__)"],
                           env=env, cwd=tmp_path, capture_output=True, text=True, check=True)
    assert where.stdout.startswith(str(env_dir)), "the installed copy must be the one that ran"
