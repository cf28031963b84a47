"""deploy/systemd/taskmesh.service: ``systemd-analyze verify`` and its offline security score.

No systemd runs as PID 1 here, so the unit is checked, not started. ``verify``
needs ExecStart's program to exist: the test checks a copy whose ExecStart
runs this interpreter, otherwise the shipped file unchanged.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from taskmesh.config import Settings
from tests.deploy import DEPLOY
from tests.tools import require_tool, tool_missing

SHIPPED = DEPLOY / "systemd" / "taskmesh.service"
EXPOSURE_MAX = 2.0
"""``systemd-analyze security`` exposure the unit must stay under (0 best, 10 worst; the shipped unit: 1.4)."""


def service_options(text: str) -> dict[str, list[str]]:
    options: dict[str, list[str]] = {}
    section = ""
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line.strip("[]")
        elif line and not line.startswith(("#", ";")):
            key, _, value = line.partition("=")
            options.setdefault(f"{section}.{key}", []).append(value)
    return options


@pytest.fixture
def systemd_analyze() -> str:
    return require_tool(
        "systemd-analyze",
        "Debian package systemd",
        "deploy/systemd/taskmesh.service was not verified",
        also=["/usr/bin/systemd-analyze"],
    )


@pytest.fixture
def unit(tmp_path: Path) -> Path:
    text = SHIPPED.read_text()
    assert re.search(r"^ExecStart=/opt/taskmesh/\.venv/bin/python -m taskmesh run$", text, re.M)
    rendered = tmp_path / "taskmesh.service"  # verify names the unit after the file
    rendered.write_text(re.sub(r"^ExecStart=\S+", f"ExecStart={sys.executable}", text, flags=re.M))
    return rendered


def test_the_unit_notifies_waits_past_the_grace_period_and_restarts_on_failure() -> None:
    options = service_options(SHIPPED.read_text())
    grace = Settings.model_fields["shutdown_grace_seconds"].default
    assert options["Service.Type"] == ["notify"] and options["Service.NotifyAccess"] == ["main"]
    assert int(options["Service.WatchdogSec"][0]) >= 10
    assert options["Service.KillSignal"] == ["SIGTERM"] and options["Service.KillMode"] == ["mixed"]
    assert int(options["Service.TimeoutStopSec"][0]) >= grace + 15  # the exit comes within grace + 15 s
    assert options["Service.Restart"] == ["on-failure"]
    assert options["Service.User"] == ["taskmesh"] and options["Service.NoNewPrivileges"] == ["yes"]


def test_systemd_analyze_verify_accepts_the_unit_without_a_warning(systemd_analyze: str, unit: Path) -> None:
    done = subprocess.run(
        [systemd_analyze, "verify", "--man=no", str(unit)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and done.stdout.strip() == "" and done.stderr.strip() == "", done.stdout + done.stderr


def test_the_units_exposure_stays_low(systemd_analyze: str, unit: Path) -> None:
    done = subprocess.run(
        [systemd_analyze, "security", "--offline=yes", f"--threshold={EXPOSURE_MAX * 10:.0f}", "--no-pager", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if "--offline" in done.stderr and "unrecognized" in done.stderr:
        tool_missing(
            "systemd-analyze --offline",
            "systemd 252 or newer",
            f"the unit's exposure was not scored ({done.stderr.strip()})",
        )
    score = re.search(r"Overall exposure level for taskmesh\.service: ([0-9.]+)", done.stdout)
    assert score is not None, done.stdout + done.stderr
    assert float(score.group(1)) <= EXPOSURE_MAX and done.returncode == 0, done.stdout
