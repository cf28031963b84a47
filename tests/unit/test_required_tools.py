"""The switch that turns a test's missing system tool from a skip into a failure (tests/tools.py)."""

from __future__ import annotations

import pytest

from tests.tools import REQUIRE_TOOLS, require_tool

MISSING = "taskmesh-no-such-tool"


def test_a_missing_tool_skips_the_test_and_names_the_tool_and_make_deploy_tools(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(REQUIRE_TOOLS, raising=False)
    with pytest.raises(pytest.skip.Exception) as skipped:
        require_tool(MISSING, "Debian package nothing", "nothing was checked")
    assert str(skipped.value) == (
        f"{MISSING} not found (Debian package nothing; `make deploy-tools` installs it): nothing was checked"
    )


@pytest.mark.parametrize("value", ["1", "yes"])
def test_with_the_switch_on_a_missing_tool_fails_the_test(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(REQUIRE_TOOLS, value)
    with pytest.raises(pytest.fail.Exception) as failed:
        require_tool(MISSING, "Debian package nothing", "nothing was checked")
    assert str(failed.value).startswith(f"{MISSING} not found (Debian package nothing; `make deploy-tools`")
    assert str(failed.value).endswith(f"[{REQUIRE_TOOLS}=1: a missing tool fails the test]")


def test_the_switch_set_to_0_is_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(REQUIRE_TOOLS, "0")
    with pytest.raises(pytest.skip.Exception):
        require_tool(MISSING, "Debian package nothing", "nothing was checked")


def test_a_tool_found_off_path_is_returned(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(REQUIRE_TOOLS, "1")
    monkeypatch.setenv("PATH", "")
    assert require_tool("sh", "Debian package dash", "nothing", also=["/nonexistent/sh", "/bin/sh"]) == "/bin/sh"
