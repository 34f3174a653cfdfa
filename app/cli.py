"""`turnrunner serve | api | worker | migrate | openapi | fake-llm | prune`."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from pathlib import Path

from app import logs
from app.settings import Settings, get_settings, is_loopback

log = logging.getLogger("turnrunner")


def _check_exposure(settings: Settings, host: str) -> None:
    """Open (no tokens) only on loopback; anywhere else, refuse to start."""
    if settings.auth_enabled:
        return
    if not is_loopback(host):
        sys.exit(f"refusing to bind {host} without TURNRUNNER_API_TOKENS/TURNRUNNER_ADMIN_TOKENS")
    log.warning("no tokens configured: the API is open to anyone on this machine")


def _serve_http(settings: Settings, host: str, port: int, run_worker: bool) -> None:
    import uvicorn

    from app.main import create_app

    _check_exposure(settings, host)
    app = create_app(settings, run_worker=run_worker)
    uvicorn.run(app, host=host, port=port, log_config=None, access_log=False)


def cmd_serve(args: argparse.Namespace, settings: Settings) -> None:
    from app.store.db import Database
    from app.store.migrate import upgrade

    db = Database(settings.database_url)
    upgrade(db)
    if settings.register_demo_agent and not args.no_demo:
        from app.demo import DEMO_AGENT
        from app.store import agents

        with db.transaction() as session:
            latest = agents.get(session, DEMO_AGENT.name)
            spec = DEMO_AGENT.model_dump(mode="json")
            if latest is None or latest["spec"] != spec:
                agents.create_version(session, DEMO_AGENT.name, spec)
    db.dispose()
    _serve_http(settings, args.host or settings.host, args.port or settings.port, True)


def cmd_api(args: argparse.Namespace, settings: Settings) -> None:
    _serve_http(settings, args.host or settings.host, args.port or settings.port, False)


def cmd_worker(args: argparse.Namespace, settings: Settings) -> None:
    from app import metrics
    from app.runner.worker import Worker
    from app.store.db import Database

    metrics.init_label_sets(runner=True)
    metrics_port = args.metrics_port or settings.metrics_port
    if metrics_port:
        from prometheus_client import start_http_server

        start_http_server(metrics_port, addr=args.metrics_host or settings.metrics_host)

    async def main() -> None:
        db = Database(settings.database_url)
        worker = Worker(db, settings, concurrency=args.concurrency)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, worker.stop)
        try:
            await worker.run()
        finally:
            db.dispose()

    asyncio.run(main())


def cmd_migrate(_: argparse.Namespace, settings: Settings) -> None:
    from app.store.db import Database
    from app.store.migrate import upgrade

    db = Database(settings.database_url)
    upgrade(db)
    db.dispose()
    log.info("database migrated")


def openapi_document(settings: Settings) -> str:
    from app.main import create_app

    return json.dumps(create_app(settings).openapi(), indent=2, sort_keys=True) + "\n"


def cmd_openapi(args: argparse.Namespace, settings: Settings) -> None:
    text = openapi_document(settings)
    if args.output:
        Path(args.output).write_text(text)
    else:
        sys.stdout.write(text)


def cmd_fake_llm(args: argparse.Namespace, settings: Settings) -> None:
    from app.models.fake_llm import serve

    serve(args.host or settings.fake_llm_host, args.port or settings.fake_llm_port)


def cmd_prune(args: argparse.Namespace, settings: Settings) -> None:
    from app.store.db import Database
    from app.store.prune import parse_duration, prune

    try:
        older_than = parse_duration(args.older_than)
    except ValueError as e:
        sys.exit(f"turnrunner prune: {e}")
    db = Database(settings.database_url)
    removed = prune(db, older_than, batch=args.batch)
    db.dispose()
    log.info("pruned terminal turns", extra={"turns": removed})


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="turnrunner", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    def http(p: argparse.ArgumentParser) -> None:
        p.add_argument("--host", help="bind address (TURNRUNNER_HOST)")
        p.add_argument("--port", type=int, help="port (TURNRUNNER_PORT)")

    p = sub.add_parser("serve", help="API and an in-process worker (embedded SQLite by default)")
    http(p)
    p.add_argument("--no-demo", action="store_true", help="do not register the demo agent")
    p.set_defaults(func=cmd_serve)
    p = sub.add_parser("api", help="the HTTP API only")
    http(p)
    p.set_defaults(func=cmd_api)
    p = sub.add_parser("worker", help="the runner only")
    p.add_argument(
        "--concurrency", type=int, help="turns run at once (TURNRUNNER_WORKER_CONCURRENCY)"
    )
    p.add_argument(
        "--metrics-port", type=int, help="serve /metrics on this port (TURNRUNNER_METRICS_PORT)"
    )
    p.add_argument(
        "--metrics-host",
        help="bind address for /metrics (TURNRUNNER_METRICS_HOST, default 127.0.0.1)",
    )
    p.set_defaults(func=cmd_worker)
    p = sub.add_parser("migrate", help="apply database migrations")
    p.set_defaults(func=cmd_migrate)
    p = sub.add_parser("openapi", help="write the OpenAPI document")
    p.add_argument("--output", help="file to write (default: stdout)")
    p.set_defaults(func=cmd_openapi)
    p = sub.add_parser("fake-llm", help="the OpenAI-compatible fake model server")
    p.add_argument("--host", help="bind address (TURNRUNNER_FAKE_LLM_HOST, default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (TURNRUNNER_FAKE_LLM_PORT, default 8080)")
    p.set_defaults(func=cmd_fake_llm)
    p = sub.add_parser("prune", help="delete terminal turns older than a duration")
    p.add_argument("--older-than", required=True, help="e.g. 30d, 12h, 90m")
    p.add_argument("--batch", type=int, default=500, help="turns deleted per transaction")
    p.set_defaults(func=cmd_prune)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    settings = get_settings()
    logs.configure(settings.log_level)
    args.func(args, settings)


if __name__ == "__main__":
    main()
