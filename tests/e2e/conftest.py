"""End-to-end fixtures: real `turnrunner api` / `worker` / `serve` processes over real HTTP.

- `stack`: an API process and a worker process shared by the whole session, on a PostgreSQL
  database of their own (so `postgres_url` truncations elsewhere never touch it). Tests stay
  apart by using their own agent and model names; turns a test leaves unfinished are cancelled
  when it ends.
- `launch`: start processes of one's own (api, workers with their own settings, serve) on an
  empty database, for tests that kill, stop or race workers.
- `fake`: the session's fake OpenAI server (the `fake_llm` fixture) with its control API.
- `tool_server`: the real HTTP tool server (tests/toolserver.py); tests tell their requests
  apart by X-Turn-Id, so it is never reset.
- `model`: a model name of the test's own.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import free_port, fresh_postgres, run_process, wait_http
from tests.helpers import TERMINAL
from tests.toolserver import start_tool_server

# Fast polling for every process these tests start; the rest comes from each test.
BASE_ENV = {
    "TURNRUNNER_POLL_INTERVAL_MS": "50",
    "TURNRUNNER_CANCEL_POLL_INTERVAL_MS": "50",
    "TURNRUNNER_REGISTER_DEMO_AGENT": "false",
    "TURNRUNNER_LOG_LEVEL": "INFO",
}


# ---- clients of the processes ----------------------------------------------------------------


class Api:
    """An httpx client on a turnrunner API process, with the calls the tests make."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.http = httpx.Client(base_url=base_url, timeout=30.0)
        self.created: list[str] = []

    def close(self) -> None:
        self.http.close()

    # agents and turns

    def create_agent(
        self,
        name: str,
        model: dict[str, Any],
        *,
        tools: list[dict[str, Any]] | None = None,
        policy: dict[str, Any] | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"name": name, "model": model, "tools": tools or [], **extra}
        if policy is not None:
            body["execution_policy"] = policy
        r = self.http.post("/v1/agents", json=body)
        assert r.status_code == 201, r.text
        return r.json()  # type: ignore[no-any-return]

    def create_turn(self, agent: str, input_: str = "hi", **extra: Any) -> dict[str, Any]:
        r = self.http.post("/v1/turns", json={"agent": agent, "input": input_, **extra})
        assert r.status_code == 201, r.text
        turn: dict[str, Any] = r.json()
        self.created.append(turn["id"])
        return turn

    def turn(self, turn_id: str) -> dict[str, Any]:
        r = self.http.get(f"/v1/turns/{turn_id}")
        assert r.status_code == 200, r.text
        return r.json()  # type: ignore[no-any-return]

    def messages(self, turn_id: str) -> list[dict[str, Any]]:
        r = self.http.get(f"/v1/turns/{turn_id}/messages")
        assert r.status_code == 200, r.text
        return r.json()["items"]  # type: ignore[no-any-return]

    def events(self, turn_id: str, after: int = 0) -> list[dict[str, Any]]:
        r = self.http.get(f"/v1/turns/{turn_id}/events", params={"after": after})
        assert r.status_code == 200, r.text
        return r.json()["items"]  # type: ignore[no-any-return]

    def command(
        self, turn_id: str, name: str, body: dict[str, Any] | None = None, expect: int = 202
    ) -> dict[str, Any]:
        r = self.http.post(f"/v1/turns/{turn_id}/{name}", json=body)
        assert r.status_code == expect, r.text
        return r.json()  # type: ignore[no-any-return]

    # waiting: long-poll on the turn's version, never sleep-and-hope

    def wait(
        self,
        turn_id: str,
        pred: Callable[[dict[str, Any]], bool],
        timeout_s: float = 30.0,
        what: str = "the condition",
    ) -> dict[str, Any]:
        """Long-poll the turn until `pred(turn)` holds; fail with its last state otherwise."""
        deadline = time.monotonic() + timeout_s
        turn = self.turn(turn_id)
        while not pred(turn):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(
                    f"turn {turn_id} never reached {what} in {timeout_s} s; last: {turn}"
                )
            r = self.http.get(
                f"/v1/turns/{turn_id}",
                params={
                    "wait_ms": int(min(left, 5.0) * 1000) + 1,
                    "after_version": turn["version"],
                },
            )
            assert r.status_code == 200, r.text
            turn = r.json()
        return turn

    def wait_status(
        self, turn_id: str, statuses: str | set[str], timeout_s: float = 30.0
    ) -> dict[str, Any]:
        wanted = {statuses} if isinstance(statuses, str) else statuses
        return self.wait(turn_id, lambda t: t["status"] in wanted, timeout_s, str(sorted(wanted)))

    def wait_terminal(self, turn_id: str, timeout_s: float = 30.0) -> dict[str, Any]:
        return self.wait_status(turn_id, TERMINAL, timeout_s)

    def cancel_unfinished(self) -> None:
        """Cancel what this client created and left running (hygiene for a shared worker)."""
        for turn_id in self.created:
            with contextlib.suppress(httpx.HTTPError):
                self.http.post(f"/v1/turns/{turn_id}/cancel", json={"reason": "test ended"})
        self.created.clear()


