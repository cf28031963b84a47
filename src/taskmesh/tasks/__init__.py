"""The task model: tasks and their states, the actions on them (cancel, retry, replay), bulk
operations, search and history, validation, the handler registry and what handlers advertise.

This package's own module imports nothing: import the module you use.
"""
