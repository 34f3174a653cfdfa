"""The builtin tools the service ships: calculator, current_time and sleep.

A builtin is `fn(arguments, ctx) -> Any`, sync or `async def`; the executor validates the
arguments against the schema in BUILTIN_SCHEMAS first, maps an exception to `tool_failed` and
serializes the result.
"""

from __future__ import annotations

import ast
import asyncio
import math
import operator
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from app.tools.base import ToolContext

Number = int | float

BUILTIN_SCHEMAS: dict[str, dict[str, Any]] = {
    "calculator": {
        "description": "Evaluate an arithmetic expression: numbers, + - * / // % **, parentheses.",
        "parameters": {
            "type": "object",
            "properties": {
                "expression": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": 1000,
                    "description": "For example (2 + 3) * 4 / 5",
                }
            },
            "required": ["expression"],
            "additionalProperties": False,
        },
    },
    "current_time": {
        "description": "The current date and time, ISO 8601, in a time zone (default UTC).",
        "parameters": {
            "type": "object",
            "properties": {
                "timezone": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": 100,
                    "description": "IANA time zone name, for example Europe/Paris",
                }
            },
            "additionalProperties": False,
        },
    },
    "sleep": {
        "description": "Wait for the given number of milliseconds, then answer.",
        "parameters": {
            "type": "object",
            "properties": {"ms": {"type": "integer", "minimum": 0, "maximum": 3_600_000}},
            "required": ["ms"],
            "additionalProperties": False,
        },
    },
}


def builtin_tool_spec(name: str) -> dict[str, Any]:
    """A ToolSpec (as JSON) that declares the shipped builtin `name` to an agent."""
    return {"name": name, "kind": "builtin", "builtin": name, **BUILTIN_SCHEMAS[name]}


class CalculatorError(ValueError):
    """An expression the calculator refuses; its message is fit to show the model."""


# Integers are exact and unbounded in Python, so a short expression can ask for gigabytes of
# digits (9**9**9); every integer result is kept under this many bits (~1200 decimal digits).
_MAX_INT_BITS = 4096
_MAX_EXPRESSION_CHARS = 1000

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}


def calculator(arguments: dict[str, Any], ctx: ToolContext) -> Number:
    """Evaluate `arguments["expression"]` as plain arithmetic; int when the result is integral."""
    expression = arguments.get("expression")
    if not isinstance(expression, str) or not expression.strip():
        raise CalculatorError("expression must be a non-empty string")
    if len(expression) > _MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression longer than {_MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise CalculatorError("not a valid arithmetic expression") from None
    try:
        value = _eval(tree.body)
    except ZeroDivisionError:
        raise CalculatorError("division by zero") from None
    except OverflowError:
        raise CalculatorError("result too large") from None
    except RecursionError:
        raise CalculatorError("expression nested too deeply") from None
    if isinstance(value, float):
        if not math.isfinite(value):
            raise CalculatorError("result is not a finite number")
        if value.is_integer():
            return int(value)
    return value


def _eval(node: ast.expr) -> Number:
    if isinstance(node, ast.Constant):
        value = node.value
        # bool is an int subclass; True + 1 is not arithmetic the model should rely on.
        if isinstance(value, int | float) and not isinstance(value, bool):
            return value
        raise CalculatorError("only numbers are allowed")
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _checked(_UNARY[type(node.op)](_eval(node.operand)))
    if isinstance(node, ast.BinOp):
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow):
            return _checked(_power(left, right))
        if type(node.op) in _BINARY:
            return _checked(_BINARY[type(node.op)](left, right))
    raise CalculatorError("only numbers, + - * / // % ** and parentheses are allowed")


def _power(base: Number, exponent: Number) -> Number:
    # Refuse before computing: the size of base**exponent is known from the operands' sizes.
    if isinstance(base, int) and isinstance(exponent, int) and abs(base) > 1:
        if exponent > 0 and base.bit_length() * exponent > _MAX_INT_BITS:
            raise CalculatorError("exponent too large")
        if exponent < -_MAX_INT_BITS:
            raise CalculatorError("exponent too large")
    result = base**exponent
    if isinstance(result, complex):  # (-8) ** 0.5
        raise CalculatorError("result is not a real number")
    return result


def _checked(value: Any) -> Number:
    if isinstance(value, complex):
        raise CalculatorError("result is not a real number")
    if isinstance(value, int) and value.bit_length() > _MAX_INT_BITS:
        raise CalculatorError("result too large")
    return value  # type: ignore[no-any-return]


def current_time(arguments: dict[str, Any], ctx: ToolContext) -> str:
    """The current time in `arguments["timezone"]` (IANA name, default UTC), ISO 8601."""
    name = arguments.get("timezone")
    if name is None:
        return datetime.now(UTC).isoformat(timespec="seconds")
    if not isinstance(name, str):
        raise ValueError("timezone must be a string")
    try:
        zone = ZoneInfo(name)
    # ValueError: zoneinfo refuses keys that look like file paths ("../x", "/etc/x").
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown time zone {name[:100]!r}") from None
    return datetime.now(zone).isoformat(timespec="seconds")


async def sleep(arguments: dict[str, Any], ctx: ToolContext) -> dict[str, int]:
    """Wait `arguments["ms"]` milliseconds on the event loop, so a timeout or cancel stops it."""
    ms = arguments.get("ms")
    if not isinstance(ms, int) or isinstance(ms, bool) or ms < 0:
        raise ValueError("ms must be a non-negative integer")
    await asyncio.sleep(ms / 1000)
    return {"slept_ms": ms}
