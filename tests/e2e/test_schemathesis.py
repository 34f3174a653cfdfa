"""Schemathesis against the committed spec (openapi/openapi.json) on a live `turnrunner api`.

The spec is the contract clients generate code from, so it is checked against what the running
server answers: no 5xx, every status code documented, every response in a documented media type
and valid against its schema. Bounded: a fixed seed and at most MAX_EXAMPLES cases per operation
in each phase (examples, coverage, fuzzing, stateful), about half a minute in all.

The server runs without a worker, so nothing a generated agent names (model base URLs, http tool
URLs) is ever called: generated turns stay where the API puts them. Tokens are configured, so the
coverage phase also sends requests without a valid token (401s), and the run is repeated with a
client token, which admin-only operations refuse (403s): those answers must be documented too.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, free_port, run_process

SPEC = REPO / "openapi" / "openapi.json"
SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")
MAX_EXAMPLES = 50
SEED = 20251130  # fixed, so a failure reproduces; change it to explore further
TIMEOUT_S = 300
CHECKS = (
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_schema_conformance",
)
TOKENS = {"admin": "schemathesis-admin-token", "client": "schemathesis-client-token"}
# With a client token, only the operations that hold admin-only parts (creating agents, the due
# list, `force` in retry and CONTINUE in resume) are run again; the rest answer as for an admin.
CLIENT_PATHS = r"^/v1/(agents|admin/turns/due|turns/\{turn_id\}/(retry|resume))$"
# GET /v1/turns/{id}?wait_ms=N long-polls up to 60 s on a turn that exists (the stateful phase
# finds real ones); a fixed short wait keeps the run bounded and still takes that path.
CONFIG = """
[parameters]
"query.wait_ms" = 100
"""


def _summary(output: str, limit: int = 12_000) -> str:
    """The failures of a run, readable: section headers, check names, statuses, bodies, curl."""
    keep = re.compile(
        r"^(_{3,} .* _{3,}|\d+\. Test Case ID|- ST\d+|\s+(Received|Documented|"
        r"Expected|Invalid component|- violates)|\[\d{3}\]|\s+`\{|\s+curl )"
    )
    lines = [line[:400] for line in output.splitlines() if keep.match(line)]
    tail = output[output.rfind("SUMMARY") :] if "SUMMARY" in output else output[-3000:]
    text = "\n".join(lines)
    if len(text) > limit:
        text = text[:limit] + "\n... (cut)"
    return f"{text}\n\n{tail[:4000]}"


@pytest.mark.parametrize("role", ["admin", "client"])
def test_live_api_conforms_to_committed_spec(role: str, postgres_url: str, tmp_path: Path) -> None:
    if not SCHEMATHESIS.exists():
        pytest.skip(f"schemathesis is not installed in this environment ({SCHEMATHESIS})")
    port = free_port()
    env = {
        "TURNRUNNER_DATABASE_URL": postgres_url,
        "TURNRUNNER_REGISTER_DEMO_AGENT": "false",
        "TURNRUNNER_API_TOKENS": TOKENS["client"],
        "TURNRUNNER_ADMIN_TOKENS": TOKENS["admin"],
        "TURNRUNNER_LOG_LEVEL": "WARNING",
    }
    base = f"http://127.0.0.1:{port}"
    with run_process(["api", "--port", str(port)], env, tmp_path / "api.log", f"{base}/healthz"):
        # Run in tmp_path: no schemathesis.toml or .hypothesis/ of the work tree is read or written.
        config = tmp_path / "schemathesis.toml"
        config.write_text(CONFIG)
        result = subprocess.run(
            [
                str(SCHEMATHESIS), "--config-file", str(config), "run", str(SPEC),
                "--url", base,
                "--header", f"Authorization: Bearer {TOKENS[role]}",
                "--checks", ",".join(CHECKS),
                "--phases", "examples,coverage,fuzzing,stateful",
                "--max-examples", str(MAX_EXAMPLES),
                "--seed", str(SEED),
                "--generation-database", "none",
                "--request-timeout", "20",
                "--workers", "1",
                "--no-color",
                *(["--include-path-regex", CLIENT_PATHS] if role == "client" else []),
            ],
            cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT_S, check=False,
        )  # fmt: skip
    output = result.stdout + result.stderr
    (tmp_path / "schemathesis.txt").write_text(output)
    assert "Tested: 0" not in output, output[-3000:]
    assert result.returncode == 0, (
        f"schemathesis ({role} token) found the live API and {SPEC.relative_to(REPO)} disagreeing "
        f"(exit {result.returncode}; full output in {tmp_path / 'schemathesis.txt'}):\n"
        + _summary(output)
    )
