"""The check by an advertised payload schema never refuses what the handler's own (pydantic, lax) check accepts,
and refuses what is surely wrong with the handler's own words."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any, Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from taskmesh.errors import InvalidTaskError
from taskmesh.tasks.payload_schema import PayloadSchema


class Line(BaseModel):
    sku: str = Field(min_length=1)
    qty: int = Field(ge=1)


class Order(BaseModel):
    model_config = ConfigDict(extra="forbid")

    customer_id: int
    when: datetime | None = None
    kind: Literal["a", "b"] = "a"
    lines: list[Line] = []
    paid: bool = False
    total: Decimal = Decimal(0)
    ratio: float = 0.0
    tags: dict[str, int] = {}


@dataclass
class Ping:
    host: str
    port: int = 80


TAKEN = [
    {"customer_id": 1},
    {"customer_id": "42"},
    {"customer_id": 42.0},
    {"customer_id": True},
    {"customer_id": 1, "when": 1_700_000_000},
    {"customer_id": 1, "when": "2026-01-01T00:00:00Z"},
    {"customer_id": 1, "paid": "yes", "ratio": "0.5", "total": "12.30"},
    {"customer_id": 1, "paid": 1, "total": 3},
    {"customer_id": 1, "lines": [{"sku": "a", "qty": "2"}], "tags": {"x": "3"}},
]


@pytest.mark.parametrize("payload", TAKEN)
def test_what_pydantic_takes_the_schema_takes(payload: dict[str, Any]) -> None:
    TypeAdapter(Order).validate_python(payload)  # the handler's own check takes it
    assert PayloadSchema(TypeAdapter(Order).json_schema()).errors(payload) == []


REFUSED = [
    ({}, ("payload.customer_id", "Field required")),
    ({"customer_id": 1, "format": "pdf"}, ("payload.format", "Extra inputs are not permitted")),
    ({"customer_id": "q4"}, ("payload.customer_id", "Input should be a valid integer")),
    ({"customer_id": 1, "lines": [{"qty": 1}]}, ("payload.lines.0.sku", "Field required")),
    ({"customer_id": 1, "lines": "a"}, ("payload.lines", "Input should be a valid list")),
    ("text", ("payload", "Input should be a valid dictionary")),
]


@pytest.mark.parametrize(("payload", "first"), REFUSED)
def test_what_is_surely_wrong_is_refused_naming_the_field(payload: Any, first: tuple[str, str]) -> None:
    with pytest.raises(ValidationError):
        TypeAdapter(Order).validate_python(payload)
    with pytest.raises(InvalidTaskError) as caught:
        PayloadSchema(TypeAdapter(Order).json_schema()).check(payload)
    assert (caught.value.field, caught.value.message) == first


def test_a_dataclass_payload_and_a_schema_that_is_none() -> None:
    schema = PayloadSchema(TypeAdapter(Ping).json_schema())
    assert schema.errors({"host": "h", "port": "8080"}) == []
    assert schema.errors({"port": 1}) == [("payload.host", "Field required")]
    with pytest.raises(ValueError, match="not a JSON Schema"):
        PayloadSchema({"type": 12})
