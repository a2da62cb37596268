"""The durability guard for a PostgreSQL server: ask it how it acknowledges a commit.

A commit is durable when the server flushed its WAL before answering. With
``fsync=off`` it never flushes; with ``synchronous_commit=off`` it answers
first and flushes later. Either is refused like an ephemeral disk (unless
allowed explicitly). ``full_page_writes=off`` risks torn pages after an OS
crash: the verdict is ``unknown``, with that reason. A standby or a read-only
server cannot take writes: a clear error, whatever is allowed.
"""

from __future__ import annotations

from typing import Any

from chatstate.durable.guard import Report
from chatstate.errors import StoreUnavailable

SETTINGS = ("fsync", "synchronous_commit", "full_page_writes", "default_transaction_read_only")


def server_report(conn: Any, shown: str, url: str) -> Report:
    """The guard's report for the server behind ``conn``; raises if it cannot take writes."""
    values = {name: str(conn.execute(f"SHOW {name}").fetchone()[0]) for name in SETTINGS}
    standby = bool(conn.execute("SELECT pg_is_in_recovery()").fetchone()[0])
    version = str(conn.execute("SHOW server_version").fetchone()[0])
    if standby:
        raise StoreUnavailable(f"refusing store {url}: the server at {shown} is a standby "
                               "(in recovery) and takes no writes; point the URL at the primary")
    if values["default_transaction_read_only"] == "on":
        raise StoreUnavailable(f"refusing store {url}: the server at {shown} is read-only "
                               "(default_transaction_read_only=on); point the URL at a "
                               "writable primary or turn that setting off")
    shown_settings = ", ".join(f"{k}={values[k]}" for k in SETTINGS[:3])
    reasons = []
    verdict = "durable"
    if values["fsync"] != "on":
        verdict = "ephemeral"
        reasons.append(f"PostgreSQL {version} at {shown} runs with fsync=off: a commit is "
                       "never flushed to disk, so a crash of the server's machine loses it.")
    if values["synchronous_commit"] == "off":
        verdict = "ephemeral"
        reasons.append(f"PostgreSQL {version} at {shown} runs with synchronous_commit=off: it "
                       "acknowledges a commit before flushing it, so a crash loses the last "
                       "acknowledged turns.")
    if verdict == "durable" and values["full_page_writes"] != "on":
        verdict = "unknown"
        reasons.append(f"PostgreSQL {version} at {shown} runs with full_page_writes=off: an "
                       "OS crash can leave torn pages that WAL replay cannot repair.")
    if verdict == "durable":
        reasons.append(f"PostgreSQL {version} at {shown} flushes its WAL before it "
                       f"acknowledges a commit ({shown_settings}).")
    else:
        reasons.append(f"Server settings: {shown_settings}.")
    return Report(path=shown, verdict=verdict, reasons=reasons,  # type: ignore[arg-type]
                  fstype="postgresql", source=shown)
