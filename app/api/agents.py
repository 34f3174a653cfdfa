"""Agents: create (or add a version), get, list."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request

from app.api import views
from app.api.auth import AdminAuth, ClientAuth
from app.api.deps import db_of
from app.api.problems import not_found
from app.api.schemas import MAX_INT32, Agent, AgentList
from app.domain.agent import AgentSpec
from app.store import agents as store

router = APIRouter(prefix="/v1/agents", tags=["agents"])


@router.post("", status_code=201, response_model=Agent, dependencies=[AdminAuth])
def create_agent(body: AgentSpec, request: Request) -> dict[str, Any]:
    """Create an agent, or add a new version when the name exists (admin)."""
    with db_of(request).transaction() as session:
        row = store.create_version(session, body.name, body.model_dump(mode="json"))
    return views.agent(row)


@router.get("", response_model=AgentList, dependencies=[ClientAuth])
def list_agents(request: Request) -> dict[str, Any]:
    """The latest version of each agent."""
    with db_of(request).transaction() as session:
        return {"items": [views.agent(r) for r in store.list_latest(session)]}


@router.get("/{name}", response_model=Agent, dependencies=[ClientAuth])
def get_agent(
    name: str,
    request: Request,
    version: Annotated[int | None, Query(ge=1, le=MAX_INT32)] = None,
) -> dict[str, Any]:
    """The latest version of an agent, or the one asked for."""
    with db_of(request).transaction() as session:
        row = store.get(session, name, version)
    if row is None:
        raise not_found(f"agent {name!r}" + (f" version {version}" if version else ""))
    return views.agent(row)


def get_spec(session: Any, name: str, version: int | None) -> tuple[AgentSpec, int]:
    """An agent's spec and version, or 404."""
    row = store.get(session, name, version)
    if row is None:
        raise not_found(f"agent {name!r}" + (f" version {version}" if version else ""))
    return AgentSpec.model_validate(row["spec"]), row["version"]
