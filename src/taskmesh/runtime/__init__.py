"""The runtime: the supervisor and its service table, worker and handler processes, signals,
the loop monitor, the emergency exit, systemd notifications and the clocks.

This package's own module imports nothing: import the module you use.
"""
