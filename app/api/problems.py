"""One exception hierarchy for API errors, rendered as RFC 9457 problem+json in one place."""

from __future__ import annotations

from collections.abc import Mapping
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DataError
from starlette.exceptions import HTTPException as StarletteHTTPException

PROBLEM_JSON = "application/problem+json"


class Problem(Exception):
    """An error answer: HTTP status, a fixed `code`, a human sentence, extra members."""

    def __init__(self, status: int, code: str, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail
        self.extra = extra


def not_found(what: str) -> Problem:
    return Problem(404, "not_found", f"{what} not found")


def invalid_state(status: str, detail: str) -> Problem:
    return Problem(409, "invalid_state", detail, turn_status=status)


# HTTP requires these headers with these statuses (RFC 9110 11.6.1 and 15.5.6).
_REQUIRED_HEADERS = {401: {"WWW-Authenticate": "Bearer"}}


def problem_response(
    status: int, code: str, detail: str, headers: Mapping[str, str] | None = None, **extra: Any
) -> JSONResponse:
    body = {
        "type": f"urn:turnrunner:problem:{code}",
        "title": HTTPStatus(status).phrase,
        "status": status,
        "detail": detail,
        "code": code,
        **{k: v for k, v in extra.items() if v is not None},
    }
    return JSONResponse(
        body,
        status_code=status,
        media_type=PROBLEM_JSON,
        headers={**_REQUIRED_HEADERS.get(status, {}), **(headers or {})},
    )


def _field(loc: tuple[Any, ...] | list[Any]) -> str:
    return ".".join(str(p) for p in loc)


def install(app: FastAPI) -> None:
    """Map every error the app can raise to problem+json; nothing internal leaks out."""

    @app.exception_handler(Problem)
    async def _problem(_: Request, exc: Problem) -> JSONResponse:
        return problem_response(exc.status, exc.code, exc.detail, **exc.extra)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [
            {"field": _field(e.get("loc", ())), "message": str(e.get("msg", "invalid"))}
            for e in exc.errors()
        ]
        first = errors[0] if errors else {"field": "body", "message": "invalid"}
        return problem_response(
            422, "validation_error", f"{first['field']}: {first['message']}", errors=errors
        )

    @app.exception_handler(DataError)
    async def _unstorable(_: Request, exc: DataError) -> JSONResponse:
        # The database refused a value the request carried, such as a NUL character, which
        # PostgreSQL text and JSON cannot hold: the request is at fault, not the service.
        return problem_response(
            422,
            "validation_error",
            "a value in the request cannot be stored (for example a NUL character in a string)",
            errors=[{"field": "request", "message": "value cannot be stored"}],
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400:
            # Starlette's answer to a body it cannot even decode (e.g. not UTF-8): to a client
            # that is the same mistake as malformed JSON.
            return problem_response(
                422,
                "validation_error",
                "body: not valid UTF-8 JSON",
                errors=[{"field": "body", "message": "not valid UTF-8 JSON"}],
            )
        code = {
            404: "not_found",
            401: "unauthorized",
            403: "forbidden",
            413: "payload_too_large",
            405: "method_not_allowed",
        }.get(exc.status_code, "error")
        detail = exc.detail if isinstance(exc.detail, str) else HTTPStatus(exc.status_code).phrase
        return problem_response(exc.status_code, code, detail, headers=exc.headers)  # Allow

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        import logging

        logging.getLogger("turnrunner.api").exception("unhandled error")
        return problem_response(500, "internal", "internal error")
