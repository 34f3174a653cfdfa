"""A fake OpenAI-compatible Chat Completions server with scripts and fault injection.

`turnrunner fake-llm` serves it for end-to-end tests and demos. Everything is keyed by the
request's `model` name, so parallel tests that use different model names never interfere.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any, Literal

import uvicorn
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, model_validator

from app.domain.agent import ScriptedError, ScriptedToolCall, Usage

# Arguments that are deliberately not JSON, for `{"bad_arguments": true}`.
BAD_ARGUMENTS = '{"expression": "6*7"'
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
}
_ERROR_MESSAGES = {
    429: "Rate limit reached for requests",
    503: "The server is overloaded",
    500: "The server had an error while processing your request",
    401: "Incorrect API key provided",
}


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FakeReply(_Body):
    """A scripted answer: the Reply grammar of API.md plus `malformed` and `bad_arguments`."""

    content: str | None = None
    tool_calls: list[ScriptedToolCall] | None = Field(None, min_length=1)
    error: ScriptedError | None = None
    hang_ms: int | None = Field(None, ge=0, le=3_600_000)
    malformed: Literal[True] | None = None
    bad_arguments: Literal[True] | None = None
    usage: Usage | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> FakeReply:
        kinds = ("content", "tool_calls", "error", "hang_ms", "malformed", "bad_arguments")
        if sum(getattr(self, k) is not None for k in kinds) != 1:
            raise ValueError(f"a reply has exactly one of {', '.join(kinds)}")
        return self


class ScriptBody(_Body):
    replies: list[FakeReply] = Field(min_length=1, max_length=10_000)


class Fault(_Body):
    status: int = Field(ge=400, le=599)
    count: int = Field(1, ge=1, le=1_000_000)
    code: str | None = Field(None, max_length=200)
    retry_after_ms: int | None = Field(None, ge=0)


class FaultsBody(_Body):
    faults: list[Fault] = Field(default_factory=list, max_length=1000)
    fault_rate: float = Field(0.0, ge=0.0, le=1.0)
    fault_status: int = Field(503, ge=400, le=599)
    seed: int = 0


@dataclass
class _Pending:
    fault: Fault
    remaining: int


@dataclass
class ModelState:
    """What the fake knows about one model name. Mutated only between awaits (one event loop)."""

    replies: list[FakeReply] = field(default_factory=list)
    replies_served: int = 0
    faults: deque[_Pending] = field(default_factory=deque)
    fault_rate: float = 0.0
    fault_status: int = 503
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    message_counts: list[int] = field(default_factory=list)
    tool_calls_issued: int = 0

    def next_fault(self) -> Fault | None:
        """The queued fault due now, else a seeded-random one at `fault_rate`."""
        if self.faults:
            pending = self.faults[0]
            pending.remaining -= 1
            if pending.remaining <= 0:
                self.faults.popleft()
            return pending.fault
        if self.fault_rate and self.rng.random() < self.fault_rate:
            return Fault(status=self.fault_status)
        return None

    def next_reply(self) -> FakeReply | None:
        """The n-th scripted reply for the n-th request that got past the faults; last repeats."""
        if not self.replies:
            return None
        reply = self.replies[min(self.replies_served, len(self.replies) - 1)]
        self.replies_served += 1
        return reply

    def call_id(self) -> str:
        self.tool_calls_issued += 1
        return f"call_{self.tool_calls_issued}"

    def summary(self, model: str) -> dict[str, Any]:
        return {
            "model": model,
            "requests": len(self.message_counts),
            "message_counts": self.message_counts,
            "replies": len(self.replies),
            "replies_served": self.replies_served,
            "faults_pending": sum(p.remaining for p in self.faults),
        }


def _text(content: Any) -> str:
    """A message's text; content may be a string, null, or a list of content parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text") or "") for p in content if isinstance(p, dict))
    return ""


def _words(text: str) -> int:
    return len(text.split())


def _tool_names(body: dict[str, Any]) -> list[str]:
    tools = body.get("tools") or []
    return [
        t["function"]["name"]
        for t in tools
        if isinstance(t, dict)
        and isinstance(t.get("function"), dict)
        and isinstance(t["function"].get("name"), str)
    ]


def _default_arguments(tool: str) -> dict[str, Any]:
    return {"expression": "6*7"} if tool == "calculator" else {}


def _default_answer(body: dict[str, Any], state: ModelState) -> tuple[str | None, list[Any]]:
    """Call the first offered tool until a tool result follows the last user message; else talk."""
    messages: list[dict[str, Any]] = body["messages"]
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    has_result = any(m.get("role") == "tool" for m in messages[last_user + 1 :])
    tools = _tool_names(body)
    if tools and not has_result:
        name = tools[0]
        return None, [_tool_call(state.call_id(), name, json.dumps(_default_arguments(name)))]
    if messages and messages[-1].get("role") == "tool":
        return "result: " + _text(messages[-1].get("content")), []
    user = _text(messages[last_user].get("content")) if last_user >= 0 else ""
    return "echo: " + user, []


