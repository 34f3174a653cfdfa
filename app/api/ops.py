"""Operations: health, readiness, Prometheus metrics, and the operator's view of due retries."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text
from starlette.concurrency import run_in_threadpool

from app.api import views
from app.api.auth import AdminAuth
from app.api.deps import db_of
from app.api.problems import problem_response
from app.api.schemas import DueTurns
from app.store import claims
from app.store.migrate import is_current

router = APIRouter(tags=["operations"])


@router.get("/healthz", include_in_schema=True)
def healthz() -> dict[str, str]:
    """The process is alive."""
    return {"status": "ok"}


@router.get("/readyz", responses={503: {"description": "database unreachable or not migrated"}})
async def readyz(request: Request) -> Any:
    """The database is reachable and migrated."""
    db = db_of(request)

    def check() -> bool:
        with db.engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        return is_current(db)

    try:
        migrated = await run_in_threadpool(check)
    except Exception:
        return problem_response(503, "not_ready", "database unreachable")
    if not migrated:
        return problem_response(503, "not_ready", "database not migrated")
    return {"status": "ready"}


@router.get("/metrics", response_class=Response)
def metrics_endpoint() -> Response:
    """Prometheus text format."""
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)


@router.get(
    "/v1/admin/turns/due", response_model=DueTurns, dependencies=[AdminAuth], tags=["admin"]
)
def due_turns(
    request: Request, limit: Annotated[int, Query(ge=1, le=1000)] = 100
) -> dict[str, Any]:
    """RETRY_SCHEDULED turns whose time has come (for an operator's own scheduler) (admin)."""
    with db_of(request).transaction() as session:
        return {"items": [views.turn(r) for r in claims.due_retries(session, limit)]}
