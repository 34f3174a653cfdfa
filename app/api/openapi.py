"""The OpenAPI document: FastAPI's, with every problem+json answer documented in one place."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

PROBLEM_SCHEMA: dict[str, Any] = {
    "title": "Problem",
    "description": "RFC 9457 problem details; `code` is one of the fixed codes of the API.",
    "type": "object",
    "required": ["type", "title", "status", "detail", "code"],
    "properties": {
        "type": {"type": "string"},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string"},
        "code": {"type": "string"},
        "turn_status": {"type": "string"},
        "next_runnable_at": {"type": "string", "format": "date-time"},
        "errors": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"field": {"type": "string"}, "message": {"type": "string"}},
            },
        },
    },
    "additionalProperties": True,
}

_WHY = {
    401: "No valid bearer token.",
    403: "The token's role may not do this.",
    404: "No such resource.",
    405: "Method not allowed.",
    409: "The turn's state does not allow this (see `code`).",
    413: "Request body too large.",
    422: "Invalid request (see `errors`).",
    500: "Internal error (never with details).",
}


def _statuses(path: str, method: str) -> list[int]:
    if not path.startswith("/v1/"):
        return [405, 500]
    found = [401, 403, 405, 413, 422, 500]
    if "{" in path or method == "post":
        found.append(404)
    if method == "post" and path.startswith("/v1/turns"):
        found.append(409)
    return sorted(found)


def _problem(status: int) -> dict[str, Any]:
    return {
        "description": _WHY[status],
        "content": {
            "application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}
        },
    }


def install(app: FastAPI) -> None:
    """Replace FastAPI's default 422 body with problem+json and document every error answer."""

    def build() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        doc = get_openapi(
            title=app.title,
            version=app.version,
            summary=app.summary,
            description=app.description,
            routes=app.routes,
        )
        schemas = doc.setdefault("components", {}).setdefault("schemas", {})
        schemas.pop("HTTPValidationError", None)
        schemas.pop("ValidationError", None)
        schemas["Problem"] = PROBLEM_SCHEMA
        for path, operations in doc.get("paths", {}).items():
            for method, op in operations.items():
                responses = op.setdefault("responses", {})
                for status in _statuses(path, method):
                    responses[str(status)] = _problem(status)
                if "503" in responses:
                    responses["503"] = {
                        **_problem(500),
                        "description": responses["503"].get("description", "Not ready."),
                    }
        app.openapi_schema = doc
        return doc

    app.openapi = build  # type: ignore[method-assign]
