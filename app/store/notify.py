"""What happens once a transaction commits: wake-up hints, and the finished-turn metric.

Hints are NOTIFY on PostgreSQL plus in-process subscribers (API and worker in one process under
`serve`). A hint only: workers poll anyway, so a lost one costs latency, not work."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import event, func, select, text
from sqlalchemy.orm import Session

from app import metrics

WAKE = "turnrunner_wake"  # a turn became runnable
CANCEL = "turnrunner_cancel"  # payload: the turn id whose cancel was requested
CHANGED = "turnrunner_changed"  # payload: the turn id that changed (long-poll, SSE)

Subscriber = Callable[[str, str], None]
_subscribers: list[Subscriber] = []


def subscribe_local(callback: Subscriber) -> Callable[[], None]:
    """Call `callback(channel, payload)` after each commit that notified; returns unsubscribe."""
    _subscribers.append(callback)
    return lambda: _subscribers.remove(callback) if callback in _subscribers else None


def notify(session: Session, channel: str, payload: str = "") -> None:
    """Send a hint when the session's transaction commits."""
    if session.bind is not None and session.bind.dialect.name == "postgresql":
        session.execute(select(func.pg_notify(channel, payload)))
    session.info.setdefault("turnrunner_notify", []).append((channel, payload))


def notify_many(session: Session, channel: str, payloads: list[str]) -> None:
    """One hint per payload, in a single statement (a batch of steps notifies once)."""
    if not payloads:
        return
    if session.bind is not None and session.bind.dialect.name == "postgresql":
        session.execute(
            text("SELECT pg_notify(:channel, p) FROM unnest(CAST(:payloads AS text[])) AS p"),
            {"channel": channel, "payloads": payloads},
        )
    session.info.setdefault("turnrunner_notify", []).extend((channel, p) for p in payloads)


@event.listens_for(Session, "after_commit")
def _after_commit(session: Session) -> None:
    for agent, status in session.info.pop("turnrunner_finished", []):
        metrics.turns_finished.labels(agent, status).inc()
    for lag in session.info.pop("turnrunner_retry_lag", []):
        metrics.retry_lag.observe(lag)
    for channel, payload in session.info.pop("turnrunner_notify", []):
        for callback in list(_subscribers):
            callback(channel, payload)


@event.listens_for(Session, "after_rollback")
def _after_rollback(session: Session) -> None:
    session.info.pop("turnrunner_notify", None)
    session.info.pop("turnrunner_finished", None)
    session.info.pop("turnrunner_retry_lag", None)
