"""Agents: create (or add a version), get, list."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request

from app.api import views
from app.api.auth import AdminAuth, ClientAuth
from app.api.deps import db_of
from app.api.problems import Problem, not_found
from app.api.schemas import MAX_INT32, Agent, AgentList
from app.domain.agent import AgentSpec, ToolKind
from app.store import agents as store
from app.tools.registry import builtin_names, get_builtin

router = APIRouter(prefix="/v1/agents", tags=["agents"])


def _check_builtins(spec: AgentSpec) -> None:
    """Every `builtin` tool names a builtin this service has registered, or 422."""
    errors = [
        {"field": f"body.tools.{i}.builtin", "message": f"no builtin tool named {t.builtin!r}"}
        for i, t in enumerate(spec.tools)
        if t.kind is ToolKind.BUILTIN and t.builtin and get_builtin(t.builtin) is None
    ]
    if errors:
        known = ", ".join(builtin_names())
        raise Problem(
            422,
            "validation_error",
            f"{errors[0]['field']}: {errors[0]['message']} (registered: {known})",
            errors=errors,
        )


@router.post("", status_code=201, response_model=Agent, dependencies=[AdminAuth])
def create_agent(body: AgentSpec, request: Request) -> dict[str, Any]:
    """Create an agent, or add a new version when the name exists (admin). A `builtin` tool
    must name a builtin registered with the service."""
    _check_builtins(body)
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
        return views.agent(_get_or_404(session, name, version))


def get_spec(session: Any, name: str, version: int | None) -> tuple[AgentSpec, int]:
    """An agent's spec and version, or 404."""
    row = _get_or_404(session, name, version)
    return AgentSpec.model_validate(row["spec"]), row["version"]


def _get_or_404(session: Any, name: str, version: int | None) -> dict[str, Any]:
    row = store.get(session, name, version)
    if row is None:
        raise not_found(f"agent {name!r}" + (f" version {version}" if version else ""))
    return row
