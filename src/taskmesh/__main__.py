"""``python -m taskmesh``: see :mod:`taskmesh.cli`."""

from taskmesh.cli.entry import main

main()
