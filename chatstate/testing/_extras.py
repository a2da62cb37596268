"""The fake model's endpoints besides chat: embeddings, legacy completions, one model.

Deterministic like the chat replies (a hash of the input), in the OpenAI wire shapes,
so a proxy's pass-through can be checked byte for byte.
"""

from __future__ import annotations

import hashlib
from typing import Any

HTML_PAGE = (b"<!DOCTYPE html><html><head><title>Sign in</title></head>"
             b"<body><p>Please sign in to continue.</p></body></html>")
"""What a captive portal or a misrouted load balancer answers with a 200."""


def embeddings_body(body: dict[str, Any], model: str) -> dict[str, Any]:
    """``POST /v1/embeddings``: four numbers per input, from a hash of the input."""
    raw = body.get("input")
    inputs = raw if isinstance(raw, list) else [raw]
    data = []
    for i, item in enumerate(inputs):
        digest = hashlib.sha256(str(item).encode()).digest()
        data.append({"object": "embedding", "index": i,
                     "embedding": [round(b / 255, 4) for b in digest[:4]]})
    words = sum(len(str(item).split()) for item in inputs)
    return {"object": "list", "data": data, "model": str(body.get("model") or model),
            "usage": {"prompt_tokens": words, "total_tokens": words}}


def completion_text(body: dict[str, Any]) -> str:
    return f"Completed: {body.get('prompt')}"


def text_completion_body(body: dict[str, Any], model: str, cid: str,
                         created: int) -> dict[str, Any]:
    """``POST /v1/completions`` (the legacy text completion), not streamed."""
    return {"id": cid, "object": "text_completion", "created": created,
            "model": str(body.get("model") or model),
            "choices": [{"text": completion_text(body), "index": 0, "logprobs": None,
                         "finish_reason": "stop"}]}


def text_completion_chunks(body: dict[str, Any], model: str, cid: str,
                           created: int) -> list[dict[str, Any]]:
    """The same, streamed: one chunk per word, the last with its finish_reason."""
    words = completion_text(body).split(" ")
    pieces = [w + (" " if i < len(words) - 1 else "") for i, w in enumerate(words)]
    return [{"id": cid, "object": "text_completion", "created": created,
             "model": str(body.get("model") or model),
             "choices": [{"text": piece, "index": 0, "logprobs": None,
                          "finish_reason": "stop" if i == len(pieces) - 1 else None}]}
            for i, piece in enumerate(pieces)]


def model_body(model_id: str) -> dict[str, Any]:
    return {"id": model_id, "object": "model", "created": 0, "owned_by": "chatstate"}
