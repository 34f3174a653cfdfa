"""The committed OpenAPI document is the one the app serves."""

from __future__ import annotations

import json
from pathlib import Path

from app.cli import openapi_document
from app.settings import Settings

SPEC = Path(__file__).resolve().parents[2] / "openapi" / "openapi.json"


def test_committed_spec_matches_the_app() -> None:
    current = openapi_document(Settings(database_url="sqlite://"))
    assert SPEC.read_text() == current, (
        "openapi/openapi.json is stale: run `turnrunner openapi --output openapi/openapi.json`"
    )


def test_spec_names_every_route_of_the_contract() -> None:
    paths = set(json.loads(SPEC.read_text())["paths"])
    for path in (
        "/v1/agents",
        "/v1/agents/{name}",
        "/v1/turns",
        "/v1/turns/{turn_id}",
        "/v1/turns/{turn_id}/messages",
        "/v1/turns/{turn_id}/events",
        "/v1/turns/{turn_id}/resume",
        "/v1/turns/{turn_id}/retry",
        "/v1/turns/{turn_id}/retry-model",
        "/v1/turns/{turn_id}/tool-results",
        "/v1/turns/{turn_id}/cancel",
        "/v1/admin/turns/due",
        "/metrics",
        "/healthz",
        "/readyz",
    ):
        assert path in paths, path
