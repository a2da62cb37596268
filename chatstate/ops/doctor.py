"""``doctor``: is the store ready, what has it survived, and where does chatstate keep state?

Readiness touches real state, in order: open the store (the durability guard
runs first), ``check()`` (a probe written, read back and deleted), then load and
verify every conversation up to a limit. A conversation that fails is named
with its error and makes the store not ready; the data is only read.

What the store has survived comes from its ``opens()`` records (boot id,
hostname, DEPLOY_ID of every open): two distinct boot ids mean it has come
through one reboot.

Nothing here prints a secret: URLs lose their credentials (``redact_url``) and
any text bound for the user passes through ``scrub`` (both from ``chatstate.core.redact``,
re-exported here).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from chatstate.core.redact import redact_url, scrub
from chatstate.durable.guard import Report, host_identity, inspect
from chatstate.stores.base import OpenedStore, Store

__all__ = ["DoctorReport", "StateRow", "Survived", "check_conversations", "diagnose",
           "history_path", "redact_url", "run", "scrub", "state_table", "survived",
           "unreachable"]

DEFAULT_LIMIT = 1000


def history_path() -> Path:
    """Where the REPL keeps its input history (prompt_toolkit ``FileHistory``)."""
    from platformdirs import user_state_dir

    return Path(user_state_dir("chatstate")) / "history"


# -- the parts of a report ------------------------------------------------------------
@dataclass
class StateRow:
    """One kind of state chatstate keeps (or refuses to keep), and how safe it is."""

    what: str
    where: str
    rebuilds: str
    verdict: str
    reasons: list[str] = field(default_factory=list)


@dataclass
class Survived:
    """What the store's open records say it has come through."""

    opens: int = 0
    boot_ids: list[str] = field(default_factory=list)
    deploy_ids: list[str] = field(default_factory=list)
    hostnames: list[str] = field(default_factory=list)
    first_open: str | None = None

    @property
    def reboots(self) -> int:
        return max(len(self.boot_ids) - 1, 0)

    def sentence(self) -> str:
        if not self.opens:
            return "no opens recorded yet"
        reboots = "1 reboot" if self.reboots == 1 else f"{self.reboots} reboots"
        deploys = (f"{len(self.deploy_ids)} deploy{'s' * (len(self.deploy_ids) != 1)} "
                   f"({', '.join(self.deploy_ids[-3:])})" if self.deploy_ids
                   else "no DEPLOY_ID seen")
        hosts = ", ".join(self.hostnames[-5:]) + (" …" if len(self.hostnames) > 5 else "")
        return (f"{reboots}, {deploys}, host{'s' * (len(self.hostnames) != 1)} {hosts}; "
                f"{self.opens} open{'s' * (self.opens != 1)} since "
                f"{self.first_open or 'an unknown time'}")


@dataclass
class ConversationCheck:
    checked: int = 0
    limit: int = DEFAULT_LIMIT
    more: bool = False
    interrupted: int = 0
    failures: list[dict[str, str]] = field(default_factory=list)


@dataclass
class DoctorReport:
    """Everything ``chatstate doctor`` prints; ``to_dict()`` is its ``--json``."""

    ready: bool
    store: str
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    recovery: list[str] = field(default_factory=list)
    durability: dict[str, Any] | None = None
    check: dict[str, Any] | None = None
    model: dict[str, Any] | None = None
    """The model endpoint check (``model_check.check_model_endpoint``), unless store-only."""
    conversations: ConversationCheck | None = None
    survived: Survived | None = None
    state: list[StateRow] = field(default_factory=list)
    host: dict[str, str | None] = field(default_factory=host_identity)
    encryption: str | None = None
    """How the store is encrypted and what was checked (None: a plain store)."""
    serve: dict[str, Any] | None = None
    """A running ``chatstate serve``'s own /readyz, when asked for (``--serve-url``)."""

    def add_serve(self, url: str, timeout: float = 5.0) -> None:
        """Ask a running proxy's /readyz; not ready when it is down or says so."""
        import httpx2

        target = url.rstrip("/").removesuffix("/v1") + "/readyz"
        try:
            resp = httpx2.get(target, timeout=timeout)
            body = resp.json()
        except (httpx2.HTTPError, ValueError) as exc:
            self.serve = {"url": redact_url(target), "ready": False,
                          "reason": f"no answer ({type(exc).__name__})"}
        else:
            self.serve = {"url": redact_url(target), "ready": resp.status_code == 200 and
                          body.get("ready") is True, "status": resp.status_code,
                          "reason": body.get("reason"), "boot_id": body.get("boot_id"),
                          "durability": (body.get("store") or {}).get("durability")}
        if not self.serve["ready"]:
            self.ready = False
            self.problems.append(f"chatstate serve at {self.serve['url']} is not ready: "
                                 f"{self.serve['reason']}")

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if self.survived is not None:
            data["survived"]["reboots"] = self.survived.reboots
            data["survived"]["summary"] = self.survived.sentence()
        return data

    def add_model_check(self, check: dict[str, Any]) -> None:
        """Fold in ``model_check.check_model_endpoint``: unreachable makes it not ready."""
        self.model = check
        if check["configured"] and not check["ok"]:
            self.problems.append(f"the model endpoint {check['endpoint']} is {check['detail']}"
                                 "; `doctor --store-only` checks the store alone")
            self.ready = False
        elif not check["configured"]:
            self.warnings.append(f"no model endpoint: {check['detail']}")
        if check.get("warning"):
            self.warnings.append(check["warning"])


