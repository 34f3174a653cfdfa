"""An unknown error (`internal`) is never retried, whatever `retry_on` says.

There is no real way to produce an unknown error on purpose — by definition — so this test makes
the model provider raise something unexpected; the database and the runner are real."""

from __future__ import annotations

from typing import Any

import pytest

from app.models.base import ModelReply, ModelRequest
from app.models.scripted import ScriptedProvider
from tests.helpers import create_agent, create_turn, events, messages, scripted, wait_status


async def _broken(self: ScriptedProvider, request: ModelRequest) -> ModelReply:
    raise RuntimeError("a bug in a provider")


@pytest.mark.parametrize("retry_on", [None, ["internal", "overloaded"]])
def test_an_unknown_error_fails_the_turn_without_a_retry(
    client: Any, monkeypatch: pytest.MonkeyPatch, retry_on: list[str] | None
) -> None:
    monkeypatch.setattr(ScriptedProvider, "complete", _broken)
    retry: dict[str, Any] = {"max_retries": 3, "initial_delay_ms": 10}
    if retry_on is not None:
        retry["retry_on"] = retry_on
    create_agent(client, "buggy", scripted({"content": "never"}), policy={"retry": retry})
    turn = create_turn(client, "buggy")

    done = wait_status(client, turn["id"], "FAILED")

    assert done["retry_count"] == 0
    assert done["last_error"]["error_class"] == "internal"
    assert done["last_error"]["retryable"] is False
    assert "RuntimeError" in done["last_error"]["message"]
    assert "a bug in a provider" not in str(done)  # the exception text stays in the logs
    assert not [e for e in events(client, turn["id"]) if e["type"] == "retry_scheduled"]
    closing = messages(client, turn["id"])[-1]
    assert closing["role"] == "assistant" and "internal" in closing["content"]
