"""A change to one turn: column values, appended messages and events, built without I/O.

Every status change goes through `TurnUpdate.move`, which checks the move against the one
transition table and records it in the event log. The runner and the API both build these; the
store applies them (fenced by a lease token or a version)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from app.domain.status import TurnEvent, TurnStatus, next_status
from app.domain.transcript import Message


@dataclass
class TurnUpdate:
    status: TurnStatus
    values: dict[str, Any] = field(default_factory=dict)
    messages: list[Message] = field(default_factory=list)
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    # Inbox rows (queued user messages) this update delivers into the transcript.
    delivered_inbox: list[int] = field(default_factory=list)
    # Give up the worker's claim with this write (parked, finished, or handed back).
    release_lease: bool = False
    # Counters to add to, not overwrite: a command may bump the same counter meanwhile.
    increments: dict[str, int] = field(default_factory=dict)
    # What to write instead when user messages are queued for the turn at commit time: a turn
    # does not finish or park over a message it accepted (the store decides, under the row
    # lock, so no message can slip in between).
    if_inbox: TurnUpdate | None = None
    # The status moves made, (from, to, by), for what the store does once they commit.
    moves: list[tuple[TurnStatus, TurnStatus, TurnEvent]] = field(default_factory=list)

    def move(self, event: TurnEvent, reason: str | None = None) -> TurnStatus:
        """Change status by `event` (IllegalTransition if the table refuses) and log it."""
        before = self.status
        after = next_status(before, event)
        self.status = after
        self.values["status"] = after.value
        self.values["status_reason"] = reason
        if after.is_terminal:
            self.values["finished_at"] = datetime.now(UTC)
            self.release_lease = True
        # Columns that only mean something in one status are cleared on leaving it (and only
        # then: a step's RUNNING -> RUNNING move writes nothing more).
        if before is TurnStatus.RETRY_SCHEDULED and after is not before:
            self.values["next_runnable_at"] = None
        if before is TurnStatus.WAITING_FOR_TOOL and after is not before:
            self.values["pending_tool_calls"] = []
        self.moves.append((before, after, event))
        self.event(
            "status_changed",
            {"from": before.value, "to": after.value, "event": event.value, "reason": reason},
        )
        return after

    def add(self, counter: str, n: int = 1) -> None:
        """Add `n` to a counter column of the turn."""
        self.increments[counter] = self.increments.get(counter, 0) + n

    def fork(self) -> TurnUpdate:
        """A copy to build an alternative on (see `if_inbox`)."""
        return TurnUpdate(
            self.status,
            values=dict(self.values),
            messages=list(self.messages),
            events=list(self.events),
            delivered_inbox=list(self.delivered_inbox),
            release_lease=self.release_lease,
            increments=dict(self.increments),
            moves=list(self.moves),
        )

    def event(self, type_: str, data: dict[str, Any]) -> None:
        self.events.append((type_, data))

    def message(self, message: Message) -> None:
        self.messages.append(message)