@dataclass
class FakeLLM:
    """The fake OpenAI server: its /v1 base URL and its /_control API."""

    base_url: str
    control: httpx.Client

    def spec(self, model: str, **extra: Any) -> dict[str, Any]:
        """A ModelSpec for `model` on the fake server."""
        return {"provider": "openai", "model": model, "base_url": self.base_url, **extra}

    def script(self, model: str, *replies: dict[str, Any]) -> None:
        r = self.control.put(f"/_control/models/{model}", json={"replies": list(replies)})
        assert r.status_code == 200, r.text

    def faults(self, model: str, *faults: dict[str, Any]) -> None:
        r = self.control.put(f"/_control/models/{model}/faults", json={"faults": list(faults)})
        assert r.status_code == 200, r.text

    def reset(self, model: str) -> None:
        assert self.control.delete(f"/_control/models/{model}").status_code == 204

    def requests(self, model: str) -> int:
        r = self.control.get(f"/_control/models/{model}")
        assert r.status_code == 200, r.text
        return int(r.json()["requests"])


@dataclass
class ToolServer:
    base_url: str
    http: httpx.Client

    def url(self, path: str) -> str:
        return self.base_url + path

    def requests(self, turn_id: str | None = None) -> list[dict[str, Any]]:
        r = self.http.get("/requests")
        assert r.status_code == 200
        items: list[dict[str, Any]] = r.json()
        return [x for x in items if turn_id is None or x["turn_id"] == turn_id]


# ---- session-wide services ---------------------------------------------------------------------


@pytest.fixture(scope="session")
def fake(fake_llm: str) -> Iterator[FakeLLM]:
    root = fake_llm.removesuffix("/v1")
    with httpx.Client(base_url=root, timeout=10.0) as control:
        yield FakeLLM(fake_llm, control)


@pytest.fixture
def model() -> str:
    """A model name of the test's own: the fake server keys all its state by it."""
    return f"e2e-{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session")
def tool_server() -> Iterator[ToolServer]:
    with (
        start_tool_server() as (base_url, _proc),
        httpx.Client(base_url=base_url, timeout=10.0) as http,
    ):
        yield ToolServer(base_url, http)


@pytest.fixture(scope="session")
def own_database() -> Iterator[str]:
    """A migrated PostgreSQL database for the shared stack alone, dropped at the end."""
    with fresh_postgres("turnrunner_e2e") as url:
        yield url


# ---- processes ---------------------------------------------------------------------------------


@dataclass
class WorkerProcess:
    proc: subprocess.Popen[bytes]
    metrics_url: str
    log: Path

    def wait_ready(self) -> None:
        try:
            wait_http(self.metrics_url, proc=self.proc)
        except Exception:
            print(self.log.read_text(errors="replace")[-4000:])
            raise

    def metric(self, name: str, **labels: str) -> float:
        """One sample of the worker's Prometheus metrics (0 when absent)."""
        want = ",".join(f'{k}="{v}"' for k, v in labels.items())  # in definition order
        text = httpx.get(self.metrics_url, timeout=10.0).text
        for line in text.splitlines():
            key, _, value = line.rpartition(" ")
            if key == (f"{name}{{{want}}}" if want else name):
                return float(value)
        return 0.0


