"""Files into the prompt (``-f PATH``, as llm's fragments and aichat's ``-f``).

    fragments(["notes.md", "src/", "docs/*.md", "-"], stdin=read_stdin)

Each file becomes a text part naming it (``core.content.named_text``: the same
``<file name="...">`` part ``-a`` makes of a text file), in the order given; a
directory gives every file under it (sorted, hidden entries skipped), a glob every
file it matches (``**`` recurses), ``-`` the text on stdin. Everything is read and
checked before anything is stored: a missing path, a binary or non-UTF-8 file, or a
total over ``limit`` raises InvalidInput naming the path.
"""

from __future__ import annotations

import glob
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from chatstate.core.content import Part, named_text
from chatstate.errors import InvalidInput

__all__ = ["FRAGMENTS_LIMIT", "expand", "fragments"]

FRAGMENTS_LIMIT = 1024 * 1024
"""The most text (bytes, all files together) that ``-f`` puts into one message."""
_GLOB = set("*?[")


def expand(source: str) -> list[Path]:
    """The files ``source`` names: itself, the files under a directory, a glob's matches."""
    if _GLOB & set(source):
        matches = sorted(Path(p) for p in glob.glob(source, recursive=True))
        files = [p for p in matches if p.is_file()]
        if not files:
            raise InvalidInput(f"-f {source}: no file matches; nothing was sent or stored")
        return files
    path = Path(source).expanduser()
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file()
                       and not any(part.startswith(".") for part in p.relative_to(path).parts))
        if not files:
            raise InvalidInput(f"-f {source}: the directory has no files (hidden ones are "
                               "skipped); nothing was sent or stored")
        return files
    if not path.exists():
        raise InvalidInput(f"-f {source}: no such file or directory; nothing was sent or "
                           "stored")
    return [path]


def fragments(sources: Sequence[str], *, stdin: Callable[[], bytes] | None = None,
              limit: int = FRAGMENTS_LIMIT) -> list[Part]:
    """Text parts for ``sources`` (paths, directories, globs, ``-``), read now."""
    parts: list[Part] = []
    total = 0
    for source, name, data in _read(sources, stdin, limit):
        total += len(data)
        if total > limit:
            raise InvalidInput(
                f"-f {source}: {name} brings the text to {_size(total)}, over the "
                f"{_size(limit)} that -f puts in one message; nothing was sent or stored: "
                "name fewer files (a narrower glob), or split the file and send it in parts")
        if b"\0" in data:
            raise InvalidInput(f"-f {source}: {name} is a binary file, not text; nothing was "
                               "sent or stored: leave it out, or attach it with -a")
        try:
            body = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidInput(f"-f {source}: {name} is not UTF-8 text (byte "
                               f"0x{data[exc.start]:02x} at offset {exc.start}); nothing "
                               "was sent or stored: convert it (iconv -t UTF-8), or leave "
                               "it out") from None
        parts.append(named_text(name, body))
    return parts


def _read(sources: Sequence[str], stdin: Callable[[], bytes] | None,
          limit: int) -> Iterable[tuple[str, str, bytes]]:
    seen: set[Path] = set()
    for source in sources:
        if source == "-":
            if stdin is None:
                raise InvalidInput("-f -: there is no stdin to read here")
            yield source, "stdin", stdin()
            continue
        for path in expand(source):
            key = path.resolve()
            if key in seen:
                continue  # a file named twice (a path and a glob) goes in once
            seen.add(key)
            try:
                with path.open("rb") as f:
                    data = f.read(limit + 1)
            except OSError as exc:
                raise InvalidInput(f"-f {source}: cannot read {path} ({exc.strerror}); "
                                   "nothing was sent or stored") from None
            yield source, str(path), data


def _size(n: int) -> str:
    return f"{n / 1024 / 1024:.1f} MiB" if n >= 1024 * 1024 else f"{n / 1024:.0f} KiB"
