"""Fitting a request to the model's context window. The store keeps everything.

The transcript is never trimmed: only the message list of one request is.
What is sent:

1. the system messages (instructions) that precede the kept turns;
2. the newest summary (a system message whose ``params`` carry
   ``{"summary": {"covers_to_seq": S}}``), standing in for every turn up to S;
3. as many of the most recent complete turns as fit, oldest first.

A turn is the run of messages sharing a ``turn_id``. A ``tool`` message, and
whatever follows an assistant message carrying ``tool_calls``, belong to the
turn before them, so a tool call is never sent without its result. A turn is
sent whole or not at all; the newest turn (the one being answered) is always
sent, even when it alone is too big: the provider then says so.

Counting: an assistant reply whose provider reported ``completion_tokens``
counts that; every other text is estimated conservatively as
``max(words, ceil(UTF-8 bytes / 3))`` (real tokenizers average about four
bytes per token of English), plus ``MESSAGE_OVERHEAD`` per message. tiktoken
is used instead of the estimate when it is installed *and* its encoding file
is already cached: nothing is ever downloaded.

The window: an explicit one (``Chat(context_window=N)``, ``--context-window``,
``CHATSTATE_CONTEXT_WINDOW``), else the one learned from the provider for this
conversation (kept in its metadata under ``context_window``), else a small
table of common models, else none (nothing is trimmed until the provider
names its window in a 400). A learned window beats the table: the provider
said so.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from chatstate.core.transcript import Conversation, Message
    from chatstate.session.turn_writer import TurnWriter

ENV_WINDOW = "CHATSTATE_CONTEXT_WINDOW"


def keep_reference(part: dict[str, Any]) -> dict[str, Any]:
    """For counting: a part naming a stored blob, as it is (the blob is not read)."""
    return part


METADATA_KEY = "context_window"
SCALE_KEY = "token_scale"
"""Per model: the provider's token count over chatstate's estimate, learned from a 400."""
MESSAGE_OVERHEAD = 4
REPLY_RESERVE_MAX = 1024

# Prefix -> window. Longest prefix wins. Kept small on purpose: a wrong entry is
# corrected the first time the provider answers 400 (the learned window wins).
KNOWN_WINDOWS: dict[str, int] = {
    "gpt-4o": 128_000, "gpt-4.1": 1_047_576, "gpt-4-turbo": 128_000, "gpt-4": 8_192,
    "gpt-3.5-turbo": 16_385, "gpt-5": 400_000, "o1": 200_000, "o3": 200_000,
    "o4-mini": 200_000, "claude": 200_000, "llama3": 8_192, "llama-3.1": 128_000,
    "mistral-large": 128_000, "gemini-1.5": 1_000_000,
}

_WINDOW_PATTERNS = (
    re.compile(r"maximum context length is (\d+)", re.I),
    re.compile(r"context (?:length|window)(?: of| is|:)? (\d+)", re.I),
    re.compile(r"(\d+)[- ]token context", re.I),
)

T = TypeVar("T")
log = logging.getLogger("chatstate.context")


# -- counting ------------------------------------------------------------------------------

@lru_cache(maxsize=1)
def _tiktoken() -> Any:
    """An encoding when tiktoken and its cached file are present; None otherwise."""
    try:
        import hashlib
        import tempfile

        import tiktoken  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return None
    url = "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken"
    cache = (os.environ.get("TIKTOKEN_CACHE_DIR") or os.environ.get("DATA_GYM_CACHE_DIR")
             or os.path.join(tempfile.gettempdir(), "data-gym-cache"))
    if not os.path.exists(os.path.join(cache, hashlib.sha1(url.encode()).hexdigest())):
        return None  # get_encoding would download it: never at run time
    try:
        return tiktoken.get_encoding("o200k_base")
    except Exception:  # a damaged cache file: fall back to the estimate
        return None


def estimate_tokens(text: str) -> int:
    """Tokens in ``text``: tiktoken when available offline, else the conservative estimate."""
    encoding = _tiktoken()
    if encoding is not None:
        return len(encoding.encode(text, disallowed_special=()))
    return max(len(text.split()), math.ceil(len(text.encode("utf-8", "replace")) / 3))


def message_tokens(message: Message) -> int:
    """Tokens one stored message costs in a request."""
    usage = message.usage or {}
    known = usage.get("completion_tokens") if message.role == "assistant" else None
    if isinstance(known, int) and known >= 0:
        return known + MESSAGE_OVERHEAD
    wire = message.to_openai(blob=keep_reference)
    extra = {k: v for k, v in wire.items() if k not in ("role", "content")}
    content = wire.get("content")
    text = content if isinstance(content, str) else json.dumps(content)
    if extra:
        text += json.dumps(extra)
    return estimate_tokens(text) + MESSAGE_OVERHEAD


# -- the window ----------------------------------------------------------------------------

def known_window(model: str | None) -> int | None:
    if not model:
        return None
    name = model.lower().rsplit("/", 1)[-1]
    best = max((p for p in KNOWN_WINDOWS if name.startswith(p)), key=len, default=None)
    return KNOWN_WINDOWS[best] if best else None


def env_window() -> int | None:
    raw = os.environ.get(ENV_WINDOW, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 1:
        from chatstate.errors import InvalidOption

        raise InvalidOption(f"{ENV_WINDOW}={raw!r} is not a positive whole number of "
                            "tokens; unset it or use e.g. 8192")
    return int(raw)


def learned_window(metadata: Mapping[str, Any], model: str | None) -> int | None:
    learned = metadata.get(METADATA_KEY)
    value = learned.get(model or "") if isinstance(learned, Mapping) else None
    return value if isinstance(value, int) and value > 0 else None


def resolve_window(explicit: int | None, metadata: Mapping[str, Any],
                   model: str | None) -> int | None:
    return (explicit or env_window() or learned_window(metadata, model)
            or known_window(model))


def learned_scale(metadata: Mapping[str, Any], model: str | None) -> float:
    scales = metadata.get(SCALE_KEY)
    value = scales.get(model or "") if isinstance(scales, Mapping) else None
    return float(value) if isinstance(value, (int, float)) and value >= 1 else 1.0


def overflow_from_error(exc: BaseException) -> tuple[int | None, int | None]:
    """(window, prompt tokens) a provider's 400 names, as the adapter read them; either
    may be None (an unfamiliar wording names only the window, found by the patterns)."""
    if getattr(exc, "status", None) != 400:
        return None, None
    overflow = getattr(exc, "overflow", None)
    window, prompt = overflow if overflow is not None else (None, None)
    return window or window_from_error(exc), prompt


def window_from_error(exc: BaseException) -> int | None:
    """The window a provider's 400 names ("maximum context length is N tokens"), else None."""
    if getattr(exc, "status", None) != 400:
        return None
    text = f"{getattr(exc, 'provider_message', None) or ''} {exc}"
    for pattern in _WINDOW_PATTERNS:
        match = pattern.search(text)
        if match and int(match.group(1)) > 0:
            return int(match.group(1))
    return None


