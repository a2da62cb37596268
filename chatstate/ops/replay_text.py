"""How `replay` shows a message as text or markdown: tool calls, results, images and files.

    [3] assistant: → get_weather({"city":"Oslo"})
    [4] tool get_weather [call_1]: rain, 4 C
    [5] tool get_weather [call_2] (error): boom
    [6] tool send_email [call_3] (started: it may have run; its result is ...)
    [7] user: what is this? [image: cat.png, 1.0 MiB, sha256 5546d8bd82e7…]

Images and files are never printed, only described: by name (or media type),
size, and the blob's digest or "inline"; an image given by URL shows its URL.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

MARKED = {"partial": "partial: cut off", "error": "error", "unknown": "outcome unknown"}
STARTED = "started: it may have run; its result is the next message for this call, if any"


def size_text(size: object) -> str:
    if not isinstance(size, int):
        return "? bytes"
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}".replace(".0 ", " ")
    return f"{size} B"


def part_text(part: dict[str, Any]) -> str:
    kind = str(part.get("type"))
    if kind == "text":
        return str(part.get("text", ""))
    found = part.get(kind)
    inner: dict[str, Any] = found if isinstance(found, dict) else {}
    label = {"image_url": "image", "file": "file"}.get(kind)
    if label is None:
        return f"[{kind} part]"
    ref = part.get("blob")
    if isinstance(ref, dict):
        name = ref.get("name") or ref.get("media_type") or "?"
        return f"[{label}: {name}, {size_text(ref.get('size'))}, sha256 {ref.get('sha256')}]"
    url = str(inner.get("url") or inner.get("file_data") or "")
    if url.startswith("data:"):
        media = url[5:].split(";", 1)[0]
        name = part.get("name") or inner.get("filename") or media
        payload = url.split(",", 1)[-1]
        size = len(payload) * 3 // 4 - len(payload) + len(payload.rstrip("="))
        return f"[{label}: {name}, {size_text(size)}, inline]"
    return f"[{label}: {url or '?'}]"


def content_text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(part_text(p) for p in content if isinstance(p, dict))
    return ""


def marks(m: dict[str, Any]) -> str:
    """What a reader must know about a complete message: a summary, a reply cut at its limit."""
    params = m.get("params") if isinstance(m.get("params"), dict) else {}
    summary = params.get("summary") if isinstance(params, dict) else None
    out = ""
    if isinstance(summary, dict):
        out += f" (summary of seq 0-{summary.get('covers_to_seq', '?')})"
    if m.get("status") == "complete" and m.get("finish_reason") == "length":
        out += " (cut: the reply hit its token limit)"
    return out


def message_lines(messages: Iterable[dict[str, Any]], fmt: str) -> list[str]:
    """One entry per message (stored form, as dicts), in ``text`` or ``markdown``."""
    names: dict[str, str] = {}  # call id -> tool name, to label results
    out = []
    for m in messages:
        calls = [c for c in m.get("tool_calls") or () if isinstance(c, dict)]
        for call in calls:
            names[str(call.get("id"))] = str((call.get("function") or {}).get("name"))
        who = str(m["role"])
        if who == "tool":
            call_id = m.get("tool_call_id")
            who = " ".join(x for x in ("tool", m.get("name") or names.get(str(call_id)),
                                       f"[{call_id}]") if x)
        tag = f" ({MARKED[m['status']]})" if m.get("status") in MARKED else ""
        tag += marks(m)
        pieces = [content_text(m.get("content"))] if m.get("content") else []
        if m["role"] == "tool" and m.get("status") == "partial":  # the tool loop's marker
            tag, pieces = f" ({STARTED})", []
        pieces += [f"→ {(c.get('function') or {}).get('name')}"
                   f"({(c.get('function') or {}).get('arguments')})" for c in calls]
        if fmt == "markdown":
            out.append(f"**{who}**{tag} · seq {m['seq']}\n\n" + "\n\n".join(pieces) + "\n")
        else:
            colon = "" if tag == f" ({STARTED})" else ": "
            out.append(f"[{m['seq']}] {who}{tag}{colon}" + "\n".join(pieces))
    return out
