"""Content parts: text, images and files for a message, and the blobs behind large ones.

Parts follow chat-completions::

    {"type": "text", "text": "What is in this picture?"}
    {"type": "image_url", "image_url": {"url": "https://… or data:image/png;base64,…"}}
    {"type": "file", "file": {"filename": "report.pdf", "file_data": "data:…;base64,…"}}

Build them with ``text()``, ``image()`` and ``file()`` from a path, a URL, bytes or
base64; ``attachment()`` picks image or file by media type (what ``-a/--attach``
does). At send time ``store_parts`` moves any part whose data is above
``BLOB_THRESHOLD`` into the store's blob area: the part then carries
``"blob": {"sha256", "size", "media_type", "name"}`` instead of its data URL, so
a 1 MiB image named by ten turns is stored once. ``inliner(store)`` turns such a
part back into a data URL for a request (``Message.to_openai(blob=...)``).

What a store's blob area offers is ``BlobStore``, defined here (below the stores,
which implement it) and re-exported by ``chatstate.stores``.
"""

from __future__ import annotations

import base64 as b64
import binascii
import mimetypes
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from chatstate.errors import InvalidInput, Unsupported

BLOB_THRESHOLD = 64 * 1024
"""Parts whose data is larger than this (in bytes) are stored as blobs."""

Part = dict[str, Any]


def text(value: str) -> Part:
    return {"type": "text", "text": value}


def image(source: str | Path | bytes | None = None, *, base64: str | None = None,
          media_type: str | None = None, name: str | None = None,
          detail: str | None = None) -> Part:
    """An image part from a path, an http(s) or data URL, bytes, or ``base64=``."""
    if isinstance(source, str) and source.startswith(("http://", "https://")):
        url = source
    else:
        data, media_type, name = _load(source, base64, media_type, name, "image/png")
        url = data_url(data, media_type)
    inner: dict[str, Any] = {"url": url}
    if detail:
        inner["detail"] = detail
    part: Part = {"type": "image_url", "image_url": inner}
    if name:
        part["name"] = name  # for the blob reference: store_parts takes it off the part
    return part


def file(source: str | Path | bytes | None = None, *, base64: str | None = None,
         media_type: str | None = None, name: str | None = None) -> Part:
    """A file (document) part from a path, a data URL, bytes, or ``base64=``."""
    if isinstance(source, str) and source.startswith(("http://", "https://")):
        raise InvalidInput(f"file part {source!r}: chat-completions takes a file's bytes, not "
                           "a URL; download it and attach the path")
    data, media_type, name = _load(source, base64, media_type, name,
                                   "application/octet-stream")
    inner = {"filename": name or "file", "file_data": data_url(data, media_type)}
    return {"type": "file", "file": inner}


TEXT_ATTACHMENT_LIMIT = 1024 * 1024
"""A text file up to this size is sent as text; a larger one as a file part (a blob)."""
_TEXTUAL = ("application/json", "application/xml", "application/toml", "application/yaml",
            "application/x-yaml", "application/javascript", "application/x-sh",
            "application/sql", "application/x-python-code")


def attachment(source: str | Path | bytes | Part) -> Part:
    """An image, text or file part, by media type (a URL is taken as an image).

    A UTF-8 text file (source code, notes, JSON...) becomes a text part that names the
    file, as llm's fragments do: every chat server takes text, while file parts are
    refused by most local ones (llama.cpp: "unsupported content[].type").
    """
    if isinstance(source, dict):
        return source
    if isinstance(source, str) and source.startswith(("http://", "https://")):
        return image(source)
    if isinstance(source, str) and source.startswith("data:"):
        media: str | None = source[5:].split(";", 1)[0].split(",", 1)[0]
    else:
        media = guess_type(source) if isinstance(source, (str, Path)) else None
    if media and media.startswith("image/"):
        return image(source)
    if isinstance(source, (str, Path)) and not str(source).startswith("data:") \
            and (media is None or media.startswith("text/") or media in _TEXTUAL):
        as_text = text_file(Path(source))
        if as_text is not None:
            return as_text
    return file(source)


