"""Where builtin tools come from: the `turnrunner.tools` entry points, plus programmatic ones."""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import cache
from importlib.metadata import entry_points
from typing import Any

from app.tools import builtins
from app.tools.base import ToolContext

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "turnrunner.tools"

# `fn(arguments, ctx) -> result`, or an `async def` of the same shape.
BuiltinTool = Callable[[dict[str, Any], ToolContext], Any]

# The shipped builtins also work from a source tree that was never pip-installed (no entry
# points then); an installed entry point of the same name takes precedence.
_SHIPPED: dict[str, BuiltinTool] = {
    "calculator": builtins.calculator,
    "current_time": builtins.current_time,
    "sleep": builtins.sleep,
}

_registered: dict[str, BuiltinTool] = {}


@cache
def _entry_point_tools() -> dict[str, BuiltinTool]:
    """Every loadable `turnrunner.tools` entry point; a broken plugin is logged and skipped."""
    found: dict[str, BuiltinTool] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            fn = ep.load()
        except Exception:
            log.exception("builtin tool %r could not be loaded from %s", ep.name, ep.value)
            continue
        if not callable(fn):
            log.error("builtin tool %r (%s) is not callable; skipped", ep.name, ep.value)
            continue
        found[ep.name] = fn
    return found


def get_builtin(name: str) -> BuiltinTool | None:
    """The builtin registered under `name`: programmatic first, then entry points, then shipped."""
    return _registered.get(name) or _entry_point_tools().get(name) or _SHIPPED.get(name)


def builtin_names() -> list[str]:
    """Every builtin name that `get_builtin` resolves, sorted."""
    return sorted({*_SHIPPED, *_entry_point_tools(), *_registered})


def register_builtin(name: str, fn: BuiltinTool) -> None:
    """Register (or replace) a builtin for this process, for tests and embedding."""
    if not callable(fn):
        raise TypeError("a builtin tool must be callable")
    _registered[name] = fn


def unregister_builtin(name: str) -> None:
    """Remove a programmatic registration; entry points and shipped builtins stay."""
    _registered.pop(name, None)
