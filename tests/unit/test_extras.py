"""The extras' table (``taskmesh.extras``) against ``pyproject.toml``, and the error naming a missing extra."""

from __future__ import annotations

import importlib.metadata
import tomllib

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from taskmesh import extras
from tests.proc import ROOT

OPTIONAL = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
TOOLING = {"all", "dev", "docs"}
"""Extras that are not a part a user runs: ``all`` itself, the tests' and lint tools, the docs site's."""


def requirements_of(extra: str) -> set[str]:
    """The distributions ``extra`` installs, following ``taskmesh[...]`` to the extras it names."""
    names: set[str] = set()
    for line in OPTIONAL[extra]:
        req = Requirement(line)
        if canonicalize_name(req.name) == "taskmesh":
            for inner in req.extras:
                names |= requirements_of(inner)
        else:
            names.add(canonicalize_name(req.name))
    return names


@pytest.mark.parametrize("extra", sorted(extras.MODULES))
def test_each_module_the_table_checks_comes_with_its_extra(extra: str) -> None:
    owners = importlib.metadata.packages_distributions()
    for module in extras.MODULES[extra]:
        dists = {canonicalize_name(d) for d in owners.get(module, [])}
        assert dists & requirements_of(extra), f"{module} ({dists}) is not installed by taskmesh[{extra}]"


def test_all_is_every_extra_a_user_can_run() -> None:
    users = set(OPTIONAL) - TOOLING
    assert set(extras.MODULES) <= users
    assert requirements_of("all") == set().union(*(requirements_of(e) for e in users))


def test_a_missing_extra_is_refused_in_words_that_name_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(extras.MODULES, "server", ("fastapi", "taskmesh_no_such_module"))
    assert extras.missing("server") == ["taskmesh_no_such_module"] and not extras.installed("server")
    with pytest.raises(extras.MissingExtraError) as caught:
        extras.require_extra("server", "the HTTP API", hint="or taskmesh worker")
    assert str(caught.value) == (
        "the HTTP API needs the 'server' extra: pip install 'taskmesh[server]' "
        "(not installed: taskmesh_no_such_module); or taskmesh worker"
    )


def test_an_installed_extra_passes() -> None:
    for extra in extras.MODULES:
        extras.require_extra(extra, "anything")
