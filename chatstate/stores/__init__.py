"""Store registry and ``open_store``: URL -> store, with the durability guard in front.

One registry, URL scheme -> store class, filled one way for every store:
``register(scheme, cls_or_"module:attr")``. The built-in stores register below by
"module:attr", so nothing is imported until a URL of theirs is opened; a third party
calls ``register`` too, or names its class under the ``chatstate.stores`` entry point
group, which is read only for a scheme not registered (and what it finds is
registered, so each is read once).
"""

from __future__ import annotations

import importlib
import logging
import os
import re
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NoReturn

from chatstate.errors import (
    ConfigurationError,
    EphemeralStoreError,
    InvalidStoreURL,
    MissingExtra,
    StoreUnavailable,
)
from chatstate.stores.base import (
    BlobStore,
    CheckReport,
    CollectsBlobs,
    Forgets,
    Leases,
    Location,
    OpenedStore,
    OpensReadOnly,
    Quarantines,
    ReportsDurability,
    ReportsLeftovers,
    Searchable,
    Store,
)
from chatstate.stores.blobs import verify_blobs

if TYPE_CHECKING:
    from chatstate.durable.guard import Report

log = logging.getLogger("chatstate.stores")

__all__ = ["BlobStore", "CheckReport", "CollectsBlobs", "Forgets", "Leases", "Location",
           "Quarantines", "ReportsLeftovers",
           "Searchable", "Store", "default_store_url", "guard", "open_store", "register",
           "store_class", "verify_blobs"]

ENTRY_POINT_GROUP = "chatstate.stores"
_SCHEME = re.compile(r"[a-z][a-z0-9+.-]*")
_REGISTRY: dict[str, tuple[Any, str | None]] = {}
"""scheme -> (the class, or "module:attr" until first used; what to pip install for it)"""


def register(scheme: str, store: type[Store] | str, *, requires: str | None = None) -> None:
    """Open ``scheme://`` URLs with ``store``: a class with a ``from_url`` classmethod, or
    ``"module:attr"`` naming one, imported only when such a URL is first opened.

    ``requires`` is what to pip install when that import fails for a missing package
    (the built-in s3 store says ``chatstate[s3]``). Registering a scheme again replaces it.
    """
    if not isinstance(scheme, str) or not _SCHEME.fullmatch(scheme):
        raise ConfigurationError(f"cannot register store scheme {scheme!r}: use lower-case "
                                 "letters, digits, '+', '-' or '.', starting with a letter, as "
                                 "in 'mystore'")
    if isinstance(store, str):
        module, _, attr = store.partition(":")
        if not module or not attr:
            raise ConfigurationError(f"cannot register {store!r} for {scheme}://: name the "
                                     "class as 'package.module:ClassName'")
    elif not callable(getattr(store, "from_url", None)):
        raise ConfigurationError(f"cannot register {store!r} for {scheme}://: a store class "
                                 "needs a from_url(url) classmethod (see "
                                 "chatstate.stores.base.Store)")
    _REGISTRY[scheme] = (store, requires)


register("json", "chatstate.stores.json.store:JsonStore")
register("sqlite", "chatstate.stores.sqlite.store:SqliteStore")
register("s3", "chatstate.stores.s3.store:S3Store", requires="chatstate[s3]")
register("postgresql", "chatstate.stores.postgres.store:PostgresStore",
         requires="chatstate[postgres]")
register("postgres", "chatstate.stores.postgres.store:PostgresStore",
         requires="chatstate[postgres]")
register("memory", "chatstate.stores.memory.store:MemoryStore")
TRUTHY = {"1", "true", "yes", "on"}


def default_store_url() -> str:
    """``CHATSTATE_STORE`` (the environment, else a .env file), else ``store`` in
    config.toml (``chatstate.core.config``), else SQLite in the platform's user data
    directory."""
    from chatstate.core.config import store_url

    url = store_url()
    if url:
        return url
    from platformdirs import user_data_dir

    return "sqlite://" + str(Path(user_data_dir("chatstate")) / "chatstate.db")


def store_class(scheme: str) -> Any:
    """The store class registered for ``scheme``, imported now if it was named by string."""
    if scheme not in _REGISTRY:
        _from_entry_points(scheme)
    store, requires = _REGISTRY[scheme]
    if not isinstance(store, str):
        return store
    module, _, attr = store.partition(":")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except ModuleNotFoundError as exc:
        _raise_missing_extra(scheme, exc)
        raise
    except AttributeError as exc:
        raise ConfigurationError(f"the {scheme}:// store is registered as {store!r}, but "
                                 f"module {module!r} has no {attr!r}") from exc
    _REGISTRY[scheme] = (cls, requires)
    return cls


def _raise_missing_extra(scheme: str, exc: ModuleNotFoundError) -> None:
    """MissingExtra if ``exc`` is a package the store registered as required; else return.

    Also for a store that imports its driver late (postgres, in ``open``/the guard)."""
    entry = _REGISTRY.get(scheme)
    requires = entry[1] if entry else None
    if not requires or not exc.name or exc.name.split(".")[0] == "chatstate":
        return
    extra = requires[len("chatstate["):-1] if requires.startswith("chatstate[") else ""
    raise MissingExtra(f"the {scheme}:// store needs the '{exc.name}' package: "
                       f"pip install '{requires}'", extra=extra) from exc


