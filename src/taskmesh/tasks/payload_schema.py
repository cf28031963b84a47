"""A payload checked against the JSON Schema another instance advertises for its handler's payload type.

An instance (or a client) without a task name's handler cannot run the handler's own check
(pydantic, :meth:`~taskmesh.tasks.registry.Handler.payload_errors`); it checks the payload against the
JSON Schema pydantic made of the handler's type where the handler is registered
(``workers.handler_options``, see ``advertised.py``), with the ``jsonschema`` library.

This check never refuses what the handler's own check accepts. Pydantic converts JSON in its lax
mode (``"42"`` or ``42.0`` for an integer, ``1`` or ``"yes"`` for a boolean, a number of seconds
for a date-time), so ``type`` is checked the same lax way, and the keywords pydantic applies after
a conversion or otherwise than JSON Schema (``enum``, ``const``, ``pattern``, ``format``,
``multipleOf``, ``not``, ``if``, ``oneOf`` read as ``anyOf`` ...) are not checked here. What it
refuses for sure: a missing required field, an unknown field where the type forbids them, a value
of the wrong kind (text for a list), a number or length outside its bounds. A payload it lets
through and the handler refuses fails its run, not retried, as before.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import SchemaError, ValidationError
from jsonschema.protocols import Validator

from taskmesh.errors import InvalidTaskError

_KINDS = {
    "integer": "integer",
    "number": "number",
    "string": "string",
    "boolean": "boolean",
    "array": "list",
    "object": "dictionary",
    "null": "null",
}
"""JSON Schema types as pydantic names them in its messages (``Input should be a valid integer``)."""
_TRUTHS = {"0", "off", "f", "false", "n", "no", "1", "on", "t", "true", "y", "yes"}
"""The strings pydantic's lax mode reads as a boolean (any case)."""
_NOT_CHECKED = (
    "enum",
    "const",
    "pattern",
    "format",
    "multipleOf",
    "uniqueItems",
    "not",
    "if",
    "then",
    "else",
    "propertyNames",
    "patternProperties",
    "dependentSchemas",
    "dependentRequired",
    "contains",
    "unevaluatedProperties",
    "unevaluatedItems",
)
"""Keywords pydantic checks after a lax conversion, or otherwise: not checked here (see the module docs)."""


def _number_text(value: str) -> float | None:
    try:
        number = float(value.strip())
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def _fits(kind: str, value: Any, schema: dict[str, Any]) -> bool:
    """Whether pydantic's lax mode could read ``value`` (decoded JSON) as JSON Schema type ``kind``."""
    if kind in ("integer", "number"):
        if isinstance(value, bool | int):
            return True
        if isinstance(value, float):
            return kind == "number" or value.is_integer()
        number = _number_text(value) if isinstance(value, str) else None
        return number is not None and (kind == "number" or number.is_integer())
    if kind == "boolean":
        if isinstance(value, bool):
            return True
        if isinstance(value, int | float):
            return value in (0, 1)
        return isinstance(value, str) and value.strip().lower() in _TRUTHS
    if kind == "string":
        # Dates, times and durations take a number of seconds too.
        return isinstance(value, str) or ("format" in schema and isinstance(value, int | float))
    if kind == "array":
        return isinstance(value, list)
    if kind == "object":
        return isinstance(value, dict)
    return kind != "null" or value is None


def _lax_type(validator: Validator, types: Any, instance: Any, schema: dict[str, Any]) -> Iterator[ValidationError]:
    kinds = [types] if isinstance(types, str) else list(types)
    if not any(_fits(k, instance, schema) for k in kinds):
        yield ValidationError(f"Input should be a valid {_KINDS.get(kinds[0], kinds[0])}")


def _unchecked(validator: Validator, value: Any, instance: Any, schema: dict[str, Any]) -> None:
    return None


LaxValidator = validators.extend(  # type: ignore[no-untyped-call]  # its stubs leave extend untyped
    Draft202012Validator,
    {
        "type": _lax_type,
        "oneOf": Draft202012Validator.VALIDATORS["anyOf"],  # lax types may fit two branches
        **dict.fromkeys(_NOT_CHECKED, _unchecked),
    },
)
"""Draft 2020-12 (what pydantic writes) with the lax ``type`` and without the keywords above."""


class PayloadSchema:
    """A handler's advertised payload schema, ready to check payloads.

    :param schema: the JSON Schema (pydantic's ``TypeAdapter.json_schema()`` of the payload type).
    :raises ValueError: it is not a valid JSON Schema.
    """

    def __init__(self, schema: dict[str, Any]) -> None:
        try:
            LaxValidator.check_schema(schema)
        except SchemaError as exc:
            raise ValueError(f"not a JSON Schema: {exc.message}") from None
        self._validator = LaxValidator(schema)

    def errors(self, payload: Any) -> list[tuple[str, str]]:
        """Why ``payload`` does not fit: ``(path, message)`` pairs under ``payload``, in the registry's
        words (``payload.customer_id: Field required``); empty when it fits."""
        found: dict[tuple[str, str], None] = {}
        for error in sorted(self._validator.iter_errors(payload), key=lambda e: [str(p) for p in e.absolute_path]):
            where = ".".join(["payload", *(str(p) for p in error.absolute_path)])
            if error.validator == "required" and isinstance(error.instance, dict):
                for name in error.validator_value:
                    if name not in error.instance:
                        found[f"{where}.{name}", "Field required"] = None
            elif error.validator == "additionalProperties" and isinstance(error.instance, dict):
                known = error.schema.get("properties", {}) if isinstance(error.schema, dict) else {}
                for name in sorted(set(error.instance) - set(known)):
                    found[f"{where}.{name}", "Extra inputs are not permitted"] = None
            else:
                found[where, error.message] = None
        return list(found)

    def check(self, payload: Any) -> None:
        """Refuse a payload that does not fit.

        :raises InvalidTaskError: naming the first field (``payload.customer_id: Field required``); every
            refusal in ``errors``.
        """
        errors = self.errors(payload)
        if errors:
            raise InvalidTaskError(errors[0][0], errors[0][1], errors)
