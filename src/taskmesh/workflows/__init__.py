"""Workflows: a graph of tasks submitted in one call, whose joins are decided in PostgreSQL.

``spec``: the request and its validation; ``plan``: a validated graph as rows (pure);
``workflows``: the facade (submit, read, list, cancel, retry, repair); ``inputs``: what a task
of a workflow is handed at its claim (``ctx.parents``, ``ctx.workflow``). Readiness itself is
migration 0025's trigger and ``taskmesh_workflow_advance``.
"""
