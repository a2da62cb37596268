"""The drill loop: start the fake model and a writer fork server, then kill, check, repeat.

Each trial forks a writer, waits for the event its kill plan aims at, SIGKILLs
it (after a delay of microseconds to a few milliseconds), lets the fork server
reap it, and checks the store from a fresh open in this process. The phase
that is counted is the one the writer had reported last before it died.

Bounded time: every trial has a timeout (a writer that does not reach its
kill point in time is killed anyway, and that counts as a problem), and the
whole run stops starting trials after ``max_seconds``. The drill's
conversations are ``drill-<run id>-<n>``; they are deleted at the end, and
no other conversation is read or written.
"""

from __future__ import annotations

import os
import random
import secrets
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from chatstate.core.redact import redact_url
from chatstate.drill._common import ID_PREFIX, conversation_ids, reopen, scheme_of
from chatstate.drill.check import Checker, TrialLog
from chatstate.drill.leftovers import cleanup
from chatstate.drill.plan import KillPlan, PhaseTracker, plans, spin
from chatstate.drill.report import DrillResult
from chatstate.drill.server import WriterServer, kill
from chatstate.drill.writer import THINK_SECONDS, make_adapter
from chatstate.errors import ChatstateError, ConversationNotFound
from chatstate.stores.base import Store


@dataclass
class DrillOptions:
    trials: int = 50
    seed: int | None = None
    conversations: int = 3
    trial_timeout: float = 20.0
    max_seconds: float = 900.0
    chunk_delay: float | None = None
    """Seconds between the fake's stream chunks; default 1 ms, 10 ms for a remote store
    (so that waiting for a chunk outlasts a PUT). The first byte comes after max(4 ms, 2 chunks)."""
    reply_words: int = 10
    rekey: int = 0
    """After the trials, SIGKILL ``chatstate rekey`` this many times, rotating to fresh
    keys and back (``rekeydrill``; an encrypted store of the drill's own). 0: none."""
    allow_ephemeral: bool = False
    """Passed on to the processes the drill starts that open the store themselves (rekey)."""


def run_drill(url: str, options: DrillOptions | None = None, *,
              progress: Callable[[DrillResult], None] | None = None) -> DrillResult:
    """Run the drill against the store at ``url`` (which must already pass the guard)."""
    from chatstate.testing import FakeModel

    opts = options or DrillOptions()
    seed = opts.seed if opts.seed is not None else random.randrange(1 << 31)
    run_id, ids = _fresh_ids(url, opts.conversations)
    original = _rekey_key(url, ids) if opts.rekey else None
    result = DrillResult(store=redact_url(url), seed=seed, requested=opts.trials, run_id=run_id)
    started = time.monotonic()
    chunk_delay = opts.chunk_delay if opts.chunk_delay is not None else _chunk_delay(url)
    latency = max(0.004, 2 * chunk_delay)  # a window to kill in while the request is out
    with FakeModel(latency=latency, chunk_delay=chunk_delay,
                   reply_words=opts.reply_words) as fake:
        adapter = make_adapter(fake.base_url)
        servers: list[WriterServer] = []

        def start_server(key: bytes | None = None) -> WriterServer:
            """The writers' fork server (again, with ``key`` configured: the rekey phase)."""
            from chatstate.drill.rekeydrill import key_env

            for old in servers:
                old.close()
            servers[:] = []
            servers.append(WriterServer(url, fake.base_url, f"{ID_PREFIX}{run_id}-",
                                        len(ids), opts.trial_timeout + 30,
                                        env=None if key is None else key_env(key)))
            return servers[0]

        checker = Checker(url, ids, adapter)
        try:
            rng = random.Random(seed)
            server = start_server()
            _loop(server, checker, rng, latency, opts, result, progress)
            if original is not None and result.ok and not result.stopped_early:
                _rekey_phase(url, checker, start_server, server, rng, latency, opts, result,
                             original)
        finally:
            for server in servers:
                server.close()
            adapter.close()
            _cleanup(url, ids, result, checker.key)
            result.seconds = time.monotonic() - started
    return result


def _rekey_key(url: str, ids: list[str]) -> bytes:
    """The key a rekey phase starts from (and ends under): the configured one; refused
    before anything is written for a plain drill or a store shared with other chats."""
    from chatstate.drill.rekeydrill import refuse_shared_store
    from chatstate.errors import ConfigurationError
    from chatstate.stores.keys import load_key

    key = load_key()
    if key is None:
        raise ConfigurationError("drill --rekey needs an encrypted drill (--encrypted, or a "
                                 "key configured); nothing was changed")
    refuse_shared_store(url, ids)
    return key


