"""An MCP ``CallToolResult`` as content parts, kept whole.

It works on the wire form (camelCase JSON, as the server sent it), so it does
not depend on the SDK's model classes:

- ``text`` -> a text part;
- ``image`` -> an ``image_url`` part with a data URL (a large one becomes a
  blob when the loop stores it, like any attachment);
- ``audio`` and binary embedded resources -> a ``file`` part with a data URL;
- a text embedded resource -> a text part headed by its URI, or a ``file`` part
  (a blob) when it is larger than ``BLOB_THRESHOLD``;
- a resource link -> a text part naming it;
- ``structuredContent`` -> a text part with its JSON, unless a text part
  already says exactly that (servers are asked to send both);
- ``isError`` -> the result is stored as a tool error.
"""

from __future__ import annotations

import json
from pathlib import PurePosixPath
from typing import Any

from chatstate.core.content import BLOB_THRESHOLD, Part, data_url
from chatstate.core.tools import ToolOutput

__all__ = ["to_output"]


def to_output(result: dict[str, Any]) -> ToolOutput:
    """The stored form of a ``CallToolResult`` given as its wire JSON."""
    parts: list[Part] = []
    for block in result.get("content") or ():
        parts.extend(_block(block))
    structured = result.get("structuredContent")
    if structured is not None and not _said(parts, structured):
        parts.append({"type": "text", "text": json.dumps(structured, ensure_ascii=False)})
    if not parts:
        parts.append({"type": "text", "text": "(the tool returned no content)"})
    return ToolOutput(content=parts, error=bool(result.get("isError")))


def _block(block: dict[str, Any]) -> list[Part]:
    kind = block.get("type")
    if kind == "text":
        return [{"type": "text", "text": str(block.get("text", ""))}]
    if kind == "image":
        return [{"type": "image_url", "image_url": {"url": _data(block)}}]
    if kind == "audio":
        return [_file(_data(block), "audio")]
    if kind == "resource":
        return [_resource(block.get("resource") or {})]
    if kind == "resource_link":
        name = block.get("name") or block.get("title") or ""
        return [{"type": "text", "text": f"resource link: {block.get('uri')} {name}".strip()}]
    # a kind this version does not know: kept as its JSON, so nothing is lost
    return [{"type": "text", "text": json.dumps(block, ensure_ascii=False)}]


def _data(block: dict[str, Any]) -> str:
    return f"data:{block.get('mimeType') or 'application/octet-stream'};base64," \
           f"{block.get('data', '')}"


def _file(url: str, name: str) -> Part:
    return {"type": "file", "file": {"filename": name, "file_data": url}}


def _resource(res: dict[str, Any]) -> Part:
    uri = str(res.get("uri", ""))
    name = PurePosixPath(uri.split("://", 1)[-1]).name or "resource"
    media = str(res.get("mimeType") or "")
    if "blob" in res:
        url = f"data:{media or 'application/octet-stream'};base64,{res['blob']}"
        if media.startswith("image/"):
            return {"type": "image_url", "image_url": {"url": url}, "name": name}
        return _file(url, name)
    text = str(res.get("text", ""))
    data = text.encode()
    if len(data) > BLOB_THRESHOLD:
        return _file(data_url(data, media or "text/plain"), name)
    return {"type": "text", "text": f"resource {uri}:\n{text}"}


def _said(parts: list[Part], structured: Any) -> bool:
    """Whether a text part already holds ``structured`` (as JSON, or as the one
    ``{"result": VALUE}`` an SDK server wraps a plain return value in)."""
    texts = [p["text"] for p in parts if p.get("type") == "text"]
    if isinstance(structured, dict) and list(structured) == ["result"] and \
            texts == [str(structured["result"])]:
        return True
    for part in parts:
        if part.get("type") == "text":
            try:
                if json.loads(part["text"]) == structured:
                    return True
            except ValueError:
                continue
    return False