def is_attachment(part: Part) -> bool:
    """True for a part that came with a message rather than being its text: an image, a
    file, or a text file sent as text (``<file name=...>``)."""
    if part.get("type") != "text":
        return True
    return str(part.get("text", "")).startswith('<file name="')


def named_text(name: str, body: str) -> Part:
    """A file's text as a text part naming it (``<file name="...">``), as llm's fragments."""
    return text(f'<file name="{name}">\n{body.removesuffix(chr(10))}\n</file>')


def text_file(path: Path, name: str | None = None) -> Part | None:
    """``path`` as a text part naming the file (``name``, default its name), or None when
    it is not UTF-8 text."""
    try:
        with path.open("rb") as f:
            data = f.read(TEXT_ATTACHMENT_LIMIT + 1)
    except OSError:
        return None  # file() reports the path and the problem
    if len(data) > TEXT_ATTACHMENT_LIMIT or b"\0" in data:
        return None
    try:
        body = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return named_text(name or path.name, body)


def content(message: str | Sequence[Part] | None,
            attach: Iterable[str | Path | bytes | Part] = ()) -> str | list[Part]:
    """A message's content: the text (or parts) plus the attachments as parts."""
    extra = [attachment(a) for a in attach]
    if isinstance(message, str) or message is None:
        if not extra:
            return message or ""
        return ([text(message)] if message else []) + extra
    parts = [dict(p) for p in message] + extra
    for i, part in enumerate(parts):
        if not isinstance(part.get("type"), str):
            raise InvalidInput(f"content part {i} has no string 'type' (e.g. \"text\", "
                               "\"image_url\", \"file\")")
    return parts


def guess_type(path: str | Path) -> str | None:
    return mimetypes.guess_type(str(path), strict=False)[0]


def data_url(data: bytes, media_type: str) -> str:
    return f"data:{media_type};base64,{b64.b64encode(data).decode('ascii')}"


def parse_data_url(url: str, where: str = "data URL") -> tuple[bytes, str]:
    """(bytes, media type) of a base64 ``data:`` URL."""
    head, sep, payload = url.partition(",")
    if not head.startswith("data:") or not sep or not head.endswith(";base64"):
        raise InvalidInput(f"{where}: not a base64 data URL (data:<type>;base64,<data>)")
    try:
        return b64.b64decode(payload, validate=True), head[5:-7] or "application/octet-stream"
    except (binascii.Error, ValueError) as exc:
        raise InvalidInput(f"{where}: the base64 data is invalid ({exc})") from exc


def _load(source: str | Path | bytes | None, base64: str | None, media_type: str | None,
          name: str | None, default: str) -> tuple[bytes, str, str | None]:
    if base64 is not None:
        data, _ = parse_data_url(f"data:x;base64,{base64}", "base64=")
        return data, media_type or default, name
    if isinstance(source, bytes):
        return source, media_type or default, name
    if isinstance(source, str) and source.startswith("data:"):
        data, found = parse_data_url(source)
        return data, media_type or found, name
    if source is None:
        raise InvalidInput("give a path, URL, bytes or base64= for the part")
    path = Path(source).expanduser()
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InvalidInput(f"cannot attach {path}: {exc.strerror or exc}; check the path "
                           "and its permissions") from exc
    return data, media_type or guess_type(path) or default, name or path.name


# -- blobs: moving large data out of parts and back -------------------------------------------