# -- the checks -----------------------------------------------------------------------
def survived(opens: list[dict[str, Any]]) -> Survived:
    out = Survived(opens=len(opens))
    for rec in opens:
        for key, seen in (("boot_id", out.boot_ids), ("deploy_id", out.deploy_ids),
                          ("hostname", out.hostnames)):
            value = rec.get(key)
            if isinstance(value, str) and value and value not in seen:
                seen.append(value)
        if out.first_open is None and isinstance(rec.get("opened_at"), str):
            out.first_open = rec["opened_at"]
    return out


def check_conversations(store: Store, limit: int = DEFAULT_LIMIT) -> ConversationCheck:
    """Load and verify up to ``limit`` conversations, newest first; name every failure."""
    from chatstate.errors import ConversationNotFound
    from chatstate.stores.sealed import verified_load

    result = ConversationCheck(limit=limit)
    summaries = store.list_conversations(limit=limit + 1)
    result.more = len(summaries) > limit
    for summary in summaries[:limit]:
        try:
            conv = verified_load(store, summary.id)  # with a key: both chains checked
            bad = conv.verify()
            if bad is not None:
                raise ValueError(f"hash chain broken at seq {bad}")
        except ConversationNotFound:
            continue  # deleted while we looked: not damage
        except Exception as exc:  # a diagnostic names every failure, it never stops at one
            kind = "" if _is_ours(exc) else f"unexpected {type(exc).__name__}: "
            result.failures.append({"id": summary.id, "error": scrub(kind + str(exc))})
        else:
            last = conv.last
            if conv.partial is not None or (last is not None and last.role == "user"):
                result.interrupted += 1
        result.checked += 1
    return result


def _is_ours(exc: BaseException) -> bool:
    from chatstate.errors import ChatstateError

    return isinstance(exc, ChatstateError | ValueError)


def diagnose(store: OpenedStore, *, limit: int = DEFAULT_LIMIT) -> DoctorReport:
    """The full report for a store that opened (``open_store`` ran the guard already)."""
    guard = store.guard_report
    report = DoctorReport(ready=True, store=redact_url(store.url),
                          durability=_scrubbed(guard.to_dict()),
                          recovery=[scrub(note) for note in store.recovery])
    if guard.verdict == "ephemeral":
        report.warnings.append("the store is on ephemeral storage (allowed explicitly): its "
                               "transcripts will not survive a restart")
    elif guard.verdict == "unknown":
        report.warnings.append("the store's durability is unknown: " + guard.reasons[0]
                               if guard.reasons else "the store's durability is unknown")
    check = store.check()
    report.check = _scrubbed(check.to_dict())
    if not check.ok:
        report.problems.append(f"the store's probe write/read/delete failed: {check.error}")
    from chatstate.stores.sealed import encryption_note

    report.encryption = encryption_note(store)
    report.conversations = check_conversations(store, limit)
    for failure in report.conversations.failures:
        report.problems.append(f"conversation {failure['id']!r} does not load: "
                               f"{failure['error']}")
    if report.conversations.failures:
        report.warnings.append("the damaged data was only read; `chatstate replay ID --verify` "
                               "shows where, `chatstate repair ID` moves it aside")
    report.survived = survived(store.opens())
    report.state = state_table(store.url, guard)
    report.problems = [scrub(p) for p in report.problems]
    report.ready = not report.problems
    return report


