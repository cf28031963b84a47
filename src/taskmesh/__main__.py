"""``python -m taskmesh``: see :mod:`taskmesh.cli`."""

from taskmesh.entry import main

main()
