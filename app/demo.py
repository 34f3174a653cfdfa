"""The `demo` agent that `turnrunner serve` registers: a scripted model that calls `calculator`."""

from __future__ import annotations

from app.domain.agent import AgentSpec
from app.tools.builtins import builtin_tool_spec

DEMO_AGENT = AgentSpec.model_validate(
    {
        "name": "demo",
        "description": "Scripted demo: asks the calculator for 6*7, then answers.",
        "system_prompt": "You are a helpful assistant. Use the calculator for arithmetic.",
        "model": {
            "provider": "scripted",
            "model": "demo-script",
            "script": [
                {
                    "tool_calls": [{"name": "calculator", "arguments": {"expression": "6*7"}}],
                    "usage": {"input_tokens": 20, "output_tokens": 8},
                },
                {"content": "6 * 7 = 42.", "usage": {"input_tokens": 32, "output_tokens": 6}},
            ],
        },
        "tools": [builtin_tool_spec("calculator")],
    }
)
