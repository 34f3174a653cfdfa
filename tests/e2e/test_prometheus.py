"""The Grafana dashboard and the alert rules, proven against a real Prometheus.

A real `prometheus` scrapes a real `turnrunner api` and `turnrunner worker` (on PostgreSQL) while
they run a workload with faults injected by the fake model server. Then every query of the
dashboard and of deploy/prometheus/alerts.yml is evaluated through Prometheus's HTTP API: each
must be valid PromQL and must return data. An expression that names a metric the service does
not export, or gets a suffix or a label wrong, returns nothing, and the test names it.

Needs the `prometheus` and `promtool` binaries (Debian package `prometheus`; .ci/run installs it);
without them those tests are skipped, saying so.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.conftest import REPO, free_port, run_process, stop_process, wait_http
from tests.e2e.conftest import Api, FakeLLM, Launcher
from tests.helpers import CALCULATOR

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None,
    reason="promtool not on PATH (Debian package `prometheus`; .ci/run installs it)",
)
needs_prometheus = pytest.mark.skipif(
    PROMETHEUS is None or PROMTOOL is None,
    reason="prometheus/promtool not on PATH (Debian package `prometheus`; .ci/run installs it)",
)

PROM_DIR = REPO / "deploy" / "prometheus"
ALERTS = PROM_DIR / "alerts.yml"
ALERTS_TEST = PROM_DIR / "alerts.test.yml"
DASHBOARD = REPO / "deploy" / "grafana" / "dashboards" / "turnrunner.json"
DATASOURCES = REPO / "deploy" / "grafana" / "provisioning" / "datasources" / "prometheus.yml"

# Grafana's built-in variables, as Grafana would expand them for a short time range.
GRAFANA_VARIABLES = {
    "$__rate_interval": "1m",
    "${__rate_interval}": "1m",
    "$__interval": "15s",
    "${__interval}": "15s",
    "$__range": "5m",
    "${__range}": "5m",
}
LEFTOVER_VARIABLE = re.compile(r"\$\{?[A-Za-z_]\w*")
POLICY = {"retry": {"max_retries": 3, "initial_delay_ms": 100, "multiplier": 2.0}}


# ---- the expressions ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Query:
    name: str
    expr: str
    must_return_data: bool = True


@dataclass(frozen=True)
class Alert:
    name: str
    expr: str
    query: str  # the part left of the final `>`
    threshold: float


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))  # panels inside a collapsed row


def _expand(expr: str) -> str:
    for name in sorted(GRAFANA_VARIABLES, key=len, reverse=True):
        expr = expr.replace(name, GRAFANA_VARIABLES[name])
    return expr


def dashboard_queries() -> list[Query]:
    """Every target of every panel of the dashboard, Grafana variables expanded."""
    dashboard = json.loads(DASHBOARD.read_text())
    queries = []
    for panel in _panels(dashboard["panels"]):
        if panel.get("type") == "row":
            continue
        for target in panel.get("targets") or []:
            name = f"panel {panel.get('title')!r} target {target.get('refId')}"
            queries.append(Query(name, _expand(target.get("expr") or "")))
    return queries


def alert_rules() -> list[Alert]:
    """Every alerting rule, its expr split at the final `>` (the convention atop alerts.yml)."""
    alerts = []
    for group in yaml.safe_load(ALERTS.read_text())["groups"]:
        for rule in group["rules"]:
            if "alert" not in rule:
                continue
            query, _, threshold = rule["expr"].rpartition(">")
            try:
                value = float(threshold)
            except ValueError:
                value = float("nan")
            alerts.append(Alert(rule["alert"], rule["expr"], query.strip(), value))
    return alerts


def recording_rules() -> list[Query]:
    return [
        Query(f"recording rule {rule['record']}", rule["expr"])
        for group in yaml.safe_load(ALERTS.read_text())["groups"]
        for rule in group["rules"]
        if "record" in rule
    ]


def all_queries() -> list[Query]:
    """What the proof evaluates: dashboard targets, recording rules, and for each alert its
    query part (must return data) and its full expression (valid; empty unless it would fire)."""
    queries = [*dashboard_queries(), *recording_rules()]
    for alert in alert_rules():
        queries.append(Query(f"alert {alert.name} (query left of `>`)", alert.query))
        queries.append(Query(f"alert {alert.name} (full expr)", alert.expr, must_return_data=False))
    return queries


# ---- static checks (no Prometheus needed) ------------------------------------------------------


def test_dashboard_and_alerts_follow_their_conventions() -> None:
    datasource_uids = {d["uid"] for d in yaml.safe_load(DATASOURCES.read_text())["datasources"]}
    problems = []
    dashboard = json.loads(DASHBOARD.read_text())
    for panel in _panels(dashboard["panels"]):
        if panel.get("type") == "row":
            continue
        title = panel.get("title")
        targets = panel.get("targets") or []
        if not targets:
            problems.append(f"panel {title!r} has no targets")
        for source in [panel.get("datasource"), *(t.get("datasource") for t in targets)]:
            if source is not None and source.get("uid") not in datasource_uids:
                problems.append(
                    f"panel {title!r} uses datasource {source} (provisioned: "
                    f"{sorted(datasource_uids)})"
                )
        for target in targets:
            if not target.get("expr"):
                problems.append(f"panel {title!r} target {target.get('refId')} has no expr")
    for query in dashboard_queries():
        if LEFTOVER_VARIABLE.search(query.expr):
            problems.append(f"{query.name}: unknown Grafana variable left in {query.expr!r}")
    alerts = alert_rules()
    if not alerts:
        problems.append(f"no alerting rules in {ALERTS}")
    raw = {
        r["alert"]: r
        for g in yaml.safe_load(ALERTS.read_text())["groups"]
        for r in g["rules"]
        if "alert" in r
    }
    for alert in alerts:
        rule = raw[alert.name]
        if alert.expr.count(">") != 1 or alert.threshold != alert.threshold:  # NaN: not a number
            problems.append(
                f"alert {alert.name}: expr is not `<query> > <number>` with a single "
                f"`>`: {alert.expr!r}"
            )
        if "for" not in rule or not rule.get("labels", {}).get("severity"):
            problems.append(f"alert {alert.name}: needs `for` and a severity label")
        if not {"summary", "description"} <= set(rule.get("annotations", {})):
            problems.append(f"alert {alert.name}: needs summary and description annotations")
    assert not problems, "\n".join(problems)


@needs_promtool
def test_promtool_accepts_config_and_rules(tmp_path: Path) -> None:
    assert PROMTOOL is not None
    # A copy, so the relative rule_files path resolves and nothing is written into the work tree.
    for name in ("prometheus.yml", "alerts.yml"):
        shutil.copy(PROM_DIR / name, tmp_path / name)
    commands = [
        [PROMTOOL, "check", "config", str(tmp_path / "prometheus.yml")],
        [PROMTOOL, "check", "rules", str(ALERTS)],
    ]
    if ALERTS_TEST.exists():
        commands.append([PROMTOOL, "test", "rules", str(ALERTS_TEST)])
    for command in commands:
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=60, cwd=PROM_DIR, check=False
        )
        assert result.returncode == 0, (
            f"{' '.join(command[1:])} failed:\n{result.stdout}\n{result.stderr}"
        )


# ---- the live proof -----------------------------------------------------------------------------


class Prometheus:
    """A client of the test's Prometheus server."""

    def __init__(self, base_url: str) -> None:
        self.http = httpx.Client(base_url=base_url, timeout=15.0)

    def query(self, expr: str) -> dict[str, Any]:
        r = self.http.get("/api/v1/query", params={"query": expr})
        body: dict[str, Any] = r.json()
        return body

    def value(self, expr: str) -> float | None:
        """The value of a single-series answer, else None (no data, or an error)."""
        body = self.query(expr)
        result = body.get("data", {}).get("result") if body.get("status") == "success" else None
        return float(result[0]["value"][1]) if result else None

    def wait(self, what: str, ok: Callable[[], bool], timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not ok():
            if time.monotonic() > deadline:
                raise AssertionError(f"Prometheus never showed {what} in {timeout_s} s")
            time.sleep(0.25)


@contextlib.contextmanager
def run_prometheus(tmp_path: Path, targets: dict[str, str]) -> Iterator[Prometheus]:
    """The real prometheus binary: 1 s scrapes of `targets` (job -> host:port), the repo's
    alerts.yml as its rules, storage in tmp_path, on a free loopback port."""
    assert PROMETHEUS is not None and PROMTOOL is not None
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(ALERTS)],
        "scrape_configs": [
            {"job_name": job, "metrics_path": "/metrics", "static_configs": [{"targets": [target]}]}
            for job, target in targets.items()
        ],
    }
    config_path = tmp_path / "prometheus-test.yml"
    config_path.write_text(json.dumps(config, indent=2))  # JSON is YAML
    check = subprocess.run(
        [PROMTOOL, "check", "config", str(config_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    port = free_port()
    log_path = tmp_path / "prometheus.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={config_path}",
             f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path,
        )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    prom = Prometheus(base)
    try:
        try:
            wait_http(f"{base}/-/ready", timeout_s=30.0, proc=proc)
        except Exception:
            print(log_path.read_text(errors="replace")[-4000:])
            raise
        yield prom
    finally:
        prom.http.close()
        stop_process(proc)


def _start_worker(launch: Launcher) -> str:
    """A worker with its /metrics on a port we know; returns host:port."""
    port = free_port()
    log_path = launch.log_dir / "worker.log"
    launch.logs.append(log_path)
    proc = launch.stack.enter_context(run_process(
        ["worker", "--metrics-port", str(port), "--metrics-host", "127.0.0.1",
         "--concurrency", "8"],
        launch.env(), log_path))  # fmt: skip
    wait_http(f"http://127.0.0.1:{port}/metrics", proc=proc)
    return f"127.0.0.1:{port}"


def _workload(api: Api, fake: FakeLLM, model: str) -> dict[str, float]:
    """Turns that complete with a calculator call, retry on 429 + Retry-After, park in
    WAITING_FOR_MODEL on 401, get cancelled, and refused commands. Returns, per metric family,
    the least total Prometheus must come to show."""
    ok, limited, denied = f"{model}-ok", f"{model}-429", f"{model}-401"
    fake.faults(limited, {"status": 429, "count": 2, "retry_after_ms": 1000})
    fake.faults(denied, {"status": 401, "count": 1000})
    api.create_agent(ok, fake.spec(ok), tools=[CALCULATOR], policy=POLICY)
    api.create_agent(limited, fake.spec(limited), policy=POLICY)
    api.create_agent(denied, fake.spec(denied), policy=POLICY)

    completing = [api.create_turn(ok, f"what is 6*7? ({i})")["id"] for i in range(3)]
    retried = api.create_turn(limited, "go")["id"]
    parked, cancelled = (api.create_turn(denied, "go")["id"] for _ in range(2))

    for turn_id in completing:
        done = api.wait_terminal(turn_id)
        assert done["status"] == "COMPLETED", done
        assert done["counters"]["tool_calls"] == 1, done
    done = api.wait_terminal(retried)
    assert (done["status"], done["retry_count"]) == ("COMPLETED", 2), done
    for turn_id in (parked, cancelled):
        waiting = api.wait_status(turn_id, "WAITING_FOR_MODEL")
        assert waiting["last_error"]["error_class"] == "auth", waiting
    assert api.command(cancelled, "cancel", {"reason": "metrics proof"})["status"] == "CANCELLED"
    api.command(completing[0], "retry", {}, expect=409)  # turn_finished
    api.command(parked, "retry", {}, expect=409)  # invalid_state

    return {
        "sum(turnrunner_turns_created_total)": 6,
        "sum(turnrunner_turns_finished_total)": 5,  # 4 COMPLETED, 1 CANCELLED
        'sum(turnrunner_errors_total{source="model"})': 4,  # 2 rate_limited, 2 auth
        "sum(turnrunner_retries_scheduled_total)": 2,
        "sum(turnrunner_model_calls_total)": 11,  # 3 x 2, 3 (two 429s), 2 x 1 (401)
        "sum(turnrunner_model_call_duration_seconds_count)": 11,
        'sum(turnrunner_tool_calls_total{tool="calculator"})': 3,
        "sum(turnrunner_tool_call_duration_seconds_count)": 3,
        "sum(turnrunner_tokens_total)": 1,
        'max(turnrunner_turns{status="WAITING_FOR_MODEL"})': 1,  # refreshed every 5 s
        "sum(turnrunner_retry_lag_seconds_count)": 2,
        "sum(turnrunner_commands_total)": 3,  # CANCEL accepted, RETRY refused twice
        'sum(turnrunner_http_requests_total{route="/v1/turns"})': 6,
        "sum(turnrunner_http_request_duration_seconds_count)": 6,
        "sum(turnrunner_steps_committed_total)": 9,
        "sum(turnrunner_step_batch_size_count)": 1,
    }


# What the workload makes true: a turn is parked in WAITING_FOR_MODEL (that alert's condition
# holds; its `for` has not passed), the workers progress, and nothing failed inside.
EXPECTED_CONDITIONS = {
    "TurnrunnerTurnsStuckWaitingForModel": True,
    "TurnrunnerNoWorkerProgress": False,
    "TurnrunnerInternalErrors": False,
    "TurnrunnerHighHTTP5xxRatio": False,
}


@needs_prometheus
def test_every_dashboard_and_alert_query_returns_data(
    launch: Launcher,
    fake: FakeLLM,
    model: str,
    tmp_path: Path,
) -> None:
    api = launch.api("api")
    worker = _start_worker(launch)
    launch.logs.append(tmp_path / "prometheus.log")
    targets = {"turnrunner-api": api.base_url.removeprefix("http://"), "turnrunner-worker": worker}
    with run_prometheus(tmp_path, targets) as prom:
        prom.wait(
            "both targets up",
            lambda: prom.value('count(up{job=~"turnrunner-.*"} == 1)') == 2,
            timeout_s=30,
        )
        minimums = _workload(api, fake, model)

        # Every family has samples in Prometheus (scraped, not just exported) ...
        def shortfall() -> dict[str, float | None]:
            values = {expr: prom.value(expr) for expr in minimums}
            return {e: v for e, v in values.items() if v is None or v < minimums[e]}

        with contextlib.suppress(AssertionError):
            prom.wait("every metric family", lambda: not shortfall(), timeout_s=30)
        missing = shortfall()
        assert not missing, "metric families short of the workload (got, wanted): " + ", ".join(
            f"{e} = {v} < {minimums[e]}" for e, v in missing.items()
        )

        # ... then a few more scrapes of both targets, so every rate() has samples after the
        # workload, and a rule evaluation after those.
        after = time.time() + 3
        prom.wait(
            "3 more scrapes of each target",
            lambda: (prom.value('min(timestamp(up{job=~"turnrunner-.*"}))') or 0) > after,
        )
        prom.wait(
            "a rule evaluation after the workload", lambda: _rules_evaluated_since(prom, after)
        )

        failures = []
        for rule in _rules(prom):
            if rule.get("health") != "ok":
                failures.append(
                    f"rule {rule['name']}: Prometheus evaluates it with health "
                    f"{rule.get('health')!r}: {rule.get('lastError')}"
                )
        queries = all_queries()
        assert len(queries) > 10, queries
        for query in queries:
            body = prom.query(query.expr)
            if body.get("status") != "success":
                failures.append(f"{query.name}: invalid: {body.get('error')}\n    {query.expr}")
            elif query.must_return_data and not body["data"]["result"]:
                failures.append(f"{query.name}: no data\n    {query.expr}")
        alerts = {a.name: a for a in alert_rules()}
        for name, holds in EXPECTED_CONDITIONS.items():
            if name not in alerts:
                failures.append(f"alert {name} is no longer in {ALERTS.name}")
                continue
            result = prom.query(alerts[name].expr).get("data", {}).get("result")
            if bool(result) != holds:
                failures.append(
                    f"alert {name}: after the workload its condition should "
                    f"{'hold' if holds else 'not hold'}; got {result}"
                )
        assert not failures, (
            f"{len(failures)} of {len(queries)} expressions or rules failed "
            f"against Prometheus:\n" + "\n".join(failures)
        )


def _rules(prom: Prometheus) -> list[dict[str, Any]]:
    body = prom.http.get("/api/v1/rules").json()
    return [rule for group in body["data"]["groups"] for rule in group["rules"]]


def _rules_evaluated_since(prom: Prometheus, since: float) -> bool:
    rules = _rules(prom)
    if not rules:
        return False
    for rule in rules:
        stamp = rule.get("lastEvaluation", "")
        if not stamp or stamp.startswith("0001-"):
            return False
        # RFC 3339 with nanoseconds: keep microseconds for fromisoformat.
        stamp = re.sub(r"(\.\d{6})\d*", r"\1", stamp).replace("Z", "+00:00")
        if datetime.fromisoformat(stamp).timestamp() < since:
            return False
    return True
