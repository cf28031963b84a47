"""An installed earlier release of taskmesh, from this repository's history, for the upgrade test."""

from __future__ import annotations

import io
import subprocess
import sys
import sysconfig
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def install(commit: str, where: Path) -> Path:
    """Install taskmesh as of ``commit`` into a new venv under ``where``; its Python.

    The venv sees this one's libraries (a ``.pth`` naming this venv's site-packages, whose own
    ``.pth`` files, this checkout's editable install among them, are not read from there) and
    adds what the release needed that this one no longer does (pip finds the rest installed): it
    runs on the releases of its libraries this checkout's constraints.txt names.

    :raises subprocess.CalledProcessError: git, venv or pip failed (the commit is not in the history).
    """
    source = where / "source"
    source.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit], check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(source, filter="data")
    venv = where / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    (Path(purelib) / "taskmesh-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # pip sees this venv's distributions through the .pth: it installs only what they lack.
    constraints = ROOT / "constraints.txt"
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "-c", str(constraints), str(source)],
        check=True,
        capture_output=True,
    )
    return python
