"""Clients: the async :class:`~taskmesh.clients.client.Client` and the blocking ``SyncClient``.

This package's own module imports nothing: import the module you use.
"""