def unreachable(url: str, exc: BaseException) -> DoctorReport:
    """The report when the store did not open (refused by the guard, unreadable, ...)."""
    report = DoctorReport(ready=False, store=redact_url(url),
                          problems=[scrub(f"the store did not open: {exc}")])
    report.state = state_table(url, None)
    return report


def run(url: str | None = None, *, allow_ephemeral: bool = False,
        limit: int = DEFAULT_LIMIT, store_only: bool = True) -> DoctorReport:
    """``chatstate doctor`` as a library call; ``store_only=False`` checks the model
    endpoint of the environment's settings too, as the command does by default."""
    from chatstate.errors import ChatstateError
    from chatstate.stores import default_store_url, open_store

    url = url or default_store_url()
    try:
        store = open_store(url, allow_ephemeral=allow_ephemeral, keyless=True)
    except ChatstateError as exc:
        report = unreachable(url, exc)
    else:
        try:
            report = diagnose(store, limit=limit)
        finally:
            store.close()
    if not store_only:
        from chatstate.ops.model_check import check_model_endpoint

        report.add_model_check(check_model_endpoint())
    return report


# -- the durability table for chatstate's own state -------------------------------------
def state_table(url: str, guard: Report | None) -> list[StateRow]:
    """Where each kind of chatstate state lives, what rebuilds it, and its verdict."""
    where, partials, verdict = _store_places(url, guard)
    history = history_path()
    hist = inspect(history, probe=history.parent.is_dir())
    env_file = " (a .env file in the current directory is read, never written)" if (
        Path(".env").is_file()) else ""
    return [
        StateRow("transcripts", where, "nothing: this is the state; copy it with `chatstate "
                 "export` or `chatstate migrate`", verdict.verdict, verdict.reasons),
        StateRow("in-progress replies", partials, "the next turn: the interrupted turn is "
                 "kept and `/retry` asks the model again", verdict.verdict, verdict.reasons),
        StateRow("REPL input history", str(history), "nothing needed: convenience only (up "
                 "arrow starts empty)", hist.verdict, hist.reasons),
        StateRow("batch ledger and outputs", "per batch output dir: see `chatstate batch "
                 "status` (ledger DIR/.chatstate-batch.db)", "`chatstate batch run` again: "
                 "lost outputs are redone, done rows are never called twice",
                 "checked by `batch run`", ["probed before a batch's first write"]),
        StateRow("secrets", "environment only: CHATSTATE_API_KEY / OPENAI_API_KEY, AWS "
                 "credential chain" + env_file, "your deploy environment or secret manager",
                 "never stored", ["chatstate writes no key to a transcript, log or report"]),
        StateRow("logs", "stderr only", "nothing: whatever captures stderr keeps them",
                 "not stored", ["--log-format json for a collector"]),
    ]


def _store_places(url: str, guard: Report | None) -> tuple[str, str, Report]:
    from chatstate.stores import store_class

    shown = redact_url(url)
    scheme = url.split("://", 1)[0] if "://" in url else ""
    try:
        loc = store_class(scheme).from_url(url).location()
    except Exception as exc:  # an unknown or malformed URL still gets a row
        return shown, shown, Report(path=shown, verdict="unknown",
                                    reasons=[scrub(f"could not place the store: {exc}")])
    if loc.path is None:
        remote = Report(path=shown, verdict="durable", fstype="remote", reasons=[
            f"remote store at {redact_url(loc.remote or url)}: its durability is the "
            "service's own promise"])
        return shown, f"{shown} (beside each conversation)", guard or remote
    report = guard or inspect(loc.path, probe=False)
    path = Path(loc.path)
    partials = (f"{path / '.partials'}" if scheme == "json"
                else f"{path} (the partials table)" if scheme == "sqlite"
                else f"{path} (beside each conversation)")
    return str(path), partials, report


def _scrubbed(data: dict[str, Any]) -> dict[str, Any]:
    return {k: scrub(v) if isinstance(v, str) else
            [scrub(x) if isinstance(x, str) else x for x in v] if isinstance(v, list) else v
            for k, v in data.items()}
