"""Demo traffic for the compose stack, so the dashboard has something to show.

Creates an agent on the fake model server (a calculator round, then an answer), injects a share
of 429s and 503s there so retries show up, parks a turn now and then on a 401 and cancels one
now and then. Sends DEMO_TURNS turns (default 600), one per DEMO_INTERVAL_S (default 1), then
stops. Runs with the turnrunner image's Python: `python /demo_traffic.py`."""

from __future__ import annotations

import itertools
import os
import time

import httpx

from app.tools.builtins import builtin_tool_spec

API = os.environ.get("DEMO_API_URL", "http://api:8000")
FAKE_LLM = os.environ.get("DEMO_FAKE_LLM_URL", "http://fake-llm:8080")
HEADERS = {"Authorization": f"Bearer {os.environ.get('DEMO_ADMIN_TOKEN', 'dev-admin-token')}"}
TURNS = int(os.environ.get("DEMO_TURNS", "600"))
INTERVAL_S = float(os.environ.get("DEMO_INTERVAL_S", "1"))

CALCULATOR = builtin_tool_spec("calculator")


def agent(client: httpx.Client, name: str, model: str) -> None:
    client.post(
        f"{API}/v1/agents",
        headers=HEADERS,
        json={
            "name": name,
            "model": {
                "provider": "openai",
                "model": model,
                "base_url": f"{FAKE_LLM}/v1",
                "timeout_ms": 10_000,
            },
            "system_prompt": "You are the turnrunner demo.",
            "tools": [CALCULATOR],
            "execution_policy": {
                "max_iterations": 8,
                "retry": {
                    "max_retries": 3,
                    "initial_delay_ms": 500,
                    "multiplier": 2.0,
                    "jitter": 0.2,
                },
            },
        },
    ).raise_for_status()


def main() -> None:
    with httpx.Client(timeout=10) as client:
        for _ in range(120):
            try:
                if client.get(f"{API}/readyz").is_success:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        agent(client, "demo-flaky", "demo-flaky")
        agent(client, "demo-broken-key", "demo-broken-key")
        # A fifth of the calls fail transiently: retries, retry lag, errors by class.
        client.put(
            f"{FAKE_LLM}/_control/models/demo-flaky/faults",
            json={"faults": [], "fault_rate": 0.2, "fault_status": 503, "seed": 7},
        )
        client.put(
            f"{FAKE_LLM}/_control/models/demo-broken-key/faults",
            json={"faults": [], "fault_rate": 1.0, "fault_status": 401},
        )
        for n in itertools.islice(itertools.count(1), TURNS):
            name = "demo-broken-key" if n % 20 == 0 else "demo-flaky"
            r = client.post(
                f"{API}/v1/turns",
                headers=HEADERS,
                json={"agent": name, "input": f"What is {n} times 7?"},
            )
            if r.is_success and n % 15 == 0:
                client.post(
                    f"{API}/v1/turns/{r.json()['id']}/cancel",
                    headers=HEADERS,
                    json={"reason": "demo cancel"},
                )
            time.sleep(INTERVAL_S)


if __name__ == "__main__":
    main()
