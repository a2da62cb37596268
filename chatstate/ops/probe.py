"""The boot-id probe: where do writes land here, and did earlier writes survive?

``run()`` records the boot id, hostname, cwd and DEPLOY_ID, and for /tmp, $HOME,
the cwd, the store's directory and any extra directories: whether each exists
and is writable, its device and filesystem, and the durability verdict. For the
store's directory and the directories named with ``--path`` it also keeps a
SQLite row count. The row count is the part that proves something: each run
appends one row to ``.chatstate-probe.db`` in each of those directories after
counting the rows already there, so a run after a reboot or a redeploy shows
whether the earlier rows are still on disk. To count rows in /tmp or $HOME,
name them with ``--path``. ``diff()`` turns two reports into
sentences ("rebooted (boot id changed)", "lost its files/rows (3 rows before,
0 now)").

The probe writes only in the directories the user named (the store's, and
each ``--path``): the SQLite file (kept, one row per run) and the guard's
write+fsync+read probe file (deleted at once). /tmp, $HOME and the cwd are
inspected without a write, unless named. It never creates a directory, and it
does not open the store.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from chatstate.durable.files import fsync_dir
from chatstate.durable.guard import host_identity, inspect
from chatstate.errors import ProbeReportError  # (defined there; old path kept)
from chatstate.ops.doctor import redact_url, scrub

__all__ = ["PROBE_DB", "ProbeReportError", "diff", "load_report", "run", "store_dir"]

PROBE_DB = ".chatstate-probe.db"
KIND = "chatstate-probe"
NAMED = ("store", "--path")
"""Labels of the directories the probe may write in: the ones the user named."""
NOT_WRITTEN = ("not written: the probe writes only in the store's directory and --path "
               "directories (add --path to count rows here)")


def store_dir(url: str) -> str | None:
    """The local directory a store URL points into, without opening it; None if remote."""
    scheme, _, rest = url.partition("://")
    if scheme not in ("json", "sqlite") or not rest.startswith("/"):
        return None
    path = Path(rest.split("?", 1)[0])
    return str(path if scheme == "json" else path.parent)


def run(paths: Sequence[str] = (), store_url: str | None = None) -> dict[str, Any]:
    """Probe the standard places and ``paths``; return the report (see the module docstring)."""
    from chatstate.stores import default_store_url

    url = store_url or default_store_url()
    cwd = os.getcwd()
    wanted: list[tuple[str, str | None]] = [
        ("/tmp", "/tmp"), ("$HOME", str(Path.home())), ("cwd", cwd),
        ("store", store_dir(url))] + [("--path", os.path.abspath(p)) for p in paths]
    merged: dict[str, list[str]] = {}
    for label, path in wanted:
        if path is not None:
            key = os.path.realpath(path)
            merged.setdefault(key, []).append(label)
    ident = host_identity()
    report: dict[str, Any] = {
        "kind": KIND, "version": 1, "time": _now(), "boot_id": ident["boot_id"],
        "hostname": ident["hostname"], "deploy_id": ident["deploy_id"], "cwd": cwd,
        "store": redact_url(url),
        "store_note": None if store_dir(url) else "the store is not a local directory: "
                                                  "nothing to probe on this machine",
        "paths": [probe_path(path, labels, write=any(n in labels for n in NAMED))
                  for path, labels in merged.items()],
    }
    return report


def probe_path(path: str, labels: list[str], *, write: bool = True) -> dict[str, Any]:
    """Everything the probe knows about one directory; writes only if ``write`` and it
    already exists (otherwise ``writable`` is the permission check alone)."""
    target = Path(path)
    is_dir = target.is_dir()
    rep = inspect(target, probe=is_dir and write)
    writable = bool(rep.probe and rep.probe.startswith("ok")) if write else (
        is_dir and os.access(target, os.W_OK | os.X_OK))
    entry: dict[str, Any] = {
        "path": path, "labels": labels, "exists": target.exists(), "is_dir": is_dir,
        "writable": writable,
        "device": rep.device, "fstype": rep.fstype, "source": rep.source,
        "mount_point": rep.mount_point, "verdict": rep.verdict,
        "reasons": [scrub(r) for r in rep.reasons], "write_probe": rep.probe,
    }
    if not is_dir:
        note = "not a directory" if target.exists() else "does not exist"
        entry["sqlite"] = {"file": None, "error": f"{note}: nothing written"}
    elif not write:
        entry["sqlite"] = {"file": None, "error": NOT_WRITTEN}
    else:
        entry["sqlite"] = sqlite_rows(target)
    return entry


def sqlite_rows(directory: Path) -> dict[str, Any]:
    """Count the rows earlier runs left in ``directory/.chatstate-probe.db``, then add one."""
    file = directory / PROBE_DB
    out: dict[str, Any] = {"file": str(file), "existed": file.exists(), "rows_before": None,
                           "rows_after": None, "boots_before": None, "first_row_at": None,
                           "error": None}
    ident = host_identity()
    try:
        if not out["existed"]:  # 0600 whatever the umask, and the new name made durable
            os.close(os.open(file, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))
            fsync_dir(directory)
        db = sqlite3.connect(file, timeout=5, isolation_level=None)
        try:
            db.execute("PRAGMA synchronous=FULL")
            db.execute("BEGIN IMMEDIATE")
            db.execute("CREATE TABLE IF NOT EXISTS runs (id INTEGER PRIMARY KEY, at TEXT, "
                       "boot_id TEXT, hostname TEXT, deploy_id TEXT)")
            rows, boots, first = db.execute(
                "SELECT count(*), count(DISTINCT boot_id), min(at) FROM runs").fetchone()
            db.execute("INSERT INTO runs (at, boot_id, hostname, deploy_id) VALUES (?,?,?,?)",
                       (_now(), ident["boot_id"], ident["hostname"], ident["deploy_id"]))
            db.execute("COMMIT")
        finally:
            db.close()
        out.update(rows_before=rows, boots_before=boots, first_row_at=first,
                   rows_after=rows + 1)
    except (OSError, sqlite3.Error) as exc:
        out["error"] = scrub(f"{type(exc).__name__}: {exc}")
    return out


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


# -- reading and comparing reports ---------------------------------------------------
def load_report(path: str) -> dict[str, Any]:
    """Read a ``probe --json`` file; ProbeReportError says what is wrong with it."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ProbeReportError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise ProbeReportError(f"{path} is not valid JSON ({exc}); save a report with "
                               "`chatstate probe --json > FILE`") from exc
    if (not isinstance(data, dict) or not isinstance(data.get("paths"), list)
            or not all(isinstance(p, dict) and isinstance(p.get("path"), str)
                       for p in data["paths"])):
        raise ProbeReportError(f"{path} is not a chatstate probe report (no list of 'paths'); "
                               "save one with `chatstate probe --json > FILE`")
    return data


