"""What content parts a request carried, for the fake model's log and its echo.

An image or file sent as a data URL is summarised by its media type, size and
sha256, so a test can check that an attached image arrived whole (inlined from
the blob area) without the log holding megabytes of base64.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Mapping, Sequence
from typing import Any


def describe(part: Mapping[str, Any]) -> dict[str, Any]:
    """``{"type", ...}``: text parts keep their text; data URLs become media type/size/sha256."""
    kind = str(part.get("type"))
    if kind == "text":
        return {"type": kind, "text": part.get("text")}
    inner = part.get(kind)
    url = None
    if isinstance(inner, Mapping):
        url = inner.get("url") if kind == "image_url" else inner.get("file_data")
    out: dict[str, Any] = {"type": kind}
    if isinstance(inner, Mapping) and isinstance(inner.get("filename"), str):
        out["filename"] = inner["filename"]
    if isinstance(url, str) and url.startswith("data:") and ";base64," in url:
        head, payload = url.split(",", 1)
        try:
            data = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            return {**out, "error": "invalid base64"}
        out.update(media_type=head[5:].split(";", 1)[0], size=len(data),
                   sha256=hashlib.sha256(data).hexdigest())
    elif isinstance(url, str):
        out["url"] = url
    return out


def received_parts(messages: Sequence[Any]) -> list[dict[str, Any]]:
    """Every non-string content part of the request, with its message index and role."""
    out: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        content = message.get("content") if isinstance(message, Mapping) else None
        if isinstance(content, list):
            out.extend({"message": index, "role": message.get("role"),
                        **describe(p if isinstance(p, Mapping) else {})} for p in content)
    return out


def echo_text(content: Sequence[Any]) -> str:
    """The text of a parts list, images and files as ``[image/png 1048576 bytes]``."""
    pieces = []
    for part in content:
        info = describe(part if isinstance(part, Mapping) else {})
        if info["type"] == "text":
            pieces.append(str(info.get("text")))
        else:
            what = info.get("media_type") or info.get("url") or info["type"]
            size = f" {info['size']} bytes" if "size" in info else ""
            pieces.append(f"[{what}{size}]")
    return " ".join(pieces)
