"""Is the configured model endpoint there? ``GET {base_url}/models`` with a short timeout.

``doctor`` runs this after the store checks: a store that is fine is not much
use when every ``ask`` will fail to connect. An endpoint that is not configured
at all (the default OpenAI URL without a key) is a warning, not a failure: the
store is still good for replay, export and the offline fake model.
"""

from __future__ import annotations

from typing import Any

from chatstate.core.redact import redact_url, scrub

__all__ = ["check_model_endpoint"]

TIMEOUT = 3.0


def check_model_endpoint(settings: Any = None, *, timeout: float = TIMEOUT) -> dict[str, Any]:
    """``{"endpoint", "model", "configured", "ok", "detail", "warning"}`` for the settings
    (default: ``ModelSettings()`` from the environment). Never raises for a network error."""
    import httpx2

    from chatstate.adapter.settings import ModelSettings

    settings = settings or ModelSettings()
    key = settings.api_key.get_secret_value() if settings.api_key else None
    url = settings.base_url.rstrip("/") + "/models"
    out: dict[str, Any] = {"endpoint": redact_url(url), "model": settings.model,
                           "configured": True, "ok": False, "detail": "", "warning": None}
    if key is None and "api.openai.com" in settings.base_url:
        out.update(configured=False, detail="not configured: no API key for the default "
                   "OpenAI endpoint (set CHATSTATE_BASE_URL or CHATSTATE_API_KEY)")
        return out
    headers = {"User-Agent": "chatstate"} | ({"Authorization": f"Bearer {key}"} if key else {})
    try:
        response = httpx2.get(url, headers=headers, timeout=timeout)
    except httpx2.TimeoutException:
        out["detail"] = (f"unreachable: no answer within {timeout:g}s (is the server frozen "
                         "or overloaded?)")
        return out
    except httpx2.HTTPError as exc:
        out["detail"] = scrub(f"unreachable: {type(exc).__name__}: {exc} (is the server "
                              "running? check CHATSTATE_BASE_URL)", key)
        return out
    status = response.status_code
    if status in (401, 403):
        out["detail"] = f"HTTP {status}: the endpoint rejects the API key"
    elif status >= 400:  # some OpenAI-compatible servers have no /models: it still answers
        out.update(ok=True, detail=f"reachable (HTTP {status} for /models)")
    else:
        names = _model_names(response)
        out.update(ok=True, detail="reachable" + (f"; serves {', '.join(names[:3])}"
                                                  + (" …" if len(names) > 3 else "")
                                                  if names else ""))
        if names and settings.model not in names:
            out["warning"] = (f"the configured model {settings.model!r} is not among the "
                              "models the endpoint lists (CHATSTATE_MODEL); requests may fail")
    return out


def _model_names(response: Any) -> list[str]:
    try:
        data = response.json()
    except ValueError:
        return []
    items = data.get("data") if isinstance(data, dict) else None
    return [str(m["id"]) for m in items or [] if isinstance(m, dict) and "id" in m]
