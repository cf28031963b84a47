"""The system tools some tests run (nginx, promtool, pgbouncer, ...): found, or the test skips, or fails.

``make test`` installs nothing from the system package manager, so on a machine without a
tool its tests skip and say what was not checked. Where every tool must be there (CI, after
``make deploy-tools``), ``TASKMESH_TEST_REQUIRE_TOOLS=1`` turns each of those skips into a
failure naming the tool and how to install it: a suite that quietly became skips would
otherwise leave the run green. Every "tool missing" skip of the tests goes through
:func:`tool_missing` so that the switch reaches all of them.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from typing import NoReturn

import pytest

REQUIRE_TOOLS = "TASKMESH_TEST_REQUIRE_TOOLS"
"""Environment variable: ``1`` (anything but empty or ``0``) makes a missing tool fail its test."""


def tools_required() -> bool:
    """Whether a missing tool fails the test (:data:`REQUIRE_TOOLS` is set) instead of skipping it."""
    return os.environ.get(REQUIRE_TOOLS, "") not in ("", "0")


def tool_missing(tool: str, package: str, unchecked: str, *, installer: str = "make deploy-tools") -> NoReturn:
    """Skip the test for want of ``tool``, or fail it when :func:`tools_required`.

    :param tool: the program (or capability) looked for (``nginx``).
    :param package: where it comes from (``Debian package nginx``).
    :param unchecked: what the test would have checked (``deploy/nginx/taskmesh.conf was not checked``).
    :param installer: the command that installs it.
    :raises pytest.skip.Exception: the tool is missing and not required.
    :raises pytest.fail.Exception: the tool is missing and required.
    """
    reason = f"{tool} not found ({package}; `{installer}` installs it): {unchecked}"
    if tools_required():
        pytest.fail(f"{reason} [{REQUIRE_TOOLS}=1: a missing tool fails the test]", pytrace=False)
    pytest.skip(reason)


def find_tool(tool: str, also: Sequence[str] = ()) -> str | None:
    """``tool`` on PATH, else the first of ``also`` (absolute paths) that is executable, else ``None``."""
    return shutil.which(tool) or next((p for p in also if os.access(p, os.X_OK)), None)


def require_tool(
    tool: str, package: str, unchecked: str, *, also: Sequence[str] = (), installer: str = "make deploy-tools"
) -> str:
    """The path of ``tool`` (see :func:`find_tool`); skips or fails the test when it is missing (:func:`tool_missing`).

    :param also: absolute paths to try when PATH has no ``tool`` (``/usr/sbin/nginx``).
    """
    return find_tool(tool, also) or tool_missing(tool, package, unchecked, installer=installer)
