"""Tests of the files in deploy/, each with the real tool where it runs here (docs/guides/deployment.md)."""

from __future__ import annotations

from pathlib import Path

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