@runtime_checkable
class BlobStore(Protocol):
    """The content-addressed blob area a store may offer (every built-in store does).

    A blob is immutable and keyed by the sha256 of its bytes, so it is stored once
    however many messages name it. ``put_blob`` returns only once the blob is
    durable, so a message naming it can be appended after it; ``append`` refuses
    a message naming a blob the store does not hold.
    """

    def put_blob(self, data: bytes, *, media_type: str | None = None,
                 name: str | None = None) -> dict[str, Any]:
        """Store ``data`` (a no-op if that digest is held) and return its reference
        ``{"sha256", "size", "media_type", "name"}``. Durable when it returns."""
        ...

    def get_blob(self, sha256: str) -> bytes:
        """The blob's bytes, digest checked. CorruptTranscriptError naming the file/key
        when it is missing or its bytes do not match the digest."""
        ...

    def has_blob(self, sha256: str) -> bool:
        """Whether a blob with this digest is stored (no digest check)."""
        ...


def blob_area(store: object, what: str) -> BlobStore:
    """``store`` as a ``BlobStore``; a clear error if it has no blob area for ``what``."""
    if not isinstance(store, BlobStore):
        raise Unsupported(f"{getattr(store, 'url', store)}: this store has no blob area "
                             f"for {what}; use a store that keeps blobs (every built-in store "
                             "does: json, sqlite, s3, postgresql)")
    return store


def _slot(part: Part) -> tuple[str, str] | None:
    """(container key, data key) of a part kind that carries a data URL."""
    return {"image_url": ("image_url", "url"), "file": ("file", "file_data")}.get(
        str(part.get("type")))


def store_parts(store: object, parts: str | list[Part],
                threshold: int = BLOB_THRESHOLD) -> str | list[Part]:
    """Parts with data above ``threshold`` become blob references (stored durably first).

    ``store`` needs a blob area (``BlobStore``) only when a part is that large.
    """
    if isinstance(parts, str):
        return parts
    return [_to_blob(store, p, threshold) for p in parts]


def _to_blob(store: object, part: Part, threshold: int) -> Part:
    name = part.get("name") if part.get("type") == "image_url" else None
    if name is not None:  # not a chat-completions field: it only names the blob
        part = {k: v for k, v in part.items() if k != "name"}
    slot = _slot(part)
    inner = part.get(slot[0]) if slot else None
    url = inner.get(slot[1]) if slot and isinstance(inner, dict) else None
    if slot is None or not isinstance(inner, dict) or not isinstance(url, str) or \
            not url.startswith("data:") or len(url) * 3 // 4 <= threshold:
        return part
    data, media_type = parse_data_url(url, f"{part['type']} part")
    if len(data) <= threshold:
        return part
    blobs = blob_area(store, f"a {len(data)}-byte {part['type']} part")
    name = name or inner.get("filename")
    ref = blobs.put_blob(data, media_type=media_type, name=name)
    rest = {k: v for k, v in inner.items() if k != slot[1]}
    return {**part, slot[0]: rest, "blob": ref}


def inline_part(part: Part, data: bytes) -> Part:
    """The request form of a part that carries a blob reference: its data as a data URL."""
    slot = _slot(part)
    ref = part.get("blob") or {}
    if slot is None:
        raise Unsupported(f"a {part.get('type')!r} part names blob {ref.get('sha256')}, "
                          "but chatstate only knows how to send image_url and file data")
    inner = dict(part.get(slot[0]) or {})
    inner[slot[1]] = data_url(data, str(ref.get("media_type") or "application/octet-stream"))
    return {k: v for k, v in part.items() if k != "blob"} | {slot[0]: inner}


def inliner(store: object) -> Callable[[Part], Part]:
    """``blob=`` for ``Message.to_openai``: reads each blob once (digest checked).

    A store without a blob area is refused at the first part that names a blob.
    """
    cache: dict[str, bytes] = {}

    def inline(part: Part) -> Part:
        sha = str((part.get("blob") or {}).get("sha256"))
        if sha not in cache:
            cache[sha] = blob_area(store, f"blob {sha} named by a message").get_blob(sha)
        return inline_part(part, cache[sha])

    return inline

