"""Tests of the files in deploy/, each with the real tool where it runs here (see the README's Deployment files)."""

from __future__ import annotations

from pathlib import Path

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def tool_missing(tool: str, package: str, unchecked: str) -> str:
    """The reason a test skips when a system tool is not found: the tool, where it comes from, what was not checked.

    ``make test`` installs nothing from the system package manager; ``make deploy-tools``
    (which CI runs first) does, so the message points there.

    :param tool: the program looked for (``nginx``).
    :param package: the Debian package that has it (``nginx``).
    :param unchecked: what the test would have checked (``deploy/nginx/taskmesh.conf was not checked``).
    """
    return f"{tool} not found (Debian package {package}; `make deploy-tools` installs it): {unchecked}"
