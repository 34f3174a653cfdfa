"""The `http` tool executor: one guarded POST per tool call, classified (API.md, ToolSpec)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx

from app.domain.agent import ToolSpec
from app.domain.failures import ErrorClass, Failure, FailureError, classify_tool_http
from app.domain.retry_after import parse_retry_after
from app.tools.base import ToolContext
from app.tools.guard import check_url, normalize_host

DEFAULT_MAX_RESPONSE_BYTES = 1_048_576
_ERROR_EXCERPT_BYTES = 2048


class HttpToolExecutor:
    """POSTs `{"turn_id", "tool_call_id", "arguments"}` to an `http` tool's URL."""

    def __init__(
        self,
        client: httpx.AsyncClient | None = None,
        allowlist: frozenset[str] = frozenset(),
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
    ) -> None:
        self._owns_client = client is None
        # No retries in the transport: retrying is the runner's decision (policy, event log).
        # No proxy from the environment: the guard judged the tool's own address, not a proxy's.
        self._client = client or httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(retries=0),
            follow_redirects=False,
            trust_env=False,
        )
        self._allowlist = frozenset(normalize_host(h) for h in allowlist if h.strip())
        self._max_response_bytes = max_response_bytes

    async def execute(self, spec: ToolSpec, arguments: dict[str, Any], ctx: ToolContext) -> str:
        """Call the tool; its 2xx body is the result, anything else raises FailureError."""
        if spec.url is None:
            raise ValueError(f"tool {spec.name} has no url")
        if ctx.timeout_s <= 0:
            raise _failure(ErrorClass.TOOL_TIMEOUT, "no time left for the tool call")
        try:
            # One deadline over resolving, connecting and reading: httpx's timeouts are per
            # operation, so a server dripping bytes could otherwise run far past timeout_s.
            async with asyncio.timeout(ctx.timeout_s):
                await check_url(spec.url, self._allowlist)
                return await self._post(spec.url, arguments, ctx)
        # Chained (`from e`) for the server log; the Failure message itself names no host.
        except (TimeoutError, httpx.TimeoutException) as e:
            raise _failure(ErrorClass.TOOL_TIMEOUT, "tool call timed out") from e
        except httpx.UnsupportedProtocol as e:
            raise _failure(ErrorClass.TOOL_FAILED, "unsupported URL scheme") from e
        except httpx.TransportError as e:
            # Connect, read, write and protocol errors: the tool may be back later.
            raise _failure(ErrorClass.TOOL_UNAVAILABLE, _transport_message(e)) from e
        except httpx.HTTPError as e:  # an invalid URL, an undecodable body: retrying won't help
            raise _failure(ErrorClass.TOOL_FAILED, "tool request failed") from e

    async def _post(self, url: str, arguments: dict[str, Any], ctx: ToolContext) -> str:
        body = {"turn_id": ctx.turn_id, "tool_call_id": ctx.tool_call_id, "arguments": arguments}
        headers = {"Idempotency-Key": ctx.idempotency_key, "X-Turn-Id": ctx.turn_id}
        request = self._client.build_request(
            "POST", url, json=body, headers=headers, timeout=httpx.Timeout(ctx.timeout_s)
        )
        response = await self._client.send(request, stream=True, follow_redirects=False)
        try:
            if not response.is_success:
                raise await _status_failure(response)
            return _result(response, await _read(response, self._max_response_bytes))
        finally:
            await response.aclose()

    async def aclose(self) -> None:
        """Close the HTTP client if this executor created it."""
        if self._owns_client:
            await self._client.aclose()


async def _read(response: httpx.Response, limit: int, truncate: bool = False) -> bytes:
    """At most `limit` bytes of the body; more is an error unless `truncate`."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            if truncate:
                break
            raise _failure(ErrorClass.TOOL_FAILED, f"tool response larger than {limit} bytes")
    return b"".join(chunks)[:limit]


def _text(response: httpx.Response, raw: bytes) -> str:
    try:
        return raw.decode(response.charset_encoding or "utf-8", errors="replace")
    except LookupError:  # a charset Python does not know
        return raw.decode("utf-8", errors="replace")


def _result(response: httpx.Response, raw: bytes) -> str:
    text = _text(response, raw)
    if "json" not in response.headers.get("content-type", "").lower():
        return text
    try:
        value = json.loads(text)
    except ValueError:
        return text  # labelled JSON but is not: the model still gets what the tool said
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


async def _status_failure(response: httpx.Response) -> FailureError:
    status = response.status_code
    error_class = classify_tool_http(status)
    message = f"tool answered HTTP {status}"
    # A 4xx body is the tool telling the caller what was wrong, worth showing the model; a
    # 5xx body is often a proxy's error page, which may name internal hosts, so it is dropped.
    if error_class is ErrorClass.TOOL_FAILED:
        excerpt = await _read(response, _ERROR_EXCERPT_BYTES, truncate=True)
        detail = " ".join(_text(response, excerpt).split())[:200]
        if detail:
            message += f": {detail}"
    return _failure(
        error_class,
        message,
        http_status=status,
        retry_after_ms=parse_retry_after(response.headers),
    )


def _transport_message(error: httpx.TransportError) -> str:
    # httpx messages name the host and port; the class of error is all that may be shown.
    if isinstance(error, httpx.ConnectError):
        return "could not connect to the tool"
    if isinstance(error, httpx.ProtocolError):
        return "the tool broke the HTTP protocol"
    return "network error talking to the tool"


def _failure(error_class: ErrorClass, message: str, **kw: Any) -> FailureError:
    return FailureError(Failure.of(error_class, message, **kw))
