"""Salvage: the verified prefix of a damaged transcript, as a new conversation.

Reads what a store's `repair` moved aside (a json store's file, the row dump of the
sqlite and postgresql stores), an export, or a file that no longer parses whole (cut
short, or with bytes appended): every complete message it can still read, in seq order,
up to the first that is missing, unreadable or breaks the hash chain. What follows the
break is not guessed at. The damaged file itself is only read, never written.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from chatstate.core.transcript import Conversation, Message, validate_id, verify_chain
from chatstate.errors import InvalidInput


@dataclass
class Salvaged:
    conversation: Conversation  # header (id, title, created_at) and the verified messages
    found: int  # messages that could be read at all
    stopped: str | None  # why the prefix ends where it does (None: all of it verified)


def salvage_file(path: Path, new_id: str | None = None) -> Salvaged:
    """The verified prefix of the transcript in ``path``; InvalidInput if nothing is there."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise InvalidInput(f"{path}: cannot salvage: not readable ({exc})") from exc
    header, bodies = _read(raw.decode("utf-8", "replace"))
    messages: list[Message] = []
    stopped: str | None = None
    for seq, body in enumerate(sorted(bodies, key=_seq_of)):
        if _seq_of(body) != seq:
            stopped = f"seq {seq} is missing"
            break
        try:
            messages.append(Message.model_validate(body))
        except ValidationError:
            stopped = f"seq {seq} is not a readable message"
            break
    bad = verify_chain(messages)
    if bad is not None:
        stopped = f"the hash chain breaks at seq {bad}"
        messages = messages[:bad]
    if not bodies:
        raise InvalidInput(f"{path}: cannot salvage: no message of a chatstate transcript "
                           "could be read from it")
    cid = new_id or f"{header.get('id') or path.stem.split('.')[0]}-salvaged"
    conv = Conversation(id=validate_id(cid), title=str(header.get("title") or ""),
                        metadata={"salvaged_from": str(path)})
    conv.messages = messages
    return Salvaged(conv, len(bodies), stopped)


def _seq_of(body: dict[str, Any]) -> int:
    seq = body.get("seq")
    return seq if isinstance(seq, int) else -1


def _read(text: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(header, message bodies) from a whole or damaged document or a row dump."""
    text = text.lstrip()
    try:
        doc, end = json.JSONDecoder().raw_decode(text)
    except ValueError:
        doc, end = None, 0
    if isinstance(doc, dict):
        if isinstance(doc.get("database"), str):  # a relational store's row dump
            return _from_rows(doc)
        if isinstance(doc.get("messages"), list):
            # the json store's append log may follow the document: one record a line
            more = _lines(text[end:])[1]
            return doc, [m for m in doc["messages"] if _is_message(m)] + more
    # Cut short or garbled: the stores write one message per line, so read line by line.
    return _lines(text)


def _lines(text: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A document's lines (one message each) and log records, each read on its own."""
    header: dict[str, Any] = {}
    bodies: list[dict[str, Any]] = []
    # at "\n" only: the stores write UTF-8 as it is, so U+2028, U+2029 and U+0085, where
    # str.splitlines also ends a line, stand raw inside a message's line
    for line in text.split("\n"):
        line = line.strip().rstrip(",")
        if "\t" in line:  # a log record: the record, a tab, its checksum
            line = line.rsplit("\t", 1)[0]
        elif line.startswith('{"schema"'):
            header = _fields(line)
            continue
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if _is_message(item):
            bodies.append(item)
        elif isinstance(item, dict) and isinstance(item.get("messages"), list):
            bodies += [m for m in item["messages"] if _is_message(m)]
    return header, bodies


def _from_rows(dump: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    head = dump.get("conversation") or []
    header = {"id": head[0] if head else None,
              "title": head[1] if len(head) > 1 and isinstance(head[1], str) else ""}
    bodies = []
    for row in dump.get("messages") or []:
        try:
            body = json.loads(row[1]) if isinstance(row[1], str) else row[1]
        except (ValueError, IndexError, TypeError):
            continue
        if isinstance(body, dict):
            body.setdefault("seq", row[0])
            body.setdefault("hash", row[2] if len(row) > 2 else None)
            if _is_message(body):
                bodies.append(body)
    return header, bodies


def _fields(line: str) -> dict[str, Any]:
    """id and title from a document's first line, even when the rest of it is gone."""
    out: dict[str, Any] = {}
    for key in ("id", "title"):
        marker = f'"{key}":'
        at = line.find(marker)
        if at >= 0:
            with contextlib.suppress(ValueError):
                out[key], _ = json.JSONDecoder().raw_decode(line[at + len(marker):])
    return out


def _is_message(item: object) -> bool:
    return isinstance(item, dict) and "seq" in item and "role" in item
