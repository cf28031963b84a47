"""The services of an instance: each a module with ``run()`` and ``run_once()`` over the stores it is given.

This package's own module imports nothing: import the module you use.
"""
