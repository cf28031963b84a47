"""The reference pages are the code's: regenerated into a temporary directory, each equals the committed one."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def generator() -> ModuleType:
    """``docs/gen_reference.py``, which is a script of the repository, not a module of the package."""
    spec = importlib.util.spec_from_file_location("gen_reference", DOCS / "gen_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GEN = generator()


@pytest.mark.parametrize("page", sorted(GEN.PAGES))
def test_a_generated_reference_page_equals_the_committed_one(page: str, tmp_path: Path) -> None:
    GEN.write(tmp_path)
    committed = DOCS / page
    assert committed.is_file(), f"{page} is missing: run make docs-reference"
    made = (tmp_path / page).read_text()
    assert made == committed.read_text(), f"{page} differs from the code: run make docs-reference"


def test_every_setting_command_and_public_name_is_in_its_page() -> None:
    """The pages hold each item of the code once: a generator that lost rows would still compare equal."""
    settings = (DOCS / "reference" / "settings.md").read_text()
    for name in GEN.Settings.model_fields:
        assert f"| `{name}` |" in settings, name
    cli = (DOCS / "reference" / "cli.md").read_text()
    root = GEN.typer.main.get_command(GEN.cli_app)
    for path, _command in GEN.commands(root, ["taskmesh"]):
        assert f"## `{' '.join(path)}`" in cli, path
    api = (DOCS / "reference" / "python-api.md").read_text()
    for name in GEN.taskmesh.__all__:
        assert name.startswith("_") or f"::: taskmesh.{name}\n" in api, name
    openapi = (DOCS / "reference" / "openapi.md").read_text()
    assert "## `POST /api/v1/tasks`" in openapi and "## `GET /readyz`" in openapi
    events = (DOCS / "reference" / "log-events.md").read_text()
    for event in ("store_unavailable", "service_crashed", "auth_open", "run_finished", "late_result_dropped"):
        assert f"| `{event}` |" in events, event
