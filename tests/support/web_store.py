"""A store for the web view's tests: rich, hostile, damaged, forked and many plain
conversations, and ``chatstate web`` run on it as a real process on loopback."""

from __future__ import annotations

import base64
import contextlib
import re
import struct
import subprocess
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from chatstate.core.content import file, image, store_parts, text
from chatstate.core.events import event_message
from chatstate.core.transcript import Conversation, Message
from chatstate.ops.fork import fork
from chatstate.stores import open_store
from support.cli_helpers import CHATSTATE
from support.stores import damage_blob, tamper


def _png(width: int, height: int) -> bytes:
    """A small real PNG: a blue-to-orange stripe pattern (no imaging library needed)."""
    rows = b"".join(b"\0" + b"".join(bytes((40 + 3 * x, 90, 220 - 2 * x)) if (x // 8 + y // 8) % 2
                                       else bytes((240, 160, 60)) for x in range(width))
                    for y in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(
            ">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2,
                                                                0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


PNG = _png(64, 40)
SVG = (b'<svg xmlns="http://www.w3.org/2000/svg" onload="alert(\'svg-onload\')">'
       b'<script>alert("svg-script")</script><circle r="5"/></svg>')
HOSTILE_TEXT = ('<script>alert("message-script")</script> <img src=x onerror="alert(\'img\')">'
                "\n\n[click me](javascript:alert('js-link')) "
                "[data link](data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==)"
                " ![pic](javascript:alert('js-img'))\n\n<iframe src=\"javascript:alert(1)\">"
                "</iframe>")
CODE_REPLY = ("Here is the code:\n\n```python\ndef greet(name):\n    return f'hi {name}'\n```"
              "\n\nand **bold** text.")
SERVING = re.compile(r"web view on (http://\S+/)")


def _append(store: Any, conv: Conversation, *items: dict[str, Any]) -> None:
    prev = conv.last
    sealed = []
    for item in items:
        item = dict(item)
        prev = Message.seal(prev, **item)
        sealed.append(prev)
    store.append(conv.id, sealed)
    conv.messages.extend(sealed)


def _new(store: Any, cid: str, title: str, created: str = "2026-11-20T10:00:00Z",
         **metadata: Any) -> Conversation:
    conv = Conversation(id=cid, title=title, created_at=created, updated_at=created,
                        metadata=metadata)
    store.create(conv)
    return conv


def populate(url: str, plain: int = 60) -> dict[str, str]:
    """Fill the store at ``url``; what it holds (names -> ids and digests)."""
    store = open_store(url)
    try:
        return _populate(url, store, plain)
    finally:
        store.close()


def _populate(url: str, store: Any, plain: int) -> dict[str, str]:
    for i in range(plain):
        conv = _new(store, f"plain-{i:03d}", f"plain conversation {i}",
                    f"2026-10-{1 + i % 28:02d}T09:00:00Z")
        model = "model-a" if i % 2 else "model-b"
        _append(store, conv,
                {"role": "user", "content": f"question number {i} about walruses" if i == 7
                 else f"question number {i}", "turn_id": f"t{i}",
                 "created_at": f"2026-10-{1 + i % 28:02d}T09:00:00Z"},
                {"role": "assistant", "content": f"answer {i}", "turn_id": f"t{i}",
                 "model": model, "usage": {"prompt_tokens": 10 + i, "completion_tokens": 5},
                 **({"finish_reason": "length"} if i == 3 else {}),
                 "created_at": f"2026-10-{1 + i % 28:02d}T09:00:02Z"})
    rich = _new(store, "rich", "a rich conversation")
    parts = store_parts(store, [text("What is in this picture?"),
                                image(PNG, media_type="image/png", name="red.png"),
                                file(b"%PDF-1.4 fake", media_type="application/pdf",
                                     name="report.pdf")])
    _append(store, rich,
            {"role": "user", "content": parts, "turn_id": "r1", "params": {"temperature": 0.2},
             "created_at": "2026-11-20T10:00:00Z"},
            {"role": "assistant", "content": CODE_REPLY, "turn_id": "r1", "model": "model-a",
             "usage": {"prompt_tokens": 120, "completion_tokens": 40},
             "created_at": "2026-11-20T10:00:01.500000Z"},
            {"role": "user", "content": "weather in Oslo, and mail it", "turn_id": "r2",
             "created_at": "2026-11-20T10:01:00Z"},
            {"role": "assistant", "content": "", "turn_id": "r2", "model": "model-a",
             "usage": {"prompt_tokens": 200, "completion_tokens": 12},
             "created_at": "2026-11-20T10:01:01Z", "tool_calls": [
                 {"id": "call_w", "type": "function", "function": {
                     "name": "get_weather", "arguments": '{"city":"Oslo"}'}},
                 {"id": "call_m", "type": "function", "function": {
                     "name": "send_email", "arguments": '{"to":"a@b.c"}'}},
                 {"id": "call_c", "type": "function", "function": {
                     "name": "charge_card", "arguments": '{"cents":500}'}}]},
            {"role": "tool", "content": "rain, 4 C", "tool_call_id": "call_w", "turn_id": "r2",
             "name": "get_weather", "created_at": "2026-11-20T10:01:02Z"},
            {"role": "tool", "content": "interrupted", "tool_call_id": "call_m",
             "turn_id": "r2", "status": "unknown", "created_at": "2026-11-20T10:01:03Z"},
            {"role": "tool", "content": "", "tool_call_id": "call_c", "turn_id": "r2",
             "name": "charge_card", "status": "partial", "created_at": "2026-11-20T10:01:04Z"},
            {"role": "user", "content": "tell me a long story", "turn_id": "r3",
             "created_at": "2026-11-20T10:02:00Z"})
    store.save_partial("rich", Message(seq=len(rich.messages), role="assistant",
                                       content="Once upon a time", turn_id="r3",
                                       status="partial", model="model-a",
                                       created_at="2026-11-20T10:02:01Z"))
    svg = store.put_blob(SVG, media_type="image/svg+xml", name="evil.svg")
    hostile = _new(store, "hostile", 'hostile content <script>alert("title")</script>')
    _append(store, hostile,
            {"role": "user", "content": [text(HOSTILE_TEXT),
                                         {"type": "image_url", "image_url": {}, "blob": svg},
                                         image("data:image/svg+xml;base64," +
                                               base64.b64encode(SVG).decode()),
                                         {"type": "image_url",
                                          "image_url": {"url": "javascript:alert('part')"}}],
             "turn_id": "h1", "created_at": "2026-11-21T10:00:00Z"},
            {"role": "assistant", "content": HOSTILE_TEXT, "turn_id": "h1", "model": "model-b",
             "usage": {"prompt_tokens": 5, "completion_tokens": 5},
             "created_at": "2026-11-21T10:00:01Z"})
    events = _new(store, "events", "events conversation")
    _append(store, events, {"role": "user", "content": "first", "turn_id": "e1",
                            "created_at": "2026-11-22T10:00:00Z"},
            {"role": "assistant", "content": "second", "turn_id": "e1", "model": "model-b",
             "created_at": "2026-11-22T10:00:01Z"})
    pop = event_message(events.last, "pop", "e2", seq=1)
    store.append("events", [pop])
    events.messages.append(pop)
    child = fork(store, "rich", at=1)
    damaged = _new(store, "damaged", "a damaged conversation")
    _append(store, damaged, *({"role": "user" if i % 2 == 0 else "assistant",
                               "content": f"msg {i}", "turn_id": f"d{i}",
                               "created_at": "2026-11-23T10:00:00Z"} for i in range(4)))
    tamper(url, store, "damaged", 2)
    badblob = _new(store, "badblob", "a conversation whose blob was altered")
    big = store_parts(store, [image(PNG + b"\0" * 70_000, media_type="image/png",
                                    name="big.png")])
    _append(store, badblob, {"role": "user", "content": big, "turn_id": "b1",
                             "created_at": "2026-11-23T11:00:00Z"})
    sha = big[0]["blob"]["sha256"] if isinstance(big, list) else ""
    damage_blob(store, url, sha, "altered")
    return {"fork": child.id, "badblob_sha": sha}


class WebProcess:
    """``chatstate --store URL web --port 0 ARGS`` as a subprocess; its root URL."""

    facts: dict[str, str]  # what ``populate`` made
    store_url: str

    def __init__(self, store: str, env: dict[str, str], *args: str) -> None:
        self.store_url = store
        self.facts = {}
        self.proc = subprocess.Popen([CHATSTATE, "--store", store, "web", "--port", "0", *args],
                                     env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        self.lines: list[str] = []
        self.url = ""
        ready = threading.Event()

        def pump() -> None:
            assert self.proc.stderr is not None
            for line in self.proc.stderr:
                self.lines.append(line.rstrip("\n"))
                match = SERVING.search(line)
                if match:
                    self.url = match.group(1).rstrip("/")
                    ready.set()
            ready.set()

        threading.Thread(target=pump, daemon=True).start()
        if not ready.wait(60) or not self.url:
            self.stop()
            raise RuntimeError("chatstate web did not start:\n" + "\n".join(self.lines))

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def store_url(base: Path) -> str:
    return f"sqlite://{base}/web.db"


@contextlib.contextmanager
def populated_web(base: Path, env: dict[str, str]) -> Iterator[WebProcess]:
    """``chatstate web`` on a fresh ``populate``d sqlite store under ``base``."""
    url = store_url(base)
    facts = populate(url)
    proc = WebProcess(url, env)
    proc.facts = facts
    try:
        yield proc
    finally:
        proc.stop()