def with_learned(metadata: Mapping[str, Any], model: str | None, window: int) -> dict[str, Any]:
    """``metadata`` with ``window`` recorded for ``model`` (the caller stores it)."""
    learned = dict(metadata.get(METADATA_KEY) or {})
    learned[model or ""] = window
    return {**metadata, METADATA_KEY: learned}


# -- fitting -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Fit:
    """One request's message list and what it left out."""

    messages: list[Message]
    total: int  # complete messages in the transcript
    tokens: int  # the estimate for what is sent
    window: int | None
    summary: Message | None = None

    @property
    def trimmed(self) -> bool:
        return len(self.messages) < self.total

    def describe(self) -> str:
        via = " and a summary" if self.summary is not None else ""
        why = f"context window {self.window}" if self.window is not None else \
            "the summary stands in for the rest"  # a compaction, with no window known
        return f"sending the last {len(self.messages)} of {self.total} messages{via} ({why})"


def summary_covers(message: Message) -> int | None:
    """The last seq a summary message stands in for; None for any other message."""
    marker = (message.params or {}).get("summary") if message.role == "system" else None
    value = marker.get("covers_to_seq") if isinstance(marker, Mapping) else None
    return value if isinstance(value, int) else None


def turns(messages: Sequence[Message]) -> list[list[Message]]:
    """Group into turns: same turn_id, and tool results stay with their call."""
    groups: list[list[Message]] = []
    for m in messages:
        prev = groups[-1][-1] if groups else None
        joins = prev is not None and (
            m.turn_id in (prev.turn_id, groups[-1][0].turn_id) or m.role == "tool"
            or (prev.role == "assistant" and bool(prev.tool_calls)))
        if joins:
            groups[-1].append(m)
        else:
            groups.append([m])
    return groups


