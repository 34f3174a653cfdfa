"""The command line as a contract: exposure refusal, migrate, prune, openapi."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import httpx

from tests.conftest import REPO, TURNRUNNER, free_port, run_process


def _run(
    args: list[str], env: dict[str, str], timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*TURNRUNNER, *args],
        env={**os.environ, **env},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_api_refuses_a_public_address_without_tokens(tmp_path: Path) -> None:
    env = {
        "TURNRUNNER_DATABASE_URL": f"sqlite:///{tmp_path}/t.db",
        "TURNRUNNER_API_TOKENS": "",
        "TURNRUNNER_ADMIN_TOKENS": "",
    }
    done = _run(["api", "--host", "0.0.0.0", "--port", str(free_port())], env)
    assert done.returncode != 0
    assert "refusing to bind 0.0.0.0" in done.stderr


def test_api_serves_a_public_address_with_tokens(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/t.db"
    assert _run(["migrate"], {"TURNRUNNER_DATABASE_URL": url}).returncode == 0
    port = free_port()
    env = {
        "TURNRUNNER_DATABASE_URL": url,
        "TURNRUNNER_API_TOKENS": "c-secret",
        "TURNRUNNER_ADMIN_TOKENS": "a-secret",
    }
    log = tmp_path / "api.log"
    with run_process(
        ["api", "--host", "0.0.0.0", "--port", str(port)],
        env,
        log,
        f"http://127.0.0.1:{port}/healthz",
    ):
        assert httpx.get(f"http://127.0.0.1:{port}/v1/turns").status_code == 401
        ok = httpx.get(
            f"http://127.0.0.1:{port}/v1/turns", headers={"Authorization": "Bearer c-secret"}
        )
        assert ok.status_code == 200
    assert "c-secret" not in log.read_text() and "a-secret" not in log.read_text()


def test_migrate_then_prune_and_openapi(tmp_path: Path) -> None:
    env = {"TURNRUNNER_DATABASE_URL": f"sqlite:///{tmp_path}/t.db"}
    assert _run(["migrate"], env).returncode == 0
    pruned = _run(["prune", "--older-than", "30d"], env)
    assert pruned.returncode == 0, pruned.stderr
    bad = _run(["prune", "--older-than", "soon"], env)
    assert bad.returncode != 0 and "not a duration" in bad.stderr
    assert "Traceback" not in bad.stderr
    spec = _run(["openapi"], env)
    assert json.loads(spec.stdout)["info"]["title"] == "turnrunner"
