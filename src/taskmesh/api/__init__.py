"""The HTTP API (FastAPI): the app, its routes, authentication, the serving policy and the answers' schemas.

This package's own module imports nothing: import the module you use.
"""
