"""A conversation as the page shows it: messages a page at a time, tool calls with their
results, attachments, events, the fork links, the request records, the verdict.

Everything here is data; the template escapes every string it prints, and the only
markup made here is Markdown rendered by ``_markdown`` (raw HTML off, links checked).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from markupsafe import Markup

from chatstate.core.content import blob_area
from chatstate.core.events import EVENT, shown
from chatstate.core.transcript import Conversation, Message
from chatstate.errors import ChatstateError, CorruptTranscriptError
from chatstate.ops.replay_text import MARKED, STARTED, size_text
from chatstate.ops.request_log import requests_of
from chatstate.session.sendable import CUT_REASONS
from chatstate.session.turn_state import cut_short_reply, interrupted_turn
from chatstate.stores.base import Store
from chatstate.stores.blobs import named_blobs, verify_blobs
from chatstate.web import _markdown

MESSAGES_PER_PAGE = 200
INLINE_IMAGES = ("image/png", "image/jpeg", "image/gif", "image/webp", "image/avif",
                 "image/bmp")
"""Image types shown inline (SVG is not one: it can carry script, so it is a download)."""


@dataclass
class Verdict:
    ok: bool
    text: str
    position: int | None = None
    bad_blobs: set[str] = field(default_factory=set)  # never shown: they do not read


def verify(store: Store, conversation_id: str) -> tuple[Conversation | None, Verdict]:
    """Load (``Store.load`` checks the chain: a break is a CorruptTranscriptError naming
    its position) and read every named blob (digests checked)."""
    try:
        conv = store.load(conversation_id)
    except CorruptTranscriptError as exc:
        where = f" at seq {exc.position}" if exc.position is not None else ""
        return None, Verdict(False, f"damaged{where}: {exc}", exc.position)
    try:
        blobs = verify_blobs(store, conv)
    except ChatstateError as exc:
        return conv, Verdict(False, f"blob check failed: {exc}",
                             getattr(exc, "position", None), _bad_blobs(store, conv))
    head = conv.last.hash[:16] if conv.last else "-"
    checked = f", {blobs} blob(s) match their sha256" if blobs else ""
    return conv, Verdict(True, f"verified: {len(conv.messages)} messages, chain intact "
                         f"(head {head}…){checked}")


def _bad_blobs(store: Store, conv: Conversation) -> set[str]:
    bad = set()
    for sha in named_blobs([*conv.messages, *([conv.partial] if conv.partial else [])]):
        try:
            blob_area(store, "a blob check").get_blob(sha)
        except ChatstateError:
            bad.add(sha)
    return bad


@dataclass
class Attachment:
    kind: str  # image or file
    name: str
    size: str
    href: str | None  # this app's URL for its bytes (None: an external URL, not fetched)
    inline: bool  # shown as <img>
    external: str | None = None
    damaged: bool = False  # its blob does not read: named, not served


@dataclass
class Call:
    id: str
    name: str
    arguments: str
    state: str  # complete, error, unknown, started, no result
    result: str | None = None
    result_seq: int | None = None


@dataclass
class Item:
    seq: int
    role: str
    who: str
    created_at: str
    status: str
    mark: str | None
    html: Markup
    attachments: list[Attachment] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    usage: dict[str, Any] | None = None
    request: dict[str, Any] = field(default_factory=dict)
    event: str | None = None
    hidden_by: int | None = None
    partial: bool = False


def _json_text(raw: str) -> str:
    try:
        return json.dumps(json.loads(raw), indent=2, ensure_ascii=False)
    except ValueError:
        return raw


def _attachments(base: str, msg: Message, label: str, bad: set[str]) -> list[Attachment]:
    out: list[Attachment] = []
    if isinstance(msg.content, str):
        return out
    for i, part in enumerate(msg.content):
        kind = str(part.get("type"))
        if kind not in ("image_url", "file"):
            continue
        what = "image" if kind == "image_url" else "file"
        found = part.get(kind)
        inner: dict[str, Any] = found if isinstance(found, dict) else {}
        ref = part.get("blob")
        if isinstance(ref, dict):
            media = str(ref.get("media_type") or "application/octet-stream")
            if ref.get("sha256") in bad:
                out.append(Attachment(what, str(ref.get("name") or media),
                                      size_text(ref.get("size")), None, False, damaged=True))
                continue
            out.append(Attachment(what, str(ref.get("name") or media), size_text(ref.get(
                "size")), f"{base}/blob/{ref.get('sha256')}",
                what == "image" and media in INLINE_IMAGES))
            continue
        url = str(inner.get("url") or inner.get("file_data") or "")
        if url.startswith("data:"):
            media = url[5:].split(";", 1)[0].split(",", 1)[0].lower()
            payload = url.split(",", 1)[-1]
            size = len(payload) * 3 // 4 - len(payload) + len(payload.rstrip("="))
            out.append(Attachment(what, str(part.get("name") or inner.get("filename") or media),
                                  size_text(size), f"{base}/part/{label}/{i}",
                                  what == "image" and media in INLINE_IMAGES))
        else:  # an image by URL: named, never fetched by the page (the CSP says so too)
            out.append(Attachment(what, url or "?", "", None, False,
                                  external=url if _markdown.safe_url(url) else None))
    return out


def _body(msg: Message) -> Markup:
    text = msg.text
    if isinstance(msg.content, list):
        text = "\n\n".join(str(p.get("text", "")) for p in msg.content
                           if p.get("type") == "text")
        unknown = [str(p.get("type")) for p in msg.content
                   if p.get("type") not in ("text", "image_url", "file")]
        if unknown:
            text += "\n\n" + " ".join(f"`[{kind} part]`" for kind in unknown)
    if msg.role in ("tool", "event"):
        return Markup("<pre>") + _markdown.plain(text) + Markup("</pre>")
    return Markup(_markdown.render(text))


def _duration(start: str, end: str) -> str | None:
    try:
        a = datetime.fromisoformat(start.replace("Z", "+00:00"))
        b = datetime.fromisoformat(end.replace("Z", "+00:00"))
    except ValueError:
        return None
    seconds = (b - a).total_seconds()
    return f"{seconds:.2f} s" if seconds >= 0 else None


@dataclass
class Page:
    conversation: Conversation
    items: list[Item]
    page: int
    pages: int
    upstream_error: dict[str, Any] | None
    interrupted: str | None = None  # how the last turn was left, as `Chat` reads it
    cut: str | None = None  # why the last reply stopped early


def build(conv: Conversation, base: str, page: int, bad_blobs: set[str] | None = None,
          per_page: int = MESSAGES_PER_PAGE) -> Page:
    """Page ``page`` (from 1) of the conversation's messages, the partial reply last."""
    messages = list(conv.messages)
    results: dict[str, Message] = {m.tool_call_id: m for m in messages
                                   if m.role == "tool" and m.tool_call_id}
    calls_made = {str(c.get("id")) for m in messages for c in m.tool_calls or ()}
    visible = {m.seq for m in shown(messages)}
    hider: dict[int, int] = {}
    for m in messages:
        op = (m.extra or {}).get(EVENT) if m.role == "event" else None
        if isinstance(op, dict) and op.get("op") == "pop" and isinstance(op.get("seq"), int):
            hider.setdefault(op["seq"], m.seq)
        elif isinstance(op, dict) and op.get("op") == "clear":
            for earlier in messages:
                if earlier.seq < m.seq:
                    hider.setdefault(earlier.seq, m.seq)
    turns: dict[str, Message] = {}
    for m in messages:
        if m.role == "user":
            turns.setdefault(m.turn_id, m)
    records = {str(r["turn_id"]): r for r in requests_of(conv)}
    total = len(messages) + (1 if conv.partial is not None else 0)
    pages = max(1, -(-total // per_page))
    page = min(max(1, page), pages)
    chosen = messages[(page - 1) * per_page:page * per_page]
    if conv.partial is not None and page == pages:
        chosen = [*chosen, conv.partial]
    names: dict[str, str] = {str(c.get("id")): str((c.get("function") or {}).get("name"))
                             for m in messages for c in m.tool_calls or ()}
    items = []
    for msg in chosen:
        partial = conv.partial is not None and msg is conv.partial
        if msg.role == "tool" and msg.tool_call_id in calls_made and not partial:
            continue  # shown folded under its call
        items.append(_item(msg, base, results, names, turns, partial, bad_blobs or set(),
                           None if msg.seq in visible or msg.role == "event"
                           else hider.get(msg.seq), records))
    error = conv.metadata.get("last_upstream_error")
    left = interrupted_turn(conv)
    cut = cut_short_reply(conv)
    # metadata is outside the chain (an import, an older writer): shown only as it is meant
    error = {k: str((error or {}).get(k, "?")) for k in ("status", "turn_id", "detail")} \
        if isinstance(error, dict) else None
    return Page(conv, items, page, pages, error,
                left.describe() if left is not None else None,
                CUT_REASONS.get(str(cut.finish_reason)) if cut is not None else None)


def _item(msg: Message, base: str, results: dict[str, Message], names: dict[str, str],
          turns: dict[str, Message], partial: bool, bad: set[str],
          hidden_by: int | None, records: dict[str, dict[str, Any]]) -> Item:
    who: str = msg.role
    if msg.role == "tool":
        who = " ".join(x for x in ("tool", msg.name or names.get(str(msg.tool_call_id))) if x)
    mark = MARKED.get(msg.status)
    if msg.role == "tool" and msg.status == "partial":
        mark = STARTED
    if partial:
        mark = "partial: cut off (saved while streaming; not yet in the chain)"
    label = "partial" if partial else str(msg.seq)
    item = Item(msg.seq, msg.role, who, msg.created_at, msg.status, mark, _body(msg),
                _attachments(base, msg, label, bad), usage=msg.usage, hidden_by=hidden_by,
                partial=partial)
    for call in msg.tool_calls or ():
        function = call.get("function") or {}
        result = results.get(str(call.get("id")))
        if result is None:
            state = "no result (interrupted)"
        elif result.status == "partial":
            state = "started: it may have run; no result was stored"
        elif result.status == "unknown":
            state = "outcome unknown: interrupted, it may or may not have run"
        else:
            state = result.status
        item.calls.append(Call(str(call.get("id")), str(function.get("name")),
                               _json_text(str(function.get("arguments", ""))), state,
                               None if result is None else result.text,
                               None if result is None else result.seq))
    if msg.role == "event":
        op = (msg.extra or {}).get(EVENT)
        if isinstance(op, dict):
            item.event = f"pop: hides message seq {op.get('seq')}" if op.get("op") == "pop" \
                else "clear: hides every earlier message" if op.get("op") == "clear" \
                else f"{op.get('op')}"
    if msg.role == "assistant":
        asked = turns.get(msg.turn_id)
        row = records.get(msg.turn_id, {})  # the one reading of request records
        options = row.get("options")
        millis = row.get("duration_ms")
        record: dict[str, Any] = {
            "model": msg.model, "requested model": msg.requested_model or row.get("model"),
            "options": json.dumps(options, sort_keys=True, ensure_ascii=False)
            if options else None,
            "finish reason": msg.finish_reason,
            "upstream status": row.get("status"),
            "upstream request id": row.get("upstream_request_id"),
            "duration": f"{millis / 1000:.2f} s" if isinstance(millis, (int, float))
            else _duration(asked.created_at, msg.created_at) if asked is not None else None}
        item.request = {k: v for k, v in record.items() if v is not None}
    return item
