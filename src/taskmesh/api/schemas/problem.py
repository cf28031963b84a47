"""The one error shape of the API: an RFC 9457 problem (``application/problem+json``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class FieldError(BaseModel):
    """One refused field or parameter of a request."""

    field: str = Field(examples=["priority"])
    message: str = Field(examples=["must be between 0 and 1000"])


class Problem(BaseModel):
    """An error answer (RFC 9457). Some carry more members: ``scope`` (403), ``quota`` and ``tenant_id``
    (a tenant's quota), ``policy`` (429), ``results`` (an atomic batch refused whole)."""

    model_config = ConfigDict(extra="allow")

    type: str = Field(examples=["about:blank"])
    title: str = Field(examples=["Invalid request"])
    status: int = Field(examples=[422])
    detail: str = Field(examples=["priority: must be between 0 and 1000"])
    errors: list[FieldError] | None = Field(default=None, description="Each refused field (422, some 400 and 403).")
