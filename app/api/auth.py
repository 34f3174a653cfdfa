"""Bearer-token roles: client tokens for everything but admin routes, admin tokens for all."""

from __future__ import annotations

import hmac
from enum import StrEnum
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from app.api.problems import Problem
from app.settings import Settings

_bearer = HTTPBearer(auto_error=False, description="Client or admin token.")


class Role(StrEnum):
    CLIENT = "client"
    ADMIN = "admin"


def _matches(token: str, tokens: frozenset[str]) -> bool:
    # Compare against every token in constant time so timing tells nothing.
    found = False
    for t in tokens:
        found |= hmac.compare_digest(token.encode(), t.encode())
    return found


def role_of(settings: Settings, token: str | None) -> Role | None:
    """The role a token grants; with no tokens configured the service is open (loopback only)."""
    if not settings.auth_enabled:
        return Role.ADMIN
    if token and _matches(token, settings.admin_token_set):
        return Role.ADMIN
    if token and _matches(token, settings.client_token_set):
        return Role.CLIENT
    return None


def request_role(request: Request) -> Role | None:
    """The role of the request's bearer token, read from its header."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    bearer = token.strip() if scheme.lower() == "bearer" else None
    return role_of(request.app.state.settings, bearer)


def current_role(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Role:
    role = role_of(request.app.state.settings, credentials.credentials if credentials else None)
    if role is None:
        raise Problem(401, "unauthorized", "a valid bearer token is required")
    return role


def require_admin(role: Annotated[Role, Depends(current_role)]) -> Role:
    if role is not Role.ADMIN:
        raise Problem(403, "forbidden", "this operation needs an admin token")
    return role


ClientAuth = Depends(current_role)
AdminAuth = Depends(require_admin)
