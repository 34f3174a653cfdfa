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
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
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


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on at the moment of asking."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def start_tool_server(timeout_s: float = 15.0) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """Run the tool server in a subprocess; yield (base URL, process) once it answers."""
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
            _wait_until_up(base_url, proc, timeout_s, log)
            yield base_url, proc
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _wait_until_up(
    base_url: str, proc: subprocess.Popen[bytes], timeout_s: float, log: Any
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log.seek(0)
            output = log.read().decode(errors="replace")
            raise RuntimeError(f"tool server exited with {proc.returncode}:\n{output}")
        try:
            if httpx.get(f"{base_url}/healthz", timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"tool server did not answer within {timeout_s} s")


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
