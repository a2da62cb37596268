"""Batch input: a JSONL file or a directory of text files, read into ``Record``s.

JSONL: one object per line with ``text`` and optionally ``id`` (a string or a
number); without an id, the id is ``r-`` plus the first 16 hex digits of the
text's sha256, so the same text always gets the same id. A directory: every
regular file below it whose path has no dot-named part, id = its relative
path with ``/`` separators, text = its UTF-8 content. Bad input fails loudly,
naming the file and line; nothing is skipped silently.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chatstate.core.canonical import holds_surrogates
from chatstate.errors import BatchInputError

MAX_ID = 1024
InputError = BatchInputError  # its 0.2 name, still importable from here and chatstate.batch


@dataclass(frozen=True)
class Record:
    id: str
    text: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8", "surrogatepass")).hexdigest()


def derived_id(text: str) -> str:
    return "r-" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def fill(template: str, record_id: str, text: str) -> str:
    """The prompt: ``{text}`` and ``{id}`` replaced; every other brace is left alone."""
    return template.replace("{id}", record_id).replace("{text}", text)


def read_records(source: str | os.PathLike[str], *, skip: Path | None = None) -> list[Record]:
    """Records from a JSONL file or a directory, in input order, duplicates merged.

    ``skip`` is a directory not to read from (the output directory, if it lies inside).
    """
    path = Path(source)
    if path.is_dir():
        return _dedupe(_from_dir(path, skip), str(path))
    try:
        with open(path, encoding="utf-8") as fh:
            return _dedupe(_from_jsonl(fh, str(path)), str(path))
    except FileNotFoundError as exc:
        raise InputError(f"batch input {path} does not exist: give a .jsonl file or a "
                         "directory of text files") from exc
    except UnicodeDecodeError as exc:
        raise InputError(f"batch input {path} is not UTF-8 text ({exc.reason})") from exc
    except OSError as exc:
        raise InputError(f"could not read batch input {path}: {exc.strerror or exc}") from exc


def records_from(items: Iterable[Record | Mapping[str, Any] | str]) -> list[Record]:
    """Records from Python objects: Records, {"id", "text"} dicts, or bare texts."""
    out: list[Record] = []
    for n, item in enumerate(items, start=1):
        if isinstance(item, Record):
            out.append(item)
        elif isinstance(item, str):
            out.append(Record(derived_id(item), item))
        else:
            out.append(_from_object(item, f"item {n}"))
    return _dedupe(out, "the given records")


def _from_object(obj: Any, where: str) -> Record:
    if not isinstance(obj, Mapping):
        raise InputError(f"{where}: expected an object with 'text' (and 'id'), "
                         f"got {type(obj).__name__}")
    text = obj.get("text")
    if not isinstance(text, str):
        raise InputError(f"{where}: 'text' must be a string")
    if holds_surrogates(text) or holds_surrogates(str(obj.get("id", ""))):
        raise InputError(f"{where}: the text or id holds half a character (a lone "
                         "UTF-16 surrogate escape such as \\ud83d), which is not text: "
                         "fix the record")
    rid = obj.get("id")
    if rid is None:
        return Record(derived_id(text), text)
    if isinstance(rid, bool) or not isinstance(rid, (str, int)):
        raise InputError(f"{where}: 'id' must be a string or an integer")
    rid = str(rid)
    if not rid or len(rid) > MAX_ID or "\x00" in rid:
        raise InputError(f"{where}: 'id' must be 1-{MAX_ID} characters without NUL")
    return Record(rid, text)


def _from_jsonl(lines: Iterable[str], name: str) -> Iterator[Record]:
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"{name}:{number}: not valid JSON ({exc.msg})") from exc
        except RecursionError:
            raise InputError(f"{name}:{number}: nested too deeply to read; a record is an "
                             'object such as {"id": "a", "text": "..."}') from None
        yield _from_object(obj, f"{name}:{number}")


def _from_dir(root: Path, skip: Path | None) -> Iterator[Record]:
    skip_real = os.path.realpath(skip) if skip is not None else None
    for base, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".")
                         and os.path.realpath(os.path.join(base, d)) != skip_real)
        for name in sorted(files):
            full = Path(base) / name
            if name.startswith(".") or not full.is_file():
                continue
            if holds_surrogates(name):  # bytes the file system's encoding cannot decode
                raise InputError(f"{os.fsencode(full)!r} has a name that is not UTF-8, so it "
                                 "cannot be a record's id: rename it or move it out of the "
                                 "input directory")
            try:
                text = full.read_text(encoding="utf-8")
            except UnicodeDecodeError as exc:
                raise InputError(f"{full} is not UTF-8 text ({exc.reason}); move it out of "
                                 "the input directory or convert it") from exc
            except OSError as exc:
                raise InputError(f"could not read {full}: {exc.strerror or exc}") from exc
            yield Record(full.relative_to(root).as_posix(), text)


def _dedupe(records: Iterable[Record], name: str) -> list[Record]:
    seen: dict[str, Record] = {}
    for rec in records:
        prior = seen.get(rec.id)
        if prior is None:
            seen[rec.id] = rec
        elif prior.text != rec.text:
            raise InputError(f"{name}: id {rec.id!r} appears twice with different texts; "
                             "ids must be unique")
    return list(seen.values())
