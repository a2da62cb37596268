"""The rekey phase (``drill --encrypted --rekey``): SIGKILL ``chatstate rekey`` in place
again and again while the drill's writers append, run it to completion, prove it.

After the writer trials, the store (the drill's own: it must hold no other conversation)
is rotated from the key it is under to a fresh one, again and again until the kills
asked for are reached, then back, so it ends under the configured key. A rotation is
rounds until its rekey has finished; in a round

- a real ``python -m chatstate rekey --new-key-env ...`` process starts (the keys reach
  it in its environment, never its arguments);
- once it has said the rotation runs (its first line), a writer of the fork server is
  forked and killed at its kill plan, as in the trials: its appends run while the
  rotation does;
- the rekey is SIGKILLed at a random moment of its run (drawn over the length of the
  last complete run, from its start or from its first line), or finishes first;
- both reaped, the checker (``check``) judges the store from a fresh open with the
  key the writers hold (which the rotation still accepts).

Then the rekey runs to completion and the rotation is proved from a fresh open with
the new key alone: the checker again (every acknowledged message there once, the
chains verify, interrupted turns retried), every record of the drill's conversations
sealed by the new key, the mark naming only it (nothing half-done), the old key
refused. The writers are restarted with the new key for the next rotation.
"""

from __future__ import annotations

import base64
import os
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from chatstate.drill._common import reopen
from chatstate.drill.check import Checker, Tally, TrialLog
from chatstate.drill.plan import KillPlan
from chatstate.drill.rekeyrun import NEW_KEY_VAR, RekeyRun
from chatstate.drill.report import DrillResult
from chatstate.drill.server import WriterServer
from chatstate.errors import ConfigurationError

KEY_VARS = ("CHATSTATE_ENCRYPTION_KEY", "CHATSTATE_KEY_FILE", "CHATSTATE_KEY_COMMAND",
            "CHATSTATE_OLD_ENCRYPTION_KEY", "CHATSTATE_OLD_KEY_FILE",
            "CHATSTATE_OLD_KEY_COMMAND")
MAX_ROTATIONS = 40
"""Rotations until the kills asked for are reached (a rotation ends when its rekey did)."""


@dataclass
class RekeyPhase:
    """What the rekey phase did and found (its losses are counted in the result's too)."""

    requested: int
    rotations: int = 0
    kills: int = 0
    """rekey processes SIGKILLed while they ran"""
    killed_when: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        ("not started", "rotating", "finished"), 0))
    """the kills by where the store's mark said the rotation stood right after them"""
    finished_first: int = 0
    """rounds whose rekey finished before its kill came"""
    completions: int = 0
    writer_trials: int = 0
    acked: int = 0
    lost: int = 0
    corrupt: int = 0
    duplicated: int = 0
    records: int = 0
    """records re-encrypted, as the completing runs reported"""
    old_key_refused: int = 0
    refused_writers: int = 0
    """writers holding the old key that opened after the rekey finished: refused, rightly"""
    problems: list[str] = field(default_factory=list)
    complete: bool = False
    """every rotation proved, the last one back to the key the drill started with"""

    def add(self, tally: Tally) -> None:
        self.acked += tally.acked
        self.lost += tally.lost
        self.corrupt += tally.corrupt
        self.duplicated += tally.duplicated

    def to_dict(self) -> dict[str, Any]:
        return {"requested": self.requested, "rotations": self.rotations, "kills": self.kills,
                "killed_when": dict(self.killed_when),
                "finished_before_kill": self.finished_first, "completions": self.completions,
                "writer_trials": self.writer_trials, "acked": self.acked, "lost": self.lost,
                "corrupt": self.corrupt, "duplicated": self.duplicated,
                "complete": self.complete, "old_key_refused": self.old_key_refused,
                "refused_writers": self.refused_writers, "problems": self.problems[:20]}


def key_text(raw: bytes) -> str:
    from chatstate.stores.codec import KEY_PREFIX

    return KEY_PREFIX + base64.urlsafe_b64encode(raw).decode().rstrip("=")


def key_env(key: bytes, **extra: str) -> dict[str, str]:
    """This process's environment with ``key`` the only configured key (for a child)."""
    env = {k: v for k, v in os.environ.items()
           if k not in KEY_VARS and not k.startswith("OPENAI_")}
    env["CHATSTATE_ENCRYPTION_KEY"] = key_text(key)
    env.update(extra)
    return env


def refuse_shared_store(url: str, ids: list[str]) -> None:
    """The rekey phase re-encrypts the whole store: refused (before anything is written)
    on a store holding a conversation that is not the drill's."""
    store = reopen(url)
    try:
        others = [s.id for s in store.list_conversations(limit=len(ids) + 1)
                  if s.id not in ids]
    finally:
        store.close()
    if others:
        raise ConfigurationError(
            f"drill --rekey re-encrypts the whole store, and {url.split('?', 1)[0]} holds "
            f"conversations that are not the drill's ({others[0]!r}...): give it a store of "
            "its own (--all, or an empty --store); nothing was changed")


