"""Which provider serves a ModelSpec; one shared HTTP client for all OpenAI-compatible calls."""

from __future__ import annotations

from app.domain.agent import ModelSpec, Provider
from app.models.base import ModelProvider
from app.models.openai import OpenAIProvider
from app.models.scripted import ScriptedProvider


class ModelRegistry:
    def __init__(self) -> None:
        self._scripted = ScriptedProvider()
        self._openai = OpenAIProvider()

    def get(self, spec: ModelSpec) -> ModelProvider:
        return self._scripted if spec.provider is Provider.SCRIPTED else self._openai

    async def aclose(self) -> None:
        await self._openai.aclose()
