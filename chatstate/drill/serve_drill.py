"""``chatstate drill --serve``: kill -9 the proxy under load, again and again.

Each trial starts ``chatstate serve`` on the store, in front of the fake model,
and runs CLIENTS streamed conversations through it at once; at a random moment
the server gets SIGKILL. Then, from a fresh open of the store: every
conversation loads and verifies; every turn a client received whole is stored,
once; the text a client received of the cut turn is a prefix of what the store
holds for it. The next trial's clients carry on: a client whose turn was cut
sends the same request again, which must answer that turn rather than store the
user's message twice, and must be answered at all: a killed proxy's writer leases
must not lock its conversations out of the next one.

``api`` picks the wire API the clients speak: ``chat_completions``, ``responses``
(``/v1/responses``, done at ``response.completed``) or ``anthropic_messages``
(``/v1/messages``, done at ``message_stop``).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from chatstate.core.redact import redact_url

SERVING = re.compile(r"serving on (http://\S+/v1)")


@dataclass
class ServeDrillResult:
    store: str
    trials: int = 0
    kills: int = 0
    requests: int = 0
    acked_turns: int = 0
    partials: int = 0
    lost: int = 0
    duplicated: int = 0
    corrupt: int = 0
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicated or self.corrupt or self.problems)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


@dataclass
class _Client:
    cid: str
    history: list[dict[str, str]] = field(default_factory=list)  # acknowledged turns only
    pending: str | None = None  # the user text of a turn that was cut
    received: str = ""
    done: bool = False
    refused: str | None = None  # the proxy's answer when it was not a stream


def _start_server(url: str, upstream: str, env: dict[str, str]) -> tuple[subprocess.Popen[str],
                                                                         str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "chatstate", "--store", url, "serve", "--upstream", upstream,
         "--port", "0"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    for line in proc.stderr:
        match = SERVING.search(line)
        if match:
            threading.Thread(target=proc.stderr.read, daemon=True).start()
            return proc, match.group(1)
    raise RuntimeError(f"chatstate serve did not start (exit {proc.wait()})")


APIS = {"chat_completions": "/chat/completions", "responses": "/responses",
        "anthropic_messages": "/messages"}


def _fold(api: str, client: _Client, line: str) -> None:
    """Fold one SSE line of ``api`` into what the client received."""
    if api == "chat_completions" and line == "data: [DONE]":
        client.done = True
    if not line.startswith("data: {"):
        return
    chunk = json.loads(line[6:])
    kind = chunk.get("type")
    if api == "chat_completions":
        if chunk.get("choices"):
            client.received += chunk["choices"][0]["delta"].get("content") or ""
    elif api == "responses":
        if kind == "response.output_text.delta":
            client.received += chunk["delta"]
        client.done = client.done or kind == "response.completed"
    else:
        if kind == "content_block_delta" and chunk["delta"].get("type") == "text_delta":
            client.received += chunk["delta"]["text"]
        client.done = client.done or kind == "message_stop"


def _turn(base: str, client: _Client, text: str, api: str = "chat_completions") -> None:
    import httpx2

    client.received, client.done, client.refused = "", False, None
    history = [*client.history, {"role": "user", "content": text}]
    body: dict[str, Any] = {"model": "m", "stream": True}
    if api == "responses":
        body["input"] = history
    else:
        body["messages"] = history
    if api == "anthropic_messages":
        body["max_tokens"] = 1000
    try:
        with httpx2.stream("POST", base + APIS[api], json=body, timeout=30,
                           headers={"X-Chatstate-Conversation": client.cid}) as resp:
            if resp.status_code != 200:
                client.refused = f"HTTP {resp.status_code} {_error_text(resp.read())}"
                return
            for line in resp.iter_lines():
                _fold(api, client, line)
    except httpx2.HTTPError:
        pass  # the server was killed: what arrived so far is in client.received


def _error_text(body: bytes) -> str:
    """``type: message`` of an OpenAI-style error body (the message cut to 300 chars)."""
    try:
        error = json.loads(body)["error"]  # OpenAI's and Anthropic's both have one
        return f"{error.get('type')}: {str(error.get('message'))[:300]}"
    except (ValueError, KeyError, TypeError):
        return repr(body[:300])


def _check(url: str, clients: list[_Client], texts: dict[str, str],
           result: ServeDrillResult) -> None:
    from chatstate.errors import ChatstateError, ConversationNotFound
    from chatstate.stores import open_store

    store = open_store(url, allow_ephemeral=True)
    try:
        for client in clients:
            text = texts[client.cid]
            try:
                conv = store.load(client.cid)
            except ConversationNotFound:
                if client.history or client.received:
                    result.lost += 1
                    result.problems.append(f"{client.cid}: missing after the kill")
                continue
            except ChatstateError as exc:
                result.corrupt += 1
                result.problems.append(f"{client.cid}: {exc}")
                continue
            if conv.verify() is not None:
                result.corrupt += 1
                result.problems.append(f"{client.cid}: chain broken at seq {conv.verify()}")
            _check_conversation(conv, client, text, result)
    finally:
        store.close()


def _check_conversation(conv: Any, client: _Client, text: str,
                        result: ServeDrillResult) -> None:
    visible = [{"role": m.role, "content": m.text} for m in conv.messages
               if m.status != "partial"]
    acked = client.history + ([{"role": "user", "content": text},
                               {"role": "assistant", "content": client.received}]
                              if client.done else [])
    if visible[:len(acked)] != acked:
        result.lost += 1
        result.problems.append(f"{conv.id}: an acknowledged turn is not stored as received")
    users = [m for m in conv.messages if m.role == "user" and m.text == text]
    if len(users) > 1:
        result.duplicated += 1
        result.problems.append(f"{conv.id}: the user message {text!r} is stored "
                               f"{len(users)} times")
    if not client.done and client.received:
        cut = conv.partial or (conv.messages[-1] if conv.messages else None)
        if cut is None or cut.role != "assistant" or not cut.text.startswith(client.received):
            result.lost += 1
            result.problems.append(f"{conv.id}: {len(client.received)} chars were relayed "
                                   "but are not stored")
        elif conv.partial is not None or cut.status == "partial":
            result.partials += 1


def run_serve_drill(url: str, *, trials: int = 20, clients: int = 8, seed: int | None = None,
                    progress: Callable[[ServeDrillResult], None] | None = None,
                    api: str = "chat_completions") -> ServeDrillResult:
    """Kill ``chatstate serve`` ``trials`` times under ``clients`` concurrent streams of
    the wire API ``api``."""
    if api not in APIS:
        raise ValueError(f"unknown api {api!r} for the serve drill; use one of "
                         f"{', '.join(APIS)}")
    from chatstate.errors import ConversationNotFound
    from chatstate.stores import open_store
    from chatstate.testing import FakeModel

    rng = random.Random(seed)
    result = ServeDrillResult(store=redact_url(url))
    run = secrets.token_hex(3)
    people = [_Client(f"drill-serve-{run}-{n}") for n in range(clients)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "CHATSTATE_"))}
    env["CHATSTATE_ALLOW_EPHEMERAL"] = "1"  # the caller ran the durability guard already
    started = time.monotonic()
    with FakeModel(reply_words=40, chunk_delay=0.01) as fake:
        try:
            for trial in range(trials):
                proc, base = _start_server(url, fake.base_url, env)
                texts = {c.cid: c.pending or f"turn {trial} of {c.cid}" for c in people}
                threads = [threading.Thread(target=_turn, args=(base, c, texts[c.cid], api))
                           for c in people]
                for t in threads:
                    t.start()
                deadline = time.monotonic() + 30  # kill once the streams are under way
                while not any(c.received for c in people) and time.monotonic() < deadline:
                    time.sleep(0.005)
                time.sleep(rng.uniform(0.0, 0.8))
                proc.send_signal(signal.SIGKILL)
                proc.wait(30)
                for t in threads:
                    t.join(60)
                result.trials += 1
                result.kills += 1
                result.requests += len(people)
                _check(url, people, texts, result)
                for c in people:
                    if c.refused is not None:
                        result.problems.append(f"{c.cid}: trial {trial}: the proxy answered "
                                               f"{c.refused}")
                    if c.done:
                        result.acked_turns += 1
                        c.history += [{"role": "user", "content": texts[c.cid]},
                                      {"role": "assistant", "content": c.received}]
                        c.pending = None
                    else:
                        c.pending = texts[c.cid]
                if progress is not None:
                    progress(result)
        finally:
            store = open_store(url, allow_ephemeral=True)
            try:
                for c in people:
                    with contextlib.suppress(ConversationNotFound):  # killed before a write
                        store.delete(c.cid)
            finally:
                store.close()
    result.seconds = time.monotonic() - started
    return result


def render_serve(results: list[ServeDrillResult]) -> str:
    header = ["store", "trials", "kills", "requests", "turns received whole",
              "cut turns kept partial", "lost", "duplicated", "corrupt", "seconds"]
    lines = [" | ".join(header)]
    for r in results:
        lines.append(" | ".join(str(v) for v in (
            r.store, r.trials, r.kills, r.requests, r.acked_turns, r.partials, r.lost,
            r.duplicated, r.corrupt, f"{r.seconds:.1f}")))
    for r in results:
        lines += [f"problem ({r.store}): {p}" for p in r.problems[:20]]
    return "\n".join(lines)
