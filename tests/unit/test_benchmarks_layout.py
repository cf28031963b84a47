"""The benchmark lives in ``benchmarks/``, outside the installed package, and still runs as one command."""

from __future__ import annotations

import argparse
import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_the_package_ships_no_benchmark_and_imports_nothing_from_it() -> None:
    assert importlib.util.find_spec("taskmesh.bench") is None
    assert importlib.util.find_spec("taskmesh.bench_handler") is None
    for path in (ROOT / "src" / "taskmesh").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            assert not any(name.split(".")[0] == "benchmarks" for name in names), path


def test_the_cli_has_no_bench_subcommand() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "taskmesh", "bench"], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert done.returncode == 2 and "No such command 'bench'" in done.stderr, done.stderr


def test_the_benchmark_runs_as_a_module_from_the_repository_root() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench", "--help"], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    for option in ("--tasks", "--concurrency", "--prefetch", "--skip-http", "--compare", "--peers-dir"):
        assert option in done.stdout


@pytest.mark.parametrize(
    ("module", "options"),
    [
        ("benchmarks.workflows", ("--fanout", "--chains", "--baseline", "--rounds", "--concurrency", "--database")),
        (
            "benchmarks.limits",
            ("--tasks", "--keys", "--baseline", "--rounds", "--pairs", "--concurrency", "--database"),
        ),
    ],
)
def test_the_drain_benchmarks_run_as_modules_from_the_repository_root(module: str, options: tuple[str, ...]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    for option in options:
        assert option in done.stdout, option


def test_the_limits_benchmark_runs_the_pairs_it_is_given() -> None:
    from benchmarks.limits import PAIRS, pairs  # the repository root's, not the package's

    assert pairs("baseline") == ("baseline",)
    assert pairs("limit, fairness") == ("limit", "fairness")
    assert pairs(",".join(PAIRS)) == PAIRS
    for wrong in ("", ",", "limits", "baseline,nope"):
        with pytest.raises(argparse.ArgumentTypeError, match="must name some of limit, fairness, baseline"):
            pairs(wrong)
