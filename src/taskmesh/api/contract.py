"""The OpenAPI document as a contract: its tags, and the shared schemas FastAPI does not collect itself.

FastAPI puts a model in ``components/schemas`` only when a route names it as a parameter or a
``response_model``. Two kinds of schema are referenced otherwise: the :class:`~taskmesh.api.schemas.Problem`
of every error answer (under ``application/problem+json``, which FastAPI's ``responses`` cannot attach a
model to) and the request bodies the routes parse themselves (:func:`taskmesh.api.deps.body_schema`).
:func:`install` adds both to the document, once, when it is first built.

Every route names its ``operation_id`` (camelCase, stable: a generated client's method names) and its
tag in its decorator; ``tests/integration/test_openapi_contract.py`` holds the list.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode, models_json_schema

from taskmesh.api.schemas import Problem

REF_TEMPLATE = "#/components/schemas/{model}"
"""Where a model's schema sits in the document: what a ``$ref`` to it names."""

TAGS: list[dict[str, str]] = [
    {"name": "tasks", "description": "Create, read, find, cancel, retry and delete tasks."},
    {"name": "runs", "description": "The runs (attempts) of a task."},
    {"name": "workflows", "description": "Graphs of tasks: submit, read, list, cancel, retry from failure."},
    {"name": "operations", "description": "Bulk actions over the tasks a filter matches, and their progress."},
    {"name": "queues", "description": "Queue depths and history; pausing and resuming a queue."},
    {"name": "dlq", "description": "Dead-lettered tasks of a queue, and replaying them."},
    {"name": "limits", "description": "Task limits: what each holds now; setting one at run time, on every instance."},
    {"name": "schedules", "description": "Cron schedules: read, fire now, pause, resume."},
    {"name": "workers", "description": "The registered instances and the queues none of them serves."},
    {"name": "keys", "description": "API keys: list, make, revoke, rotate."},
    {"name": "audit", "description": "The audit log."},
    {"name": "health", "description": "Liveness, readiness and metrics (served also without the API)."},
]
"""The document's tags, one per resource, in the order the docs pages show them."""

BODY_MODELS: dict[str, type[BaseModel]] = {}
"""Request bodies referenced by name, filled by :func:`taskmesh.api.deps.body_schema` as routes are declared."""


def ref(model: type[BaseModel]) -> dict[str, str]:
    """A ``$ref`` to ``model``'s schema among the document's components."""
    return {"$ref": REF_TEMPLATE.format(model=model.__name__)}


def component_schemas(models: list[tuple[type[BaseModel], JsonSchemaMode]]) -> dict[str, Any]:
    """``components/schemas`` entries of ``models`` and every model they nest, by class name.

    :param models: each model, and whether it is read (``validation``: a body) or written (``serialization``).
    :raises ValueError: two different models share a name (one ``$ref`` would name both).
    """
    _, top = models_json_schema(models, ref_template=REF_TEMPLATE)
    schemas: dict[str, Any] = top.get("$defs", {})
    names = [m.__name__ for m, _ in models]
    if len(set(names)) != len(names):
        raise ValueError(f"two models share a name among {sorted(names)}")
    return schemas


def install(app: FastAPI) -> None:
    """Build ``app``'s document with the problem and body schemas among its components.

    :raises ValueError: when the document is first built, a schema added here differs from one FastAPI
        put there under the same name.
    """
    build: Callable[[], dict[str, Any]] = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        document = build()  # FastAPI's, cached on the app: completed in place, once
        schemas = document.setdefault("components", {}).setdefault("schemas", {})
        for name, schema in component_schemas(
            [(Problem, "serialization"), *((m, "validation") for m in BODY_MODELS.values())]
        ).items():
            if schemas.setdefault(name, schema) != schema:
                raise ValueError(f"two schemas are named {name} in the OpenAPI document")
        return document

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented way to change the document
