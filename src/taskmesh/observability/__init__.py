"""Observability: structured logs, Prometheus metrics, tracing and throttled log lines.

This package's own module imports nothing: import the module you use.
"""