def diff(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Sentences explaining what changed between probe report ``a`` and a later ``b``."""
    out = [_boot(a, b), _changed("hostname", a.get("hostname"), b.get("hostname")),
           _changed("DEPLOY_ID", a.get("deploy_id"), b.get("deploy_id"))]
    gap = _gap(a.get("time"), b.get("time"))
    if gap:
        out.append(gap)
    old = {p["path"]: p for p in a["paths"]}
    new = {p["path"]: p for p in b["paths"]}
    for path in list(old) + [p for p in new if p not in old]:
        pa, pb = old.get(path), new.get(path)
        labels = ", ".join((pb or pa or {}).get("labels") or [])
        name = f"{path} ({labels})" if labels else path
        if pa is None or pb is None:
            out.append(f"{name}: only probed in {'the second' if pa is None else 'the first'}"
                       " run")
            continue
        out.append(f"{name}: " + "; ".join(path_changes(pa, pb)))
    return out


def _boot(a: dict[str, Any], b: dict[str, Any]) -> str:
    ba, bb = a.get("boot_id"), b.get("boot_id")
    if not ba or not bb:
        return "reboot unknown: a run has no boot id (not Linux?)"
    if ba != bb:
        return f"rebooted (boot id changed): {ba} -> {bb}"
    return f"not rebooted (same boot id {ba})"


def _changed(what: str, va: Any, vb: Any) -> str:
    if va == vb:
        return f"same {what} {va}" if va else f"{what} unset in both runs"
    return f"{what} changed ({va or '(unset)'} -> {vb or '(unset)'})"


def _gap(ta: Any, tb: Any) -> str | None:
    try:
        seconds = int((datetime.fromisoformat(tb) - datetime.fromisoformat(ta)).total_seconds())
    except (TypeError, ValueError):
        return None
    h, rest = divmod(abs(seconds), 3600)
    when = f"{h}h {rest // 60}m" if h else f"{rest // 60}m {rest % 60}s"
    return f"the second run was {when} {'after' if seconds >= 0 else 'BEFORE'} the first"


def path_changes(pa: dict[str, Any], pb: dict[str, Any]) -> list[str]:
    """What happened to one directory between two runs, in words."""
    out: list[str] = []
    if pa.get("exists") and not pb.get("exists"):
        out.append("the directory is gone")
    elif pb.get("exists") and not pa.get("exists"):
        out.append("the directory appeared")
    out.append(_rows(pa.get("sqlite") or {}, pb.get("sqlite") or {}))
    for key, what in (("device", "device"), ("fstype", "filesystem"), ("verdict", "verdict"),
                      ("writable", "writable")):
        if pa.get(key) != pb.get(key):
            out.append(f"{what} changed ({pa.get(key)} -> {pb.get(key)})")
    return out


def _rows(sa: dict[str, Any], sb: dict[str, Any]) -> str:
    after, before = sa.get("rows_after"), sb.get("rows_before")
    if after is None:
        return f"no row count from the first run ({sa.get('error') or 'not probed'})"
    if before is None:
        return f"no row count from the second run ({sb.get('error') or 'not probed'})"
    counts = f"({after} row{'s' * (after != 1)} before, {before} now)"
    if before == 0 and after > 0:
        gone = "files/rows" if not sb.get("existed") else "rows (the file is there, empty)"
        return f"lost its {gone} {counts}"
    if before < after:
        return f"lost {after - before} of its rows {counts}"
    if before > after:
        return f"kept its rows, and other runs added {before - after} {counts}"
    return f"kept its rows {counts}"
