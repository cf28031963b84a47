"""Security: API keys, tenancy and the audit log.

This package's own module imports nothing: import the module you use.
"""
