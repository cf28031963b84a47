"""Schedules: cron specifications and the schedule table the scheduler fires.

This package's own module imports nothing: import the module you use.
"""
