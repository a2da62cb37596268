"""Where the adapter's configuration comes from, highest priority first.

1. arguments (``ModelSettings(model=...)``, ``make_adapter(model=...)``)
2. ``CHATSTATE_*`` environment variables
3. ``OPENAI_API_KEY`` / ``OPENAI_BASE_URL`` environment variables
4. a ``.env`` file in the current directory (either spelling)

The key is a ``SecretStr`` so it never shows in a repr, a log line or a traceback.
"""

from __future__ import annotations

from pydantic import AliasChoices, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["DEFAULT_BASE_URL", "DEFAULT_MODEL", "ModelSettings"]

DEFAULT_MODEL = "gpt-4o-mini"
DEFAULT_BASE_URL = "https://api.openai.com/v1"


class ModelSettings(BaseSettings):
    """The model endpoint, credentials, timeouts and retry budget."""

    model_config = SettingsConfigDict(
        env_prefix="CHATSTATE_",
        env_file=".env",
        extra="ignore",
        env_ignore_empty=True,  # `OPENAI_API_KEY=` (as in .env.example) means unset
        validate_by_name=True,
        validate_by_alias=True,
    )

    model: str = DEFAULT_MODEL
    # Within the environment, CHATSTATE_* wins over OPENAI_* (AliasChoices order);
    # the .env source as a whole ranks below the real environment.
    base_url: str = Field(
        default=DEFAULT_BASE_URL,
        validation_alias=AliasChoices("CHATSTATE_BASE_URL", "OPENAI_BASE_URL"),
    )
    api_key: SecretStr | None = Field(
        default=None,
        validation_alias=AliasChoices("CHATSTATE_API_KEY", "OPENAI_API_KEY"),
    )
    timeout: float | None = Field(default=60.0, gt=0, description="read timeout, seconds")
    connect_timeout: float = Field(default=10.0, gt=0)
    max_retries: int = Field(default=3, ge=0)
    backoff_base: float = Field(default=0.5, ge=0, description="first retry waits about this long")
    backoff_max: float = Field(default=20.0, ge=0)
    retry_after_max: float = Field(default=60.0, ge=0, description="cap on a server's Retry-After")