def fit(conversation: Conversation, window: int | None, *,
        reply_reserve: int | None = None, exclude: Collection[int] = (),
        scale: float = 1.0) -> Fit:
    """What to send for the next request of ``conversation`` under ``window``.

    ``exclude``: seqs never to send (e.g. unanswered user messages of earlier turns).
    ``scale``: how many tokens the provider counts per estimated token (learned).
    """
    from chatstate.core.events import (
        shown,  # lazy, as transcript (pydantic) is: keeps this import light
    )

    # Events (a framework's pop or clear) hide messages and are never sent themselves.
    complete = [m for m in shown(conversation.messages)
                if m.status != "partial" and m.seq not in exclude]
    summaries = [m for m in complete if summary_covers(m) is not None]
    summary = summaries[-1] if summaries else None
    covered = summary_covers(summary) if summary is not None else -1
    assert covered is not None
    body = [m for m in complete if summary_covers(m) is None
            and (m.seq > covered or m.role == "system")]
    budget = (math.inf if window is None
              else (window - _reserve(window, reply_reserve)) / max(scale, 1.0))
    used = sum(message_tokens(m) for m in body if m.role == "system")
    used += message_tokens(summary) if summary is not None else 0
    first_kept = math.inf
    for group in reversed([g for g in turns(body) if any(m.role != "system" for m in g)]):
        cost = sum(message_tokens(m) for m in group if m.role != "system")
        if first_kept != math.inf and used + cost > budget:
            break  # the newest turn is always sent; older ones only whole
        used, first_kept = used + cost, group[0].seq
    sent = [m for m in body if m.role == "system" and m.seq < first_kept]
    sent += [summary] if summary is not None else []
    sent += [m for m in body if m.seq >= first_kept]
    return Fit(sent, len(complete), sum(message_tokens(m) for m in sent), window, summary)


