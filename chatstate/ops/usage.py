"""Usage: the token counts the provider reported, totalled from the store.

Every stored reply carries the usage its provider reported (``usage`` on the
message); a /compact summary keeps the usage of the call that wrote it.
``collect`` totals them by model, conversation or day. Costs come
only from a price table the user supplies, since bundled prices go stale::

    # prices.toml: US dollars per million tokens
    [models."gpt-4o-mini"]
    input = 0.15
    output = 0.60

A model with no entry (matched exactly, else by the longest name prefix) has
no cost, and is named in ``Report.unpriced`` rather than counted as free.
The messages a fork copied are counted once, in the conversation they came from.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from chatstate.core.fields import Usage
from chatstate.errors import CorruptTranscriptError, InvalidInput, InvalidOption
from chatstate.stores.base import Store

BY = ("model", "conversation", "day")
_SPAN = re.compile(r"(\d+)\s*([mhdw])")
_UNITS = {"m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


@dataclass
class Row:
    key: str
    replies: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float | None = None


@dataclass
class Report:
    by: str
    since: str | None
    rows: list[Row] = field(default_factory=list)
    unpriced: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # damaged transcripts, with why

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_since(text: str, *, now: datetime | None = None) -> datetime:
    """``7d``, ``12h``, ``30m``, ``2w`` ago, or an ISO date/time (UTC when no zone)."""
    now = now or datetime.now(timezone.utc)
    span = _SPAN.fullmatch(text.strip())
    if span:
        return now - timedelta(**{_UNITS[span.group(2)]: int(span.group(1))})
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise InvalidOption(f"--since {text!r}: use a span like 7d, 12h, 30m or 2w, or a "
                            "date like 2026-11-01") from None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def load_prices(path: Path) -> dict[str, tuple[float, float]]:
    """model -> (input, output) dollars per million tokens, from the user's TOML."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    try:
        data = tomllib.loads(path.read_text("utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise InvalidInput(f"price table {path}: {exc}") from exc
    models = data.get("models")
    if not isinstance(models, dict):
        raise InvalidInput(f'price table {path}: expected [models."NAME"] tables with '
                           "input and output (dollars per million tokens)")
    prices = {}
    for name, entry in models.items():
        cost = [entry.get(k) if isinstance(entry, dict) else None for k in ("input", "output")]
        if not all(isinstance(c, (int, float)) and not isinstance(c, bool) for c in cost):
            raise InvalidInput(f'price table {path}: models."{name}" needs numbers input '
                               "and output (dollars per million tokens)")
        prices[name] = (float(cost[0]), float(cost[1]))  # type: ignore[arg-type]
    return prices


def price_for(prices: dict[str, tuple[float, float]], model: str) -> tuple[float, float] | None:
    if model in prices:
        return prices[model]
    best = max((p for p in prices if model.startswith(p)), key=len, default=None)
    return prices[best] if best else None


def collect(store: Store, *, by: str = "model", since: datetime | None = None,
            prices: dict[str, tuple[float, float]] | None = None) -> Report:
    """Total the usage of every stored reply (created at or after ``since``) by ``by``."""
    if by not in BY:
        raise InvalidOption(f"usage by {by!r}: choose one of {', '.join(BY)}")
    report = Report(by=by, since=since.isoformat() if since else None)
    rows: dict[str, Row] = {}
    unpriced: set[str] = set()
    for conv_id, created_at, model, used in _replies(store, report):
        created = datetime.fromisoformat(created_at.replace("Z", "+00:00"))
        if since is not None and created < since:
            continue
        key = {"model": model, "conversation": conv_id, "day": created.date().isoformat()}[by]
        row = rows.setdefault(key, Row(key, cost=0.0 if prices is not None else None))
        prompt, completion = _tokens(used, "prompt_tokens"), _tokens(used, "completion_tokens")
        row.replies += 1
        row.prompt_tokens += prompt
        row.completion_tokens += completion
        if prices is not None:
            price = price_for(prices, model)
            if price is None:
                unpriced.add(model)
                row.cost = None
            elif row.cost is not None:
                row.cost += (prompt * price[0] + completion * price[1]) / 1_000_000
    report.rows = sorted(rows.values(), key=lambda r: r.key)
    report.unpriced = sorted(unpriced)
    return report


def _tokens(used: Usage, key: str) -> int:
    count = used.get(key, 0)
    return count if isinstance(count, int) else 0  # a nested detail, never a count


def _replies(store: Store, report: Report) -> Iterable[tuple[str, str, str, Usage]]:
    """(conversation, created_at, model, usage) of every reply and /compact summary."""
    for summary in store.list_conversations():
        try:
            conv = store.load(summary.id)
        except CorruptTranscriptError as exc:  # one damaged transcript does not hide the rest
            report.skipped.append(f"{summary.id}: {exc}")
            continue
        origin = conv.metadata.get("forked_from")
        copied = origin.get("seq", -1) if isinstance(origin, dict) else -1
        for message in conv.messages[copied + 1:]:  # a fork's copies count in the original
            if message.role == "assistant" and message.usage:
                yield conv.id, message.created_at, message.model or "(unknown)", message.usage
            compact = (message.params or {}).get("summary") if message.role == "system" else None
            if isinstance(compact, dict) and isinstance(compact.get("usage"), dict):
                yield (conv.id, message.created_at, str(compact.get("model") or "(unknown)"),
                       compact["usage"])
