"""Shared route dependencies."""

from __future__ import annotations

from fastapi import Request

from app.settings import Settings
from app.store.db import Database


def db_of(request: Request) -> Database:
    return request.app.state.db  # type: ignore[no-any-return]


def settings_of(request: Request) -> Settings:
    return request.app.state.settings  # type: ignore[no-any-return]