def _from_entry_points(scheme: str) -> None:
    """Register ``scheme`` from the entry point group, or raise naming what is known."""
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == scheme and scheme:
            register(scheme, f"{ep.module}:{ep.attr}")
            return
    if not scheme:
        raise InvalidStoreURL("a store URL needs a scheme: sqlite:///abs/file.db, "
                             "json:///abs/dir or s3://bucket/prefix")
    known = ", ".join(f"{name}://" for name in sorted(_REGISTRY))
    raise InvalidStoreURL(f"unknown store scheme {scheme!r}: use one of {known}, register "
                          "one with chatstate.stores.register(), or install a package that "
                          f"names it under the {ENTRY_POINT_GROUP!r} entry point group")


def allow_ephemeral_from_env() -> bool:
    return os.environ.get("CHATSTATE_ALLOW_EPHEMERAL", "").strip().lower() in TRUTHY


def guard(store: Store, *, allow_ephemeral: bool = False) -> Report:
    """Run the durability guard on a store's location; raise if ephemeral and not allowed.

    Returns the ``durability.Report``.
    """
    from chatstate.durable.guard import Report, inspect

    loc: Location = store.location()
    if isinstance(store, ReportsDurability):  # a server says how it acknowledges commits
        report = store.durability_report()
    elif loc.path is None and loc.remote is None:  # neither on a disk nor off this machine
        report = Report(path=loc.url, verdict="ephemeral", reasons=[
            f"{loc.url} keeps its state in this process's memory (its location names no path "
            "and no remote), so it is gone when the process exits."], fstype="memory",
            source=f"pid {os.getpid()}")
    elif loc.path is None:
        report = Report(path=loc.remote or loc.url, verdict="durable", reasons=[
            f"The state lives off this machine, at {loc.remote}; its durability is the "
            "service's own promise."], fstype="remote", source=loc.remote)
    else:
        report = inspect(loc.path)
    if report.verdict == "ephemeral" and not (allow_ephemeral or allow_ephemeral_from_env()):
        refuse_ephemeral(loc.url, report)
    return report


def refuse_ephemeral(url: str, report: Report) -> NoReturn:
    """Raise the guard's EphemeralStoreError for ``url`` (at open, or a server re-checked later)."""
    raise EphemeralStoreError(
            f"refusing store {url}: {' '.join(report.reasons[:2])} Transcripts written "
            "there would not survive a restart. Point CHATSTATE_STORE (or --store) at durable "
            "storage, e.g. sqlite:///home/you/.local/share/chatstate/chatstate.db, or accept "
            "the loss explicitly with --allow-ephemeral, allow_ephemeral=True or "
            "CHATSTATE_ALLOW_EPHEMERAL=1.")


def _sealed(store: OpenedStore, *, keyless: bool, key: bytes | Literal["env"] | None,
            old_keys: Sequence[bytes]) -> OpenedStore:
    """``store`` sealed by its key (``chatstate.stores.sealed.seal_opened``), or as it is.

    Without a key (none given, none configured) a store that carries no encryption mark is
    returned as it is, and none of the sealing code is imported: a plain store's cold start
    pays for one look at the mark. Every other case, a marked store refused or opened
    keyless included, is ``seal_opened``'s to decide."""
    from chatstate.stores import keys

    if key is None or (key == "env" and not keys.configured()):
        from chatstate.stores._mark import marker

        if marker(store) is None:
            return store
    from chatstate.stores.sealed import seal_opened

    sealed: OpenedStore = seal_opened(store, keyless=keyless, key=key,  # type: ignore[assignment]
                                      old_keys=old_keys)
    return sealed


def open_store(url: str | None = None, *, allow_ephemeral: bool = False,
               keyless: bool = False, key: bytes | Literal["env"] | None = "env",
               old_keys: Sequence[bytes] = ()) -> OpenedStore:
    """Open the store at ``url`` (default: ``CHATSTATE_STORE``, else SQLite in the user data dir).

    The durability guard runs before anything is written: an ephemeral location
    raises ``EphemeralStoreError`` unless allowed. Opening recovers what a killed
    writer left (``store.recovery`` says what) and records this open (boot id,
    hostname, DEPLOY_ID, time). ``store.guard_report`` holds the guard's verdict.

    With an encryption key configured (``chatstate.stores.keys``) the store comes back
    sealed (``chatstate.stores.sealed``); an encrypted store refuses to open without
    its key unless ``keyless`` (then its records come back sealed, for integrity checks).
    ``key``: the key's bytes, or None for a plain store, instead of the environment's
    (``migrate`` between plain and encrypted stores); ``old_keys`` are read-only keys.
    """
    from chatstate.durable.guard import host_identity

    url = url or default_store_url()
    scheme = url.split("://", 1)[0] if "://" in url else ""
    store: OpenedStore = store_class(scheme).from_url(url)  # guard_report is set below
    try:
        report = guard(store, allow_ephemeral=allow_ephemeral)
        store.open()
    except ModuleNotFoundError as exc:  # a store that imports its driver only now
        _raise_missing_extra(scheme, exc)
        raise
    store.guard_report = report
    try:
        store = _sealed(store, keyless=keyless, key=key, old_keys=old_keys)
    except BaseException:
        store.close()
        raise
    log.debug("opened %s: %s", store.url, report.one_line())
    for note in store.recovery:
        log.info("%s: recovered: %s", store.url, note)
    record = dict(host_identity(), opened_at=datetime.now(timezone.utc).isoformat(),
                  pid=os.getpid(), verdict=report.verdict)
    if isinstance(store, OpensReadOnly) and store.read_only_reason:
        return store  # opened read-only (full or read-only disk): recovery says why
    try:
        store.record_open(record)
    except StoreUnavailable as exc:  # a read-only or full disk must not hide what is stored
        store.recovery.append(f"could not record this open ({exc}); reads work, writes will "
                              "fail until that is fixed")
    return store
