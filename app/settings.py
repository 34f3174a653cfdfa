"""All configuration, from the environment (prefix TURNRUNNER_) or a .env file."""

from __future__ import annotations

import ipaddress
from functools import lru_cache

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.domain.policy import ExecutionPolicy


def normalize_database_url(url: str) -> str:
    """postgres:// and postgresql:// mean psycopg 3; everything else is taken as written."""
    for prefix in ("postgres://", "postgresql://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TURNRUNNER_", env_file=".env", extra="ignore")

    database_url: str = Field(
        "sqlite:///./turnrunner.db",
        description="SQLAlchemy URL; postgresql:// URLs use psycopg 3. Default: an embedded "
        "SQLite file in the working directory.",
    )
    host: str = Field("127.0.0.1", description="Address the HTTP server binds to.")
    port: int = Field(8000, ge=0, le=65535, description="Port the HTTP server binds to.")
    api_tokens: SecretStr = Field(
        SecretStr(""), description="Client bearer tokens, comma separated."
    )
    admin_tokens: SecretStr = Field(
        SecretStr(""), description="Admin bearer tokens, comma separated."
    )
    default_execution_policy: ExecutionPolicy = Field(
        default_factory=ExecutionPolicy,
        description="Server-wide default policy (JSON); an agent's or a turn's replaces it whole.",
    )
    register_demo_agent: bool = Field(True, description="`serve` registers the `demo` agent.")
    worker_concurrency: int = Field(
        32, ge=1, le=10_000, description="Turns one worker runs at once."
    )
    scheduler_enabled: bool = Field(
        True,
        description="Workers resume RETRY_SCHEDULED turns when due; off = operator's scheduler.",
    )
    lease_ttl_ms: int = Field(
        30_000, ge=500, description="How long a claim holds without heartbeat."
    )
    poll_interval_ms: int = Field(1000, ge=10, description="Mean idle poll interval (jittered).")
    cancel_poll_interval_ms: int = Field(
        250, ge=10, description="How often a worker looks for cancel flags on the turns it holds."
    )
    max_body_bytes: int = Field(1_048_576, ge=1024, description="Largest request body accepted.")
    http_tool_allowlist: str = Field(
        "",
        description="Hosts `http` tools may call, comma separated; empty = any public or "
        "private host. Link-local and metadata addresses are always refused.",
    )
    prune_after_ms: int | None = Field(
        None,
        ge=60_000,
        description="Prune terminal turns older than this, periodically; off if unset.",
    )
    log_level: str = Field("INFO", description="Python logging level.")
    metrics_port: int | None = Field(
        None, ge=1, le=65535, description="`worker`: serve /metrics on this port; off if unset."
    )
    metrics_host: str = Field(
        "127.0.0.1", description="`worker`: address /metrics binds (keep it off public networks)."
    )
    fake_llm_host: str = Field("127.0.0.1", description="`fake-llm`: bind address.")
    fake_llm_port: int = Field(8080, ge=0, le=65535, description="`fake-llm`: port.")

    @field_validator("database_url")
    @classmethod
    def _normalize(cls, v: str) -> str:
        return normalize_database_url(v)

    @staticmethod
    def _split(secret: SecretStr) -> frozenset[str]:
        return frozenset(t.strip() for t in secret.get_secret_value().split(",") if t.strip())

    @property
    def client_token_set(self) -> frozenset[str]:
        return self._split(self.api_tokens)

    @property
    def admin_token_set(self) -> frozenset[str]:
        return self._split(self.admin_tokens)

    @property
    def auth_enabled(self) -> bool:
        return bool(self.client_token_set or self.admin_token_set)

    @property
    def allowlist(self) -> frozenset[str]:
        return frozenset(
            h.strip().lower() for h in self.http_tool_allowlist.split(",") if h.strip()
        )


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@lru_cache
def get_settings() -> Settings:
    return Settings()