def _tool_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _completion(
    body: dict[str, Any], n: int, content: str | None, tool_calls: list[Any], usage: Usage | None
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None}
    if tool_calls:
        message["tool_calls"] = tool_calls
    if usage is not None:
        prompt, completion = usage.input_tokens, usage.output_tokens
    else:
        prompt = max(1, sum(_words(_text(m.get("content"))) for m in body["messages"]))
        said = (content or "") + " ".join(
            f"{c['function']['name']} {c['function']['arguments']}" for c in tool_calls
        )
        completion = max(1, _words(said))
    return {
        "id": f"chatcmpl-fake-{n}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body["model"],
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": "tool_calls" if tool_calls else "stop",
            }
        ],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
    }


def _error(
    status: int,
    code: str | None = None,
    message: str | None = None,
    retry_after_ms: int | None = None,
) -> JSONResponse:
    """An error in OpenAI's shape, with Retry-After in whole seconds (rounded up)."""
    kind = _ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    text = message or _ERROR_MESSAGES.get(status, f"fake-llm injected HTTP {status}")
    headers = (
        {} if retry_after_ms is None else {"Retry-After": str(math.ceil(retry_after_ms / 1000))}
    )
    return JSONResponse(
        {"error": {"message": text, "type": kind, "param": None, "code": code}},
        status_code=status,
        headers=headers,
    )


async def _parse_chat(request: Request) -> dict[str, Any] | JSONResponse:
    try:
        body = await request.json()
    except ValueError:
        return _error(400, message="request body is not JSON")
    if (
        not isinstance(body, dict)
        or not isinstance(body.get("model"), str)
        or not isinstance(body.get("messages"), list)
        or not all(isinstance(m, dict) for m in body["messages"])
    ):
        return _error(400, message="model (string) and messages (list of objects) are required")
    if body.get("stream"):
        return _error(400, message="fake-llm does not stream")
    return body


async def _answer(body: dict[str, Any], state: ModelState) -> Response:
    state.message_counts.append(len(body["messages"]))
    n = len(state.message_counts)
    fault = state.next_fault()
    if fault is not None:
        return _error(fault.status, fault.code, None, fault.retry_after_ms)
    reply = state.next_reply()
    usage = reply.usage if reply is not None else None
    if reply is None or reply.hang_ms is not None:
        if reply is not None and reply.hang_ms:
            await asyncio.sleep(reply.hang_ms / 1000)
        content, calls = _default_answer(body, state)
        return JSONResponse(_completion(body, n, content, calls, usage))
    if reply.error is not None:
        e = reply.error
        return _error(e.status, e.code, e.message, e.retry_after_ms)
    if reply.malformed:
        return Response('{"id": "chatcmpl-broken", "choices": [', media_type="application/json")
    if reply.bad_arguments:
        name = (_tool_names(body) or ["calculator"])[0]
        calls = [_tool_call(state.call_id(), name, BAD_ARGUMENTS)]
        return JSONResponse(_completion(body, n, None, calls, usage))
    calls = [
        _tool_call(state.call_id(), c.name, json.dumps(c.arguments)) for c in reply.tool_calls or []
    ]
    return JSONResponse(_completion(body, n, reply.content, calls, usage))


def create_fake_llm_app() -> FastAPI:
    """The fake model server as an ASGI app, with its own in-memory state."""
    app = FastAPI(title="turnrunner fake-llm", docs_url=None, redoc_url=None)
    states: defaultdict[str, ModelState] = defaultdict(ModelState)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        names = sorted({"fake-model", *states})
        return {
            "object": "list",
            "data": [
                {"id": m, "object": "model", "created": 0, "owned_by": "fake-llm"} for m in names
            ],
        }

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        body = await _parse_chat(request)
        if isinstance(body, JSONResponse):
            return body
        return await _answer(body, states[body["model"]])

    # Declared before the bare model route: `{model:path}` allows "/" in model names
    # (e.g. "org/model") and would otherwise swallow the "/faults" suffix.
    @app.put("/_control/models/{model:path}/faults")
    async def put_faults(model: str, body: FaultsBody) -> dict[str, Any]:
        state = states[model]
        state.faults = deque(_Pending(f, f.count) for f in body.faults)
        state.fault_rate, state.fault_status = body.fault_rate, body.fault_status
        state.rng = random.Random(body.seed)
        return state.summary(model)

    @app.put("/_control/models/{model:path}")
    async def put_script(model: str, body: ScriptBody) -> dict[str, Any]:
        state = states[model]
        state.replies, state.replies_served = list(body.replies), 0
        return state.summary(model)

    @app.get("/_control/models/{model:path}")
    async def get_model(model: str) -> dict[str, Any]:
        state = states.get(model) or ModelState()
        return state.summary(model)

    @app.delete("/_control/models/{model:path}", status_code=204)
    async def reset_model(model: str) -> Response:
        states.pop(model, None)
        return Response(status_code=204)

    return app


def serve(host: str, port: int) -> None:
    """Run the fake model server until interrupted."""
    # A hanging reply must not hold up shutdown.
    uvicorn.run(
        create_fake_llm_app(), host=host, port=port, log_level="info", timeout_graceful_shutdown=1
    )
