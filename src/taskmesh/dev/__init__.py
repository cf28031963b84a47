"""The dev stack (``taskmesh dev``): embedded PostgreSQL and Valkey, their guard, the demo handler.

This package's own module imports nothing: import the module you use.
"""
