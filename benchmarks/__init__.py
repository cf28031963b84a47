"""taskmesh's benchmark, kept out of the installed package: ``python -m benchmarks.bench`` (or ``make bench``).

Run from the repository root with the venv's Python, so that ``benchmarks``
is importable; the instance it starts finds the handler module through
``PYTHONPATH``, which the benchmark sets.
"""
