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

How the clients name their conversation (``identity``):

- ``header`` (the default): each request carries ``X-Chatstate-Conversation``.
- ``url``: each client's base URL names it (``http://HOST:PORT/c/<id>/v1``), for
  clients that take a base URL and nothing else.
- ``none``: no id at all. The proxy runs with two client tokens and each client sends
  one of them; the proxy finds the conversation by its history within that token's
  namespace and hands its id back in the response header, which is the id the check
  then loads. Since a header-less retry could store the user's message in a second
  conversation, the check then counts the run's user messages across every
  conversation the run made (found by their titles, which carry the run id).
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
from chatstate.drill.serve_apis import WireApi, wire_api

SERVING = re.compile(r"serving on (http://\S+/v1)")
IDENTITIES = ("header", "url", "none")
CONVERSATION_HEADER = "X-Chatstate-Conversation"  # serve's (not imported: no serve extra)


@dataclass
class ServeDrillResult:
    store: str
    identity: str = "header"
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
    api: str = "chat"  # the wire API the clients spoke (serve_apis)

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
    identity: str = "header"
    token: str | None = None  # with identity "none": the client token it sends
    conversation: str | None = None  # the id the proxy last handed back (identity "none")

    @property
    def stored_id(self) -> str | None:
        """The id under which this client's conversation is stored, as far as it knows."""
        return self.conversation if self.identity == "none" else self.cid


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


def _turn(base: str, client: _Client, text: str, api: WireApi | None = None) -> None:
    import httpx2

    api = api or wire_api("chat")
    client.received, client.done, client.refused = "", False, None
    body = api.body(client.history, text)
    headers: dict[str, str] = {}
    if client.identity == "header":
        headers[CONVERSATION_HEADER] = client.cid
    elif client.identity == "url":
        base = _with_conversation(base, client.cid)
    if client.token is not None:
        headers["Authorization"] = f"Bearer {client.token}"
    try:
        with httpx2.stream("POST", base + api.path, json=body, timeout=30,
                           headers=headers) as resp:
            if client.identity == "none" and resp.headers.get(CONVERSATION_HEADER):
                client.conversation = resp.headers[CONVERSATION_HEADER]
            if resp.status_code != 200:
                client.refused = f"HTTP {resp.status_code} {_error_text(resp.read())}"
                return
            for line in resp.iter_lines():
                delta, whole = api.read(line)
                client.received += delta
                client.done = client.done or whole
    except httpx2.HTTPError:
        pass  # the server was killed: what arrived so far is in client.received


def _with_conversation(base: str, cid: str) -> str:
    """``http://HOST:PORT/v1`` -> ``http://HOST:PORT/c/<cid>/v1``."""
    root, _, _ = base.rpartition("/v1")
    return f"{root}/c/{cid}/v1"


def _error_text(body: bytes) -> str:
    """``type: message`` of an OpenAI-style error body (the message cut to 300 chars)."""
    try:
        error = json.loads(body)["error"]
        return f"{error.get('type')}: {str(error.get('message'))[:300]}"
    except (ValueError, KeyError, TypeError):
        return repr(body[:300])


def _check(url: str, clients: list[_Client], texts: dict[str, str],
           result: ServeDrillResult, run: str | None = None) -> None:
    """Check every client's conversation; with ``run`` (header-less clients) also count
    each trial text across all the run's conversations, so a retry stored in a second
    conversation is a duplicate too."""
    from chatstate.errors import ChatstateError, ConversationNotFound
    from chatstate.stores import open_store

    store = open_store(url, allow_ephemeral=True)
    try:
        if run is not None:
            _check_across(store, run, clients, texts, result)
        for client in clients:
            text = texts[client.cid]
            cid = client.stored_id
            try:
                if cid is None:
                    raise ConversationNotFound(client.cid)
                conv = store.load(cid)
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


def run_conversations(store: Any, run: str) -> list[str]:
    """The ids of the conversations a drill run made (their titles name the run)."""
    return [row.id for row in store.list_conversations() if f"drill-serve-{run}-" in row.title]


def _check_across(store: Any, run: str, clients: list[_Client], texts: dict[str, str],
                  result: ServeDrillResult) -> None:
    counts: dict[str, int] = {}
    wanted = {texts[c.cid] for c in clients}
    for cid in run_conversations(store, run):
        conv = store.load(cid)
        for m in conv.messages:
            if m.role == "user" and m.text in wanted:
                counts[m.text] = counts.get(m.text, 0) + 1
    for text, n in sorted(counts.items()):
        if n > 1:
            result.duplicated += 1
            result.problems.append(f"the user message {text!r} is stored {n} times across "
                                   "the run's conversations")


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
                    identity: str = "header",
                    progress: Callable[[ServeDrillResult], None] | None = None,
                    api: str = "chat") -> ServeDrillResult:
    """Kill ``chatstate serve`` ``trials`` times under ``clients`` concurrent streams of
    the wire API ``api`` (``chat``, ``responses`` or ``anthropic``) whose conversations
    are named by ``identity`` (one of IDENTITIES)."""
    from chatstate.errors import ConversationNotFound
    from chatstate.stores import open_store
    from chatstate.testing import FakeModel

    rng = random.Random(seed)
    if identity not in IDENTITIES:
        raise ValueError(f"identity {identity!r}: use one of {', '.join(IDENTITIES)}")
    wire = wire_api(api)
    result = ServeDrillResult(store=redact_url(url), identity=identity, api=api)
    run = secrets.token_hex(3)
    tokens = [secrets.token_urlsafe(16) for _ in range(2)] if identity == "none" else []
    people = [_Client(f"drill-serve-{run}-{n}", identity=identity,
                      token=tokens[n % 2] if tokens else None) for n in range(clients)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "CHATSTATE_"))}
    env["CHATSTATE_ALLOW_EPHEMERAL"] = "1"  # the caller ran the durability guard already
    if tokens:
        env["CHATSTATE_SERVE_TOKENS"] = ",".join(tokens)  # not in ps
    started = time.monotonic()
    with FakeModel(reply_words=40, chunk_delay=0.01) as fake:
        try:
            for trial in range(trials):
                proc, base = _start_server(url, fake.base_url, env)
                texts = {c.cid: c.pending or f"turn {trial} of {c.cid}" for c in people}
                threads = [threading.Thread(target=_turn, args=(base, c, texts[c.cid], wire))
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
                _check(url, people, texts, result, run if identity == "none" else None)
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
                ids = {c.cid for c in people} | set(run_conversations(store, run))
                for cid in sorted(ids):
                    with contextlib.suppress(ConversationNotFound):  # killed before a write
                        store.delete(cid)
            finally:
                store.close()
    result.seconds = time.monotonic() - started
    return result


def render_serve(results: list[ServeDrillResult]) -> str:
    header = ["store", "identity", "api", "trials", "kills", "requests", "turns received whole",
              "cut turns kept partial", "lost", "duplicated", "corrupt", "seconds"]
    lines = [" | ".join(header)]
    for r in results:
        lines.append(" | ".join(str(v) for v in (
            r.store, r.identity, r.api, r.trials, r.kills, r.requests, r.acked_turns,
            r.partials, r.lost, r.duplicated, r.corrupt, f"{r.seconds:.1f}")))
    for r in results:
        lines += [f"problem ({r.store}): {p}" for p in r.problems[:20]]
    return "\n".join(lines)
