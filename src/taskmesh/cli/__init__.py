"""Command line: ``taskmesh`` (or ``python -m taskmesh``).

The commands are in :mod:`taskmesh.cli.app` (Typer), one module per group of verbs; how a
command's end becomes the exit status is in :mod:`taskmesh.cli.exits`. This package's own
module imports nothing, so that the bare start of an instance (``taskmesh``, ``taskmesh run``:
:mod:`taskmesh.entry`) loads :mod:`taskmesh.cli.instance` without the operator's verbs.
"""
