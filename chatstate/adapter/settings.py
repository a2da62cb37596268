"""Where the adapter's configuration comes from, highest priority first.

1. arguments (``ModelSettings(model=...)``, ``make_adapter(model=...)``)
2. ``CHATSTATE_*`` environment variables
3. ``OPENAI_API_KEY`` / ``OPENAI_BASE_URL`` environment variables
4. a ``.env`` file in the current directory (either spelling)

The key is a ``SecretStr`` so it never shows in a repr, a log line or a traceback.
The environment and ``.env`` are read by a small reader of our own (``_env``),
not pydantic-settings, which cost ~50 ms of every `chatstate ask`'s start-up;
the values are validated by this model as before. ``make_adapter`` builds this
model only when a value needs validating (``_env.resolve``): plain text from
the CLI (model, base URL, key) goes around it.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from chatstate.adapter._env import DEFAULT_BASE_URL, DEFAULT_MODEL, VARIABLES, lookup

__all__ = ["DEFAULT_BASE_URL", "DEFAULT_MODEL", "ModelSettings"]


class ModelSettings(BaseModel):
    """The model endpoint, credentials, timeouts and retry budget.

    ``ModelSettings()`` reads the environment and ``.env``; keyword arguments win.
    """

    model_config = ConfigDict(extra="ignore")

    model: str = DEFAULT_MODEL
    base_url: str = DEFAULT_BASE_URL
    api_key: SecretStr | None = None
    timeout: float | None = Field(default=60.0, gt=0, description="read timeout, seconds")
    connect_timeout: float = Field(default=10.0, gt=0)
    max_retries: int = Field(default=3, ge=0)
    backoff_base: float = Field(default=0.5, ge=0, description="first retry waits about this long")
    backoff_max: float = Field(default=20.0, ge=0)
    retry_after_max: float = Field(default=60.0, ge=0, description="cap on a server's Retry-After")

    def __init__(self, **values: Any) -> None:
        super().__init__(**{**lookup(VARIABLES), **values})
