"""The tool dispatcher the runner calls: validate the arguments, then run one tool call."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import json
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, ParamSpec, TypeVar

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError, best_match
from jsonschema.validators import validator_for

from app.domain.agent import ToolKind, ToolSpec
from app.domain.failures import ErrorClass, Failure, FailureError
from app.domain.transcript import ToolCall
from app.tools.base import ToolContext
from app.tools.http import HttpToolExecutor
from app.tools.registry import BuiltinTool, get_builtin

P = ParamSpec("P")
T = TypeVar("T")


class DaemonThreadPool(Executor):
    """A growing pool of daemon threads: unlike ThreadPoolExecutor, whose threads the
    interpreter joins at exit, a call that hangs forever here never blocks the process exit."""

    def __init__(self, max_workers: int, name: str) -> None:
        self._max_workers = max_workers
        self._name = name
        self._work: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]]] = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)
        self._lock = threading.Lock()
        self._workers = 0

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        """Queue `fn(*args, **kwargs)`; start a worker when none is idle and the cap allows."""
        future: Future[T] = Future()
        self._work.put((future, functools.partial(fn, *args, **kwargs)))
        if self._idle.acquire(blocking=False):
            return future
        with self._lock:
            if self._workers < self._max_workers:
                self._workers += 1
                threading.Thread(
                    target=self._worker, name=f"{self._name}-{self._workers}", daemon=True
                ).start()
        # At the cap with every worker busy (or hung), the call waits in the queue; its
        # caller's timeout still fires, and a call cancelled while queued never starts.
        return future

    def _worker(self) -> None:
        while True:
            future, call = self._work.get()
            if future.set_running_or_notify_cancel():
                try:
                    result = call()
                except BaseException as e:
                    future.set_exception(e)
                else:
                    future.set_result(result)
            del future, call  # do not keep the last result alive while idle
            self._idle.release()


# Sync builtins run here. A hung call keeps its thread forever (Python cannot kill a thread);
# daemon threads let the process exit anyway, and the cap bounds what hung calls can hold.
_SYNC_POOL = DaemonThreadPool(max_workers=64, name="turnrunner-builtin")


class ToolRunner:
    """Runs one tool call of any kind but `external`; returns the tool message content."""

    def __init__(self, http: HttpToolExecutor) -> None:
        self._http = http

    async def run(self, spec: ToolSpec | None, call: ToolCall, ctx: ToolContext) -> str:
        """The call's result as text, or FailureError; asyncio.CancelledError passes through."""
        if spec is None:
            raise _failure(ErrorClass.TOOL_NOT_FOUND, f"unknown tool {call.name[:100]}")
        if spec.kind is ToolKind.EXTERNAL:
            raise ValueError(f"tool {spec.name} is external: the client executes it")
        arguments = validate_arguments(spec, call)
        if ctx.timeout_s <= 0:
            raise _failure(ErrorClass.TOOL_TIMEOUT, "no time left for the tool call")
        if spec.kind is ToolKind.HTTP:
            return await self._http.execute(spec, arguments, ctx)
        return await run_builtin(spec.builtin or spec.name, arguments, ctx)

    async def aclose(self) -> None:
        """Close the HTTP client of `http` tools."""
        await self._http.aclose()


def validate_arguments(spec: ToolSpec, call: ToolCall) -> dict[str, Any]:
    """The call's arguments if they are a JSON object that satisfies the tool's schema."""
    if call.raw_arguments is not None:
        # Never echo the raw text: it is whatever the model produced, of any size.
        raise _failure(ErrorClass.INVALID_ARGUMENTS, "arguments: not a JSON object")
    validator_class = validator_for(spec.parameters, default=Draft202012Validator)
    error = best_match(validator_class(spec.parameters).iter_errors(call.arguments))
    if error is not None:
        raise _failure(ErrorClass.INVALID_ARGUMENTS, f"{_path(error)}: {error.message}")
    return call.arguments


def _path(error: ValidationError) -> str:
    path = "arguments"
    for part in error.absolute_path:
        if isinstance(part, int):
            path += f"[{part}]"
        elif str(part).isidentifier():
            path += f".{part}"
        else:
            path += f"[{json.dumps(str(part))}]"
    return path


async def run_builtin(name: str, arguments: dict[str, Any], ctx: ToolContext) -> str:
    """Run the builtin `name` within ctx.timeout_s; its exceptions become tool_failed."""
    fn = get_builtin(name)
    if fn is None:
        raise _failure(ErrorClass.TOOL_NOT_FOUND, f"unknown builtin {name[:100]}")
    # asyncio.timeout rather than wait_for: it tells our deadline apart from a TimeoutError
    # the tool raised itself.
    deadline = asyncio.timeout(ctx.timeout_s)
    try:
        async with deadline:
            result = await _call(fn, arguments, ctx)
    except FailureError:
        raise  # the tool classified its own failure
    except TimeoutError as e:
        if deadline.expired():
            raise _failure(ErrorClass.TOOL_TIMEOUT, "tool call timed out") from e
        raise _failure(ErrorClass.TOOL_FAILED, _describe(e)) from e
    except Exception as e:
        raise _failure(ErrorClass.TOOL_FAILED, _describe(e)) from e
    return to_content(result)


async def _call(fn: BuiltinTool, arguments: dict[str, Any], ctx: ToolContext) -> Any:
    if _is_async(fn):
        result = fn(arguments, ctx)
    else:
        # The awaiting coroutine returns at the deadline even if the thread never does; the
        # copied context keeps contextvars (log fields) visible inside the tool.
        context = contextvars.copy_context()
        loop = asyncio.get_running_loop()
        result = await loop.run_in_executor(_SYNC_POOL, context.run, fn, arguments, ctx)
    if inspect.isawaitable(result):  # a sync callable that hands back a coroutine
        result = await result
    return result


def _is_async(fn: BuiltinTool) -> bool:
    # The second test catches an object whose __call__ is `async def`.
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)


def to_content(result: Any) -> str:
    """A tool result as the text of a `tool` message: strings as they are, the rest as JSON."""
    if isinstance(result, str):
        return result
    try:
        return json.dumps(result, default=str, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as e:
        raise _failure(ErrorClass.TOOL_FAILED, "tool result is not JSON-serializable") from e


def _describe(error: BaseException) -> str:
    return str(error).strip() or type(error).__name__


def _failure(error_class: ErrorClass, message: str) -> FailureError:
    return FailureError(Failure.of(error_class, message))