def _rekey_phase(url: str, checker: Checker, start_server: Callable[..., WriterServer],
                 server: WriterServer, rng: random.Random, latency: float,
                 opts: DrillOptions, result: DrillResult, original: bytes) -> None:
    from chatstate.drill.rekeydrill import Phase

    def trial(server: WriterServer, n: int, seed: int, plan: KillPlan,
              excused: Callable[[str], bool]) -> TrialLog:
        return _trial(server, n, seed, plan, opts, result, excused)

    phase = Phase(url, checker, start_server, server, rng, trial,
                  plans(rng, latency, THINK_SECONDS), result, opts.rekey,
                  allow_ephemeral=opts.allow_ephemeral, timeout=opts.trial_timeout + 60)
    phase.run(original)


def _loop(server: WriterServer, checker: Checker, rng: random.Random, latency: float,
          opts: DrillOptions, result: DrillResult,
          progress: Callable[[DrillResult], None] | None) -> None:
    started = time.monotonic()
    kill_plans = plans(rng, latency, THINK_SECONDS)
    for trial in range(opts.trials):
        if time.monotonic() - started > opts.max_seconds:
            result.stopped_early = (f"the time cap of {opts.max_seconds:.0f}s was reached "
                                    f"after {trial} trials")
            return
        log = _trial(server, trial, rng.randrange(1 << 31), next(kill_plans), opts, result)
        result.add(checker.check(log))
        result.trials += 1
        if progress is not None:
            progress(result)


def _trial(server: WriterServer, trial: int, seed: int, plan: KillPlan, opts: DrillOptions,
           result: DrillResult, excused: Callable[[str], bool] | None = None) -> TrialLog:
    """Fork a writer, kill it as planned, let it be reaped; count the phase it died in.
    ``excused``: an error of the writer's that is what the store should say (no problem)."""
    deadline = time.monotonic() + opts.trial_timeout
    pid = server.go(trial, seed, deadline)
    tracker = PhaseTracker()
    events = _until_kill_point(server, plan, tracker, deadline)
    if events is None:
        result.problem(f"trial {trial}: the writer did not reach its kill point "
                       f"({plan.trigger} #{plan.nth}) within {opts.trial_timeout:.0f}s")
        events = []
    kill(pid)
    rest, status = server.until_reaped(pid, time.monotonic() + 30)
    for event in rest:
        tracker.apply(event)
    log = TrialLog.parse(events + rest)
    if log.error is not None and excused is not None and excused(log.error):
        pass
    elif log.error is not None:
        result.problem(f"trial {trial}: the writer failed on its own: {log.error}")
    elif not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL):
        result.problem(f"trial {trial}: the writer ended with wait status {status}, not SIGKILL")
    result.kills[tracker.phase] += 1
    if tracker.phase == "in_store_write":
        result.write_ops[tracker.op] += 1
    return log


def _until_kill_point(server: WriterServer, plan: KillPlan, tracker: PhaseTracker,
                      deadline: float) -> list[list[Any]] | None:
    """Read events up to the plan's trigger (or an error), then wait its delay.

    None when the deadline passed first.
    """
    events: list[list[Any]] = []
    hits = 0
    while True:
        event = server.next(deadline)
        if event is None:
            return None
        tracker.apply(event)
        events.append(event)
        if event[0] == "err":
            return events
        if plan.matches(event):
            hits += 1
            if hits == plan.nth:
                spin(plan.delay)
                return events


def _fresh_ids(url: str, count: int) -> tuple[str, list[str]]:
    """A run id whose conversation ids are all free in the store (never someone else's)."""
    store = reopen(url)
    try:
        while True:
            run_id = secrets.token_hex(4)
            ids = conversation_ids(f"{ID_PREFIX}{run_id}-", count)
            if not any(_exists(store, cid) for cid in ids):
                return run_id, ids
    finally:
        store.close()


def _exists(store: Store, cid: str) -> bool:
    try:
        store.load(cid)
    except ConversationNotFound:
        return False
    except ChatstateError:
        return True
    return True


def _chunk_delay(url: str) -> float:
    from chatstate.stores import store_class

    remote = store_class(scheme_of(url)).from_url(url).location().path is None
    return 0.01 if remote else 0.001


def _cleanup(url: str, ids: list[str], result: DrillResult,
             key: bytes | Literal["env"] = "env") -> None:
    try:
        store = reopen(url, key)
    except Exception as exc:  # report it; the drill's result is still worth printing
        result.problem(f"could not reopen the store to delete the drill's conversations: {exc}")
        return
    try:
        for text in cleanup(store, ids):
            result.problem(text)
    finally:
        store.close()