class Phase:
    """One rekey phase over the drill's store, its writers and its checker."""

    def __init__(self, url: str, checker: Checker, start_server: Callable[[bytes], WriterServer],
                 server: WriterServer, rng: random.Random, trial: Callable[..., TrialLog],
                 plans: Any, result: DrillResult, kills: int, *, allow_ephemeral: bool,
                 timeout: float) -> None:
        self.url, self.checker, self.start_server, self.server = url, checker, start_server, server
        self.rng, self.trial, self.plans, self.result = rng, trial, plans, result
        self.phase = RekeyPhase(requested=kills)
        self.allow_ephemeral, self.timeout = allow_ephemeral, timeout
        self.whole, self.work = 1.5, 0.05  # seconds: a run, and its part after the first line

    def run(self, original: bytes) -> RekeyPhase:
        from chatstate.stores.codec import new_key, parse_key

        self.result.rekey = self.phase
        cur = original
        while self.phase.rotations < MAX_ROTATIONS:
            back = self.phase.kills >= self.phase.requested  # enough: back to the start key
            new = original if back else parse_key(new_key(), "drill")
            if not self._rotate(cur, new, 1 if back else self.phase.requested -
                                self.phase.kills, last=back):
                return self.phase
            cur = new
            if back:
                self.phase.complete = True
                break
        return self.phase

    # -- one rotation --------------------------------------------------------------------
    def _rotate(self, old: bytes, new: bytes, rounds: int, last: bool) -> bool:
        finished = False
        for _ in range(rounds):
            finished = self._round(old, new)
            if finished:
                break
        if not finished:
            run = RekeyRun(self.url, key_env(old, **self._extra(new)))
            run.wait(self.timeout)
            if not self._judge(run, completing=True):
                return False
        self.checker.key = new
        self._check(TrialLog())
        self._prove(old, new)
        self.phase.rotations += 1
        if not last:  # the writers hold the old key, refused now
            self.server = self.start_server(new)
        return True

    def _extra(self, new: bytes) -> dict[str, str]:
        extra = {NEW_KEY_VAR: key_text(new), "CHATSTATE_STORE": self.url}
        if self.allow_ephemeral:
            extra["CHATSTATE_ALLOW_EPHEMERAL"] = "1"
        return extra

    def _round(self, old: bytes, new: bytes) -> bool:
        """One rekey killed at random while a writer appends; True if it finished first."""
        from_start = self.rng.random() < 0.3
        delay = self.rng.uniform(0, self.whole if from_start else self.work)
        run = RekeyRun(self.url, key_env(old, **self._extra(new)),
                       kill_after=delay, from_start=from_start)
        run.begun.wait(self.timeout)
        plan: KillPlan = next(self.plans)
        log = self.trial(self.server, self.result.trials, self.rng.randrange(1 << 31), plan,
                         lambda error: self._refused(error, new))
        self.result.trials += 1
        self.phase.writer_trials += 1
        run.wait(self.timeout)
        finished = run.code == 0
        state = self._state(new)
        if run.killed and not finished:
            self.phase.kills += 1
            self.phase.killed_when[state] += 1
        elif finished:
            self.phase.finished_first += 1
        if not run.killed or finished:
            self._judge(run, completing=False)
        # the writers' key (the old one) opens the store while the rotation runs; a kill
        # after the run's last write leaves it finished, and the old key refused
        done = finished or state == "finished"
        self.checker.key = new if done else old
        self._check(log)
        return done

    def _refused(self, error: str, new: bytes) -> bool:
        """A writer holding the old key, refused at open because the rekey had finished
        first: what the store must do (counted, not a problem)."""
        if error.startswith("ConfigurationError") and "wrong encryption key" in error and \
                self._state(new) == "finished":
            self.phase.refused_writers += 1
            return True
        return False

    def _state(self, new: bytes) -> str:
        """Where the rotation to ``new`` stands, by the store's mark: "not started" (the
        old key alone), "rotating" (both keys read) or "finished"."""
        from chatstate.stores.codec import fingerprint_of
        from chatstate.stores.sealed import marker

        raw = reopen(self.url, key=None)
        try:
            mark = marker(raw) or {}
        finally:
            raw.close()
        if mark.get("key") != fingerprint_of(new):
            return "not started"
        return "rotating" if "rekey" in mark else "finished"

    def _judge(self, run: RekeyRun, *, completing: bool) -> bool:
        """A run that was not killed: it must have finished (0), printing no key."""
        if run.leaked:
            self._problem("the rekey process printed a key")
        if run.code != 0:
            self._problem(f"rekey {'did not complete' if completing else 'failed'} (exit "
                          f"{run.code}): {run.tail()}")
            return False
        self.phase.completions += 1
        self.whole, self.work = max(run.seconds, 0.05), max(run.work, 0.005)
        return True

    def _check(self, log: TrialLog) -> None:
        tally = self.checker.check(log)
        self.phase.add(tally)
        self.result.add(tally)

    def _prove(self, old: bytes, new: bytes) -> None:
        """Nothing half-done: the mark names only ``new``, every record of the drill's
        conversations is sealed by it, and ``old`` is refused."""
        from chatstate.stores.codec import fingerprint_of
        from chatstate.stores.sealed import marker, seal_opened

        new_fp = fingerprint_of(new)
        raw = reopen(self.url, key=None)
        try:
            mark = marker(raw) or {}
            if mark.get("key") != new_fp or "rekey" in mark:
                self._problem(f"after rekey finished, the encryption mark is {mark!r}, not "
                              f"key {new_fp} alone")
            for _cid, text in self.checker.sealed_by(raw, {new_fp}):
                self._problem(f"after rekey finished: {text}")
            try:
                seal_opened(raw, key=old)
            except ConfigurationError as exc:
                if "wrong encryption key" in str(exc):
                    self.phase.old_key_refused += 1
                else:
                    self._problem(f"the old key was refused, but not as a wrong key: {exc}")
            else:
                self._problem(f"after rekey finished, the old key {fingerprint_of(old)} still "
                              "opens the store")
        finally:
            raw.close()

    def _problem(self, text: str) -> None:
        self.phase.problems.append(text)
        self.result.problem(f"rekey: {text}")
