"""A small real HTTP tool server for tests, and a helper that runs it as a subprocess.

Run alone: `python tests/toolserver.py PORT`. Endpoints (POST unless noted; every request but
GET /requests, GET /healthz and POST /reset is recorded):
- `/echo`: answers the body's arguments and the Idempotency-Key / X-Turn-Id it received.
- `/status/{code}?retry_after=S`: answers `code`, with Retry-After when given.
- `/slow?ms=N`: sleeps N ms, then answers like /echo.
- `/flaky?failures=N&status=503`: answers `status` to the first N requests of each
  Idempotency-Key, then like /echo (for retry tests).
- `/text`: answers the arguments' "text" as text/plain.
- `/redirect`: a 302 to /echo (a tool executor must not follow it).
- GET `/requests`: the recorded requests, oldest first. POST `/reset`: forget them.
- GET `/healthz`: the server is up.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse, RedirectResponse

app = FastAPI(title="turnrunner test tool server")
_recorded: list[dict[str, Any]] = []
_attempts: Counter[str] = Counter()


async def _record(request: Request) -> dict[str, Any]:
    """Remember the request; return its JSON body ({} when it has none or it is not JSON)."""
    try:
        body = await request.json()
    except ValueError:
        body = None
    entry = {
        "method": request.method,
        "path": request.url.path,
        "query": str(request.url.query),
        "idempotency_key": request.headers.get("idempotency-key"),
        "turn_id": request.headers.get("x-turn-id"),
        "body": body,
    }
    _recorded.append(entry)
    return body if isinstance(body, dict) else {}


def _echo(body: dict[str, Any], request: Request) -> dict[str, Any]:
    return {
        "arguments": body.get("arguments"),
        "turn_id": body.get("turn_id"),
        "tool_call_id": body.get("tool_call_id"),
        "idempotency_key": request.headers.get("idempotency-key"),
        "x_turn_id": request.headers.get("x-turn-id"),
    }


@app.post("/echo")
async def echo(request: Request) -> dict[str, Any]:
    return _echo(await _record(request), request)


@app.post("/status/{code}")
async def status(code: int, request: Request, retry_after: str | None = None) -> Response:
    await _record(request)
    headers = {"Retry-After": retry_after} if retry_after is not None else {}
    return JSONResponse({"error": f"status {code} on request"}, status_code=code, headers=headers)


@app.post("/slow")
async def slow(request: Request, ms: int = 1000) -> dict[str, Any]:
    body = await _record(request)
    await asyncio.sleep(ms / 1000)
    return _echo(body, request)


@app.post("/flaky")
async def flaky(request: Request, failures: int = 1, status: int = 503) -> Response:
    body = await _record(request)
    key = request.headers.get("idempotency-key") or ""
    _attempts[key] += 1
    if _attempts[key] <= failures:
        return JSONResponse({"error": "flaky"}, status_code=status)
    return JSONResponse(_echo(body, request))


@app.post("/text")
async def text(request: Request) -> PlainTextResponse:
    body = await _record(request)
    return PlainTextResponse(str((body.get("arguments") or {}).get("text", "")))


@app.post("/redirect")
async def redirect(request: Request) -> RedirectResponse:
    await _record(request)
    return RedirectResponse("/echo", status_code=302)


@app.get("/requests")
async def requests() -> list[dict[str, Any]]:
    return _recorded


@app.post("/reset", status_code=204)
async def reset() -> None:
    _recorded.clear()
    _attempts.clear()


@app.get("/healthz")
async def healthz() -> dict[str, bool]:
    return {"ok": True}


@contextmanager
def start_tool_server(timeout_s: float = 15.0) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """Run the tool server in a subprocess; yield (base URL, process) once it answers."""
    # Imported here: the child runs this file as a script, without the tests package.
    from tests.processes import stop_process, wait_http

    # The parent binds the socket and hands it over: no window in which another process
    # could take a port that was only probed free.
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    port = listener.getsockname()[1]
    base_url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--fd", str(listener.fileno())],
            pass_fds=(listener.fileno(),),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        listener.close()
        try:
            try:
                wait_http(f"{base_url}/healthz", timeout_s, proc)
            except (RuntimeError, TimeoutError) as e:
                log.seek(0)
                raise RuntimeError(f"{e}:\n{log.read().decode(errors='replace')}") from None
            yield base_url, proc
        finally:
            stop_process(proc, timeout_s=10)


def main(argv: list[str]) -> None:
    """`PORT` binds 127.0.0.1:PORT; `--fd N` serves a listening socket inherited from the parent."""
    options: dict[str, Any] = {
        "log_level": "warning",
        "access_log": False,
        "timeout_graceful_shutdown": 1,
    }
    if len(argv) == 2 and argv[0] == "--fd":
        server = uvicorn.Server(uvicorn.Config(app, **options))
        asyncio.run(server.serve(sockets=[socket.socket(fileno=int(argv[1]))]))
    elif len(argv) == 1:
        uvicorn.run(app, host="127.0.0.1", port=int(argv[0]), **options)
    else:
        raise SystemExit("usage: toolserver.py PORT | toolserver.py --fd N")


if __name__ == "__main__":
    main(sys.argv[1:])
