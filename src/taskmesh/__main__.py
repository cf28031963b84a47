"""``python -m taskmesh``: see :mod:`taskmesh.cli`."""

from taskmesh.cli import exit_main

exit_main()
