"""One runner of named, append-only migrations, for every schema chatstate keeps.

A migration is a name and a step; a history is the ordered tuple of them that
a schema has ever had. Append a migration to change a schema; never edit,
reorder, rename or remove one that has shipped: stores in the field recorded
it. ``run`` reads what a store has applied, refuses a store that is newer than
the history (or does not fit it), and applies what is missing, in order, in one
write transaction that excludes other openers, recording each as it goes.

A backend (``Backend``) is how one kind of database keeps that record; each is
written once and shared by the store and the batch ledger on that database:

- SQLite (``sqlite_setup.SqliteBackend``) counts, in ``PRAGMA user_version``:
  cheap to read on every open, and what 0.1 and 0.2 wrote. A count cannot tell
  a renamed or reordered migration from the original, so there an edited
  history is caught by the test that pins the shipped names
  (tests/contract/test_migrations.py), not at open.
- PostgreSQL (``PgBackend``, here) records the names in a table, so a store
  whose names are not a prefix of the history (a shipped migration renamed,
  reordered or removed) is refused as well. The recorded order is not kept
  (0.2 stamped one transaction's migrations with one time), only the set.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Set
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Generic, Protocol, TypeVar

from chatstate.errors import ConfigurationError, SchemaVersionError

__all__ = ["Backend", "History", "Migration", "PgBackend", "Recorded", "history", "pending",
           "run"]

DB = TypeVar("DB")
DB_contra = TypeVar("DB_contra", contravariant=True)


@dataclass(frozen=True)
class Migration(Generic[DB]):
    """One named step; ``step`` changes the schema through the backend's connection."""

    name: str
    step: Callable[[DB], None]


History = tuple[Migration[DB], ...]

Recorded = int | Set[str]
"""What a store says it has applied: a count (the first n of the history) or the names."""


def history(*steps: Callable[[DB], None]) -> History[DB]:
    """A history of the given functions, each named by its ``__name__`` (``m001_initial``)."""
    out = tuple(Migration(step.__name__, step) for step in steps)
    names = [m.name for m in out]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigurationError(f"migration history names {', '.join(twice)} more than once: "
                             "give each migration a name of its own")
    return out


class Backend(Protocol[DB]):
    """How one kind of database keeps the record of applied migrations.

    ``transaction`` is one write transaction that other openers wait for (so two
    processes opening a blank store do not both migrate it); it commits when its
    block ends and rolls back if it raises. ``applied`` reads the record inside
    it; ``record`` notes the migration at ``position`` (1-based) as applied, in
    the same transaction as its step. ``peek`` reads the record without a
    transaction, so an up-to-date store opens without a write; None when only
    the transaction can tell. ``where`` (file or URL) and ``what`` ("chatstate
    store") name the store in messages.
    """

    where: str
    what: str

    def peek(self) -> Recorded | None: ...

    def transaction(self) -> AbstractContextManager[DB]: ...

    def applied(self, db: DB) -> Recorded: ...

    def record(self, db: DB, position: int, name: str) -> None: ...


def run(backend: Backend[DB], migrations: History[DB]) -> list[str]:
    """Apply the migrations the store lacks, in order, in one transaction; return their names.

    Raises SchemaVersionError, with nothing written, for a store that a newer
    chatstate migrated or whose record does not fit ``migrations``.
    """
    seen = backend.peek()
    if seen is not None and not pending(migrations, seen, backend.where, backend.what):
        return []
    with backend.transaction() as db:
        # read again under the transaction's lock: another opener may have migrated since
        todo = pending(migrations, backend.applied(db), backend.where, backend.what)
        for position, migration in todo:
            migration.step(db)
            backend.record(db, position, migration.name)
    return [migration.name for _, migration in todo]


def pending(migrations: History[DB], recorded: Recorded, where: str,
            what: str) -> list[tuple[int, Migration[DB]]]:
    """The (position, migration) pairs not yet applied; raises if the store does not fit."""
    names = [m.name for m in migrations]
    if isinstance(recorded, int):
        if recorded > len(names):
            raise _newer(where, f"{what} schema version {recorded} is newer than this "
                         f"chatstate knows ({len(names)})")
        return list(enumerate(migrations, start=1))[recorded:]
    unknown = sorted(recorded - set(names))
    missing = [n for n in names if n not in recorded]
    if unknown and not missing:  # a newer chatstate appended to this history
        raise _newer(where, f"{what} schema was written by a newer chatstate (migration(s) "
                     f"{', '.join(unknown)} unknown here)")
    if unknown:
        raise _edited(where, what, f"it records {', '.join(unknown)}, unknown here, and "
                      f"lacks {missing[0]}")
    later = [n for n in names[names.index(missing[0]):] if n in recorded] if missing else []
    if later:
        raise _edited(where, what, f"it records {later[0]} but not {missing[0]}, which comes "
                      "before it")
    return [(i, m) for i, m in enumerate(migrations, start=1) if m.name not in recorded]


def _newer(where: str, found: str) -> SchemaVersionError:
    return SchemaVersionError(f"{where}: {found}; upgrade chatstate. Nothing was written.",
                              where=where)


def _edited(where: str, what: str, detail: str) -> SchemaVersionError:
    return SchemaVersionError(
        f"{where}: {what} schema does not fit this chatstate's migrations: {detail}. Either "
        "a shipped migration was renamed, reordered or removed (migrations are append-only: "
        "restore it and append a new one), or another build of chatstate wrote it (open it "
        "with that build). Nothing was written.", where=where)


class PgBackend:
    """PostgreSQL: the names of applied migrations in ``<schema>.<table>``.

    ``transaction`` takes an advisory lock on the schema's name (openers on many
    hosts wait for each other), creates the schema and the table if missing, and
    refuses a schema that holds tables but no ``table`` (someone else's). It runs
    inside ``begin()`` (the ledger's own transaction), or by default inside the
    transaction the caller already opened on ``db`` (the store's). Steps see the
    schema as their ``search_path``. ``columns`` is the table's definition, as
    each store first created it.
    """

    def __init__(self, db: Any, schema: str, *, table: str, columns: str, where: str,
                 what: str, begin: Callable[[], AbstractContextManager[Any]] | None = None
                 ) -> None:
        self.db, self.schema, self.table, self.columns = db, schema, table, columns
        self.where, self.what = where, what
        self._begin = begin or (lambda: nullcontext(db))

    def peek(self) -> Recorded | None:
        return None  # reading needs the lock anyway: a blank schema has no table yet

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        quoted = '"' + self.schema.replace('"', '""') + '"'
        with self._begin():
            db = self.db
            db.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"chatstate:{self.schema}",))
            db.execute(f"CREATE SCHEMA IF NOT EXISTS {quoted}")
            db.execute(f"SET LOCAL search_path TO {quoted}")
            tables = {r[0] for r in db.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname=%s", (self.schema,)).fetchall()}
            if tables and self.table not in tables:
                raise ConfigurationError(f"{self.where}: schema {self.schema!r} holds tables that "
                                     "are not chatstate's; nothing was written. Use "
                                     "?schema=another_name.")
            db.execute(f"CREATE TABLE IF NOT EXISTS {self.table} ({self.columns})")
            yield db

    def applied(self, db: Any) -> Recorded:
        return {r[0] for r in db.execute(f"SELECT name FROM {self.table}").fetchall()}

    def record(self, db: Any, position: int, name: str) -> None:
        stamp = datetime.now(timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")
        db.execute(f"INSERT INTO {self.table} (name, applied_at) VALUES (%s, %s)", (name, stamp))
