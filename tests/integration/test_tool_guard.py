"""`http` tools never reach link-local or metadata addresses, nor hosts off the allowlist."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import api_client
from tests.helpers import create_agent, create_turn, events, scripted, wait_status


def _http_tool(url: str) -> dict[str, Any]:
    return {
        "name": "fetch",
        "description": "fetch",
        "kind": "http",
        "url": url,
        "parameters": {"type": "object"},
    }


def _run(client: Any, url: str) -> dict[str, Any]:
    create_agent(
        client,
        "fetcher",
        scripted(
            {"tool_calls": [{"name": "fetch", "arguments": {}}]},
            {"content": "done"},
        ),
        tools=[_http_tool(url)],
    )
    turn = create_turn(client, "fetcher")
    return wait_status(client, turn["id"], "FAILED")


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/latest/meta-data/",
        "http://[fe80::1]:8080/",
        "http://100.100.100.200/",
    ],
)
def test_metadata_and_link_local_addresses_are_refused(client: Any, url: str) -> None:
    done = _run(client, url)
    assert done["last_error"]["error_class"] == "tool_failed"
    assert done["last_error"]["message"] == "destination not allowed"
    attempt = next(e for e in events(client, done["id"]) if e["type"] == "tool_attempt")
    assert attempt["data"]["error_class"] == "tool_failed"
    assert "169.254" not in str(done) and "fe80" not in str(done)


def test_a_host_off_the_allowlist_is_refused(db_url: str) -> None:
    with api_client(db_url, http_tool_allowlist="tools.internal") as client:
        done = _run(client, "http://127.0.0.1:9/")
    assert done["last_error"]["error_class"] == "tool_failed"
    assert done["last_error"]["message"] == "destination not allowed"


def test_without_an_allowlist_a_loopback_tool_is_tried(client: Any) -> None:
    # The same URL off any allowlist is called: the refusal above came from the guard.
    done = _run(client, "http://127.0.0.1:9/")
    assert done["last_error"]["error_class"] == "tool_unavailable"
