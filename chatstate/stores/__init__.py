"""Store registry and ``open_store``: URL -> store, with the durability guard in front.

Built-in schemes are imported lazily by module path; third-party stores register
a class with a ``from_url`` classmethod under the ``chatstate.stores`` entry
point group, keyed by URL scheme.
"""

from __future__ import annotations

import importlib
import logging
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from chatstate.errors import EphemeralStoreError, InvalidStoreURL, MissingExtra, StoreUnavailable
from chatstate.stores.base import (
    BlobStore,
    CheckReport,
    CollectsBlobs,
    Forgets,
    Leases,
    Location,
    Quarantines,
    ReportsLeftovers,
    Searchable,
    Store,
    verify_blobs,
)

log = logging.getLogger("chatstate.stores")

__all__ = ["BlobStore", "CheckReport", "CollectsBlobs", "Forgets", "Leases", "Location",
           "Quarantines", "ReportsLeftovers",
           "Searchable", "Store", "default_store_url", "guard", "open_store", "store_class",
           "verify_blobs"]

ENTRY_POINT_GROUP = "chatstate.stores"
BUILTIN = {
    "json": ("chatstate.stores.json.store", "JsonStore", None),
    "sqlite": ("chatstate.stores.sqlite.store", "SqliteStore", None),
    "s3": ("chatstate.stores.s3.store", "S3Store", "s3"),
    "postgresql": ("chatstate.stores.postgres.store", "PostgresStore", "postgres"),
    "postgres": ("chatstate.stores.postgres.store", "PostgresStore", "postgres"),
}
TRUTHY = {"1", "true", "yes", "on"}


def default_store_url() -> str:
    """``CHATSTATE_STORE``, else SQLite in the platform's user data directory."""
    url = os.environ.get("CHATSTATE_STORE")
    if url:
        return url
    from platformdirs import user_data_dir

    return "sqlite://" + str(Path(user_data_dir("chatstate")) / "chatstate.db")


def store_class(scheme: str) -> Any:
    if scheme in BUILTIN:
        module, name, _ = BUILTIN[scheme]
        try:
            return getattr(importlib.import_module(module), name)
        except ModuleNotFoundError as exc:
            _raise_missing_extra(scheme, exc)
            raise
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == scheme:
            return ep.load()
    if not scheme:
        raise InvalidStoreURL("a store URL needs a scheme: sqlite:///abs/file.db, "
                              "json:///abs/dir or s3://bucket/prefix")
    known = ", ".join(f"{name}://" for name in sorted(BUILTIN))
    raise InvalidStoreURL(f"unknown store scheme {scheme!r}: use one of {known} or install "
                          f"a package that registers it under the {ENTRY_POINT_GROUP!r} "
                          "entry point group")


def _raise_missing_extra(scheme: str, exc: ModuleNotFoundError) -> None:
    """MissingExtra if ``exc`` is a built-in store's optional package; else return."""
    extra = BUILTIN[scheme][2] if scheme in BUILTIN else None
    if extra and exc.name and not exc.name.startswith("chatstate"):
        raise MissingExtra(
            f"the {scheme}:// store needs the '{exc.name}' package: "
            f"pip install 'chatstate[{extra}]'", extra=extra) from exc


def allow_ephemeral_from_env() -> bool:
    return os.environ.get("CHATSTATE_ALLOW_EPHEMERAL", "").strip().lower() in TRUTHY


def guard(store: Store, *, allow_ephemeral: bool = False) -> Any:
    """Run the durability guard on a store's location; raise if ephemeral and not allowed.

    Returns the ``durability.Report``.
    """
    from chatstate.durable.guard import Report, inspect

    loc: Location = store.location()
    if hasattr(store, "durability_report"):  # a server says how it acknowledges commits
        report = store.durability_report()
    elif loc.path is None:
        report = Report(path=loc.remote or loc.url, verdict="durable", reasons=[
            f"The state lives off this machine, at {loc.remote}; its durability is the "
            "service's own promise."], fstype="remote", source=loc.remote)
    else:
        report = inspect(loc.path)
    if report.verdict == "ephemeral" and not (allow_ephemeral or allow_ephemeral_from_env()):
        raise EphemeralStoreError(
            f"refusing store {loc.url}: {' '.join(report.reasons[:2])} Transcripts written "
            "there would not survive a restart. Point CHATSTATE_STORE (or --store) at durable "
            "storage, e.g. sqlite:///home/you/.local/share/chatstate/chatstate.db, or accept "
            "the loss explicitly with --allow-ephemeral, allow_ephemeral=True or "
            "CHATSTATE_ALLOW_EPHEMERAL=1.")
    return report


def open_store(url: str | None = None, *, allow_ephemeral: bool = False) -> Any:
    """Open the store at ``url`` (default: ``CHATSTATE_STORE``, else SQLite in the user data dir).

    The durability guard runs before anything is written: an ephemeral location
    raises ``EphemeralStoreError`` unless allowed. Opening recovers what a killed
    writer left (``store.recovery`` says what) and records this open (boot id,
    hostname, DEPLOY_ID, time). ``store.guard_report`` holds the guard's verdict.
    """
    from chatstate.durable.guard import host_identity

    url = url or default_store_url()
    scheme = url.split("://", 1)[0] if "://" in url else ""
    store = store_class(scheme).from_url(url)
    try:  # a store may import its driver only when it first needs it (postgres does)
        report = guard(store, allow_ephemeral=allow_ephemeral)
        store.open()
    except ModuleNotFoundError as exc:
        _raise_missing_extra(scheme, exc)
        raise
    store.guard_report = report
    log.debug("opened %s: %s", store.url, report.one_line())
    for note in store.recovery:
        log.info("%s: recovered: %s", store.url, note)
    record = dict(host_identity(), opened_at=datetime.now(timezone.utc).isoformat(),
                  pid=os.getpid(), verdict=report.verdict)
    if getattr(store, "read_only_reason", None):
        return store  # opened read-only (full or read-only disk): recovery says why
    try:
        store.record_open(record)
    except StoreUnavailable as exc:  # a read-only or full disk must not hide what is stored
        store.recovery.append(f"could not record this open ({exc}); reads work, writes will "
                              "fail until that is fixed")
    return store