@dataclass
class Launcher:
    """Starts turnrunner processes for one test; everything is stopped when the test ends."""

    db_url: str
    log_dir: Path
    stack: contextlib.ExitStack
    logs: list[Path] = field(default_factory=list)

    def env(self, **overrides: str) -> dict[str, str]:
        return {**BASE_ENV, "TURNRUNNER_DATABASE_URL": self.db_url, **overrides}

    def _log(self, name: str) -> Path:
        path = self.log_dir / f"{name}.log"
        self.logs.append(path)
        return path

    def api(self, name: str = "api", **env: str) -> Api:
        port = free_port()
        self.stack.enter_context(
            run_process(
                ["api", "--port", str(port)],
                self.env(**env),
                self._log(name),
                f"http://127.0.0.1:{port}/healthz",
            )
        )
        api = Api(f"http://127.0.0.1:{port}")
        self.stack.callback(api.close)
        return api

    def serve(self, name: str = "serve", **env: str) -> Api:
        """`turnrunner serve` (API and worker in one process) on this launcher's database."""
        port = free_port()
        self.stack.enter_context(
            run_process(
                ["serve", "--port", str(port)],
                self.env(**env),
                self._log(name),
                f"http://127.0.0.1:{port}/readyz",
            )
        )
        api = Api(f"http://127.0.0.1:{port}")
        self.stack.callback(api.close)
        return api

    def worker(
        self, name: str = "worker", *args: str, wait: bool = True, **env: str
    ) -> WorkerProcess:
        """A worker process; with `wait`, returns once its metrics endpoint answers."""
        port = free_port()
        log = self._log(name)
        proc = self.stack.enter_context(
            run_process(
                ["worker", "--metrics-port", str(port), "--metrics-host", "127.0.0.1", *args],
                self.env(**env),
                log,
            )
        )
        worker = WorkerProcess(proc, f"http://127.0.0.1:{port}/metrics", log)
        if wait:
            worker.wait_ready()
        return worker

    def dump_logs(self) -> None:
        for path in self.logs:
            if path.exists():
                print(f"----- {path.name} (tail) -----")
                print(path.read_text(errors="replace")[-6000:])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)


def _failed(request: pytest.FixtureRequest) -> bool:
    report = getattr(request.node, "rep_call", None)
    return report is not None and report.failed


@pytest.fixture
def launch(postgres_url: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Launcher]:
    """Processes of the test's own on an empty migrated PostgreSQL database."""
    with contextlib.ExitStack() as stack:
        launcher = Launcher(postgres_url, tmp_path, stack)
        try:
            yield launcher
        finally:
            if _failed(request):
                launcher.dump_logs()


@dataclass
class Shared:
    launcher: Launcher
    api_url: str


@pytest.fixture(scope="session")
def shared(own_database: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shared]:
    """One API process and one worker process for the whole session."""
    with contextlib.ExitStack() as stack:
        launcher = Launcher(own_database, tmp_path_factory.mktemp("shared-stack"), stack)
        # The lease is generous: nothing kills these processes, and a loaded machine must not
        # make a heartbeat late enough to lose one.
        launcher.worker("worker", "--concurrency", "64", TURNRUNNER_LEASE_TTL_MS="20000")
        api = launcher.api("api")
        yield Shared(launcher, api.base_url)


@pytest.fixture
def stack(shared: Shared, request: pytest.FixtureRequest) -> Iterator[Api]:
    """A client of the shared API + worker processes; the test's unfinished turns are
    cancelled when it ends."""
    api = Api(shared.api_url)
    try:
        yield api
    finally:
        api.cancel_unfinished()
        api.close()
        if _failed(request):
            shared.launcher.dump_logs()