def _reserve(window: int, explicit: int | None) -> int:
    """Room left for the reply: max_tokens when given, else an eighth of the window."""
    if explicit is not None and explicit > 0:
        return min(explicit, window // 2)
    return min(window // 8, REPLY_RESERVE_MAX)


def request_for(chat: Any, model: str | None, params: Mapping[str, Any] | None = None,
                exclude: Collection[int] = (),
                blob: Callable[[dict[str, Any]], dict[str, Any]] | None = None
                ) -> list[dict[str, Any]]:
    """The message list for ``chat``'s next request; the Fit is kept as ``chat.last_fit``."""
    conv = chat.conversation
    window = resolve_window(chat.context_window, conv.metadata, model)
    reserve = (params or {}).get("max_completion_tokens", (params or {}).get("max_tokens"))
    chat.last_fit = fit(conv, window, reply_reserve=reserve, exclude=exclude,
                        scale=learned_scale(conv.metadata, model))
    return [m.to_openai(blob=blob, provider=True) for m in chat.last_fit.messages]


def learn(writer: TurnWriter, explicit: int | None, model: str | None, window: int | None,
          prompt: int | None = None, estimate: int | None = None) -> bool:
    """Store what a provider's 400 taught (through the turn writer): the window it named,
    and how many tokens it counts per estimated one (``prompt`` over ``estimate``, the
    count of what was sent). True if the next request differs."""
    metadata = writer.conversation.metadata
    before = (resolve_window(explicit, metadata, model), learned_scale(metadata, model))
    update: dict[str, Any] = {}
    if window is not None:
        update[METADATA_KEY] = with_learned(metadata, model, window)[METADATA_KEY]
    if prompt and estimate and prompt > estimate:
        # a little over the measured ratio, so the refit lands inside the window
        scale = max(learned_scale(metadata, model), prompt / estimate * 1.05)
        update[SCALE_KEY] = {**dict(metadata.get(SCALE_KEY) or {}), model or "": scale}
    if not update:
        return False
    writer.update_metadata(update)
    metadata = writer.conversation.metadata
    after = (resolve_window(explicit, metadata, model), learned_scale(metadata, model))
    log.info("%s: learned context window %s, token scale %.2f for model %s", writer.id,
             after[0], after[1], model)
    return after != before


CORRECTIONS = 3
"""Refits after a too-long answer in one call: each one learns something new, or stops."""


def call_fitted(build: Callable[[], list[dict[str, Any]]],
                call: Callable[[list[dict[str, Any]]], T],
                learn: Callable[[int | None, int | None], bool]) -> T:
    """``call(build())``; on a 400 saying the request does not fit, ``learn`` the window
    and the provider's count it names, fit again and retry: one failed request per
    correction, at most ``CORRECTIONS``.

    ``learn`` returns False when the 400 taught nothing new (the retry would fail the
    same way), and the error is raised as it is.
    """
    from chatstate.errors import ModelError

    for _ in range(CORRECTIONS):
        try:
            return call(build())
        except ModelError as exc:
            window, prompt = overflow_from_error(exc)
            if (window is None and prompt is None) or not learn(window, prompt):
                raise
    return call(build())


def alone_too_big(exc: BaseException, fit: Fit | None, turn_id: str) -> Any:
    """For a provider's "does not fit" when the request held nothing older to leave out
    (the newest turn alone, with the instructions): a ModelError whose advice can work
    (a new conversation would not help); None for any other error."""
    from chatstate.errors import ModelError

    if not isinstance(exc, ModelError) or exc.overflow is None or fit is None:
        return None
    if any(m.turn_id != turn_id for m in fit.messages if m.role != "system"):
        return None  # older turns went too: the generic advice stands
    window, prompt = exc.overflow
    size = f" ({prompt} tokens as the provider counts them)" if prompt else ""
    limit = f" of {window} tokens" if window else ""
    # what failed, in the adapter's words (the provider's own included), less its generic
    # advice (a new conversation), which cannot help here
    head = str(exc).rsplit(" The conversation", 1)[0]
    return ModelError(
        f"{head} Your message alone{size} is larger than the model's context window{limit}, so "
        "no trimming or new conversation can make it fit: split it (send the file in "
        "parts, or name fewer files with -f), or give the model a bigger window (start "
        "the server with a larger one, e.g. llama.cpp --ctx-size or Ollama's num_ctx, and "
        "tell chatstate with --context-window N), or pick a model with a larger window "
        "(--model).", status=exc.status, provider_message=exc.provider_message,
        retryable=False, overflow=exc.overflow, kind=exc.kind)


def peek(events: Iterator[T]) -> Iterator[T]:
    """Start a stream now, so an error answered before the first event is raised here."""
    iterator = iter(events)
    try:
        first = next(iterator)
    except StopIteration:
        return iter(())
    return _chain(first, iterator)


def _chain(first: T, rest: Iterator[T]) -> Iterator[T]:
    yield first
    yield from rest
