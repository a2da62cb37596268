"""The one redaction step for text bound for a user: screens, logs, reports, errors.

    redact_url("https://user:pw@proxy/v1")   -> "https://[redacted]@proxy/v1"
    scrub("... sk-abcdef0123456789 ...")     -> "... sk-[redacted] ..."

``scrub`` removes, wherever they appear in the text: the secrets it is given
(an API key), the value of every secret-looking environment variable
(``*KEY*``, ``*SECRET*``, ``*TOKEN*``, ``*PASSW*``, ...), anything shaped like
an OpenAI-style key or a chatstate encryption key (``csk1-...``), and the
user:password part of any URL. Every front end,
the adapter's errors and the stores' errors call it, so a new surface needs
one call, not a new rule.
"""

from __future__ import annotations

import os
import re
from urllib.parse import parse_qsl, urlencode, urlsplit

__all__ = ["MIN_SECRET", "REDACTED", "SECRET_NAME", "looks_too_short", "redact_url", "scrub"]

REDACTED = "[redacted]"
SECRET_NAME = re.compile(r"KEY|SECRET|TOKEN|PASSW|CREDENTIAL|AUTH|PRIVATE", re.I)
# A value shorter than this is no secret worth hiding: replacing it letter by letter (a key
# "e") garbles every message. make_adapter warns about such a key instead.
MIN_SECRET = 8
LIMIT = 2000  # no single message needs more; a dump longer than this is noise

# Providers echo keys in 401 texts ("Incorrect API key provided: sk-ab***yz").
_KEY_PATTERN = re.compile(r"\b(sk|rk)-[A-Za-z0-9_*\-]{8,}")
# chatstate's own encryption keys (`chatstate keygen`), wherever they came from.
_STORE_KEY_PATTERN = re.compile(r"\b(csk1)-[A-Za-z0-9_\-]{20,}")
# scheme://userinfo@ inside any text: the userinfo goes, the host stays.
_URL_USERINFO = re.compile(r"\b([A-Za-z][A-Za-z0-9+.\-]*://)[^/\s@?#]+@")
# A client library's multi-line debug dump (obstore appends one) is not for users.
_DEBUG_TAIL = "\n\nDebug source"


def scrub(text: str, *secrets: str | None, limit: int | None = LIMIT) -> str:
    """``text`` with every secret removed (see the module docstring); clipped to ``limit``."""
    text = text.split(_DEBUG_TAIL, 1)[0].strip() if _DEBUG_TAIL in text else text
    for secret in secrets:
        if secret and len(secret) >= MIN_SECRET and secret in text:
            text = _as_token(secret).sub(REDACTED, text)
    for name, value in os.environ.items():
        if len(value) >= MIN_SECRET and SECRET_NAME.search(name) and value in text:
            text = _as_token(value).sub(REDACTED, text)
    text = _URL_USERINFO.sub(lambda m: f"{m.group(1)}{REDACTED}@", text)
    text = _KEY_PATTERN.sub(lambda m: f"{m.group(1)}-{REDACTED}", text)
    text = _STORE_KEY_PATTERN.sub(lambda m: f"{m.group(1)}-{REDACTED}", text)
    if limit is not None and len(text) > limit:
        text = text[:limit] + "…"
    return text


def _as_token(secret: str) -> re.Pattern[str]:
    """``secret`` where it stands as a token: not inside a longer word or number."""
    return re.compile(rf"(?<![A-Za-z0-9]){re.escape(secret)}(?![A-Za-z0-9])")


def looks_too_short(secret: str | None) -> bool:
    """True for a key too short to be real (and so too short to redact)."""
    return secret is not None and 0 < len(secret.strip()) < MIN_SECRET


def redact_url(url: str) -> str:
    """``url`` without its user:password part and without secret-looking query values."""
    if "://" not in url:
        return scrub(url)
    try:
        parts = urlsplit(url)
    except ValueError:
        return REDACTED
    netloc = parts.netloc
    if "@" in netloc:
        netloc = REDACTED + "@" + netloc.rsplit("@", 1)[1]
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    query = urlencode([(k, REDACTED if SECRET_NAME.search(k) else v) for k, v in pairs],
                      safe="/:[]")
    # built by hand: urlunsplit would turn sqlite:///abs into sqlite:/abs
    shown = f"{parts.scheme}://{netloc}{parts.path}" + (f"?{query}" if query else "")
    return scrub(shown + (f"#{parts.fragment}" if parts.fragment else ""))
