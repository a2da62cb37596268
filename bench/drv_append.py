"""Append driver: one system per process; prefill a transcript, then time whole turns.

    python bench/drv_append.py SYSTEM WORKDIR [STORE_URL]

Commands (JSON lines, see _drvproto): ``setup n`` prefills a fresh transcript of
n messages (untimed); ``turns k [mark]`` persists k turns (user message, then
the reply, as a client that persists before the call must) and answers the
wall time of each in ns; ``teardown`` removes the transcript. With ``mark`` the
turns are bracketed by getppid() calls, markers for an strace of this process.

Runs in the project venv (floor, chatstate-*) or in bench/.venv (the rest).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from _drvproto import serve, text

USER, REPLY = text(1_000_001), text(1_000_002)


def prefix_texts(n: int) -> list[tuple[str, str]]:
    return [("user" if i % 2 == 0 else "assistant", text(i)) for i in range(n)]


class Floor:
    """One JSON line appended per message with write + fsync: the physical floor."""

    def __init__(self, work: Path, url: str | None) -> None:
        self.work = work
        self.fd = -1
        self.seq = 0

    def setup(self, n: int) -> None:
        self.path = self.work / f"floor-{uuid.uuid4().hex}.jsonl"
        self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC,
                          0o600)
        os.write(self.fd, b"".join(self._line(role, content) for role, content in
                                   prefix_texts(n)))
        os.fsync(self.fd)
        dfd = os.open(self.work, os.O_RDONLY | os.O_DIRECTORY)
        os.fsync(dfd)
        os.close(dfd)

    def _line(self, role: str, content: str) -> bytes:
        self.seq += 1
        return json.dumps({"seq": self.seq, "role": role, "content": content,
                           "created_at": "2026-01-01T00:00:00.000000Z"}).encode() + b"\n"

    def turn(self) -> None:
        for role, content in (("user", USER), ("assistant", REPLY)):
            os.write(self.fd, self._line(role, content))
            os.fsync(self.fd)

    def teardown(self) -> None:
        os.close(self.fd)
        self.path.unlink()


class Chatstate:
    """A chatstate store: seal + compare-and-append the user message, then the reply."""

    def __init__(self, work: Path, url: str | None) -> None:
        from chatstate import Conversation, Message, open_store
        from chatstate.core.transcript import new_turn_id

        self.Message, self.Conversation, self.new_turn_id = Message, Conversation, new_turn_id
        assert url is not None
        self.store = open_store(url)
        self._sealed: list[Any] = []

    def sealed(self, n: int) -> list[Any]:
        while len(self._sealed) < n:  # one chain, cut to length: a prefix is a valid chain
            i = len(self._sealed)
            prev = self._sealed[-1] if self._sealed else None
            self._sealed.append(self.Message.seal(
                prev, role="user" if i % 2 == 0 else "assistant", content=text(i),
                turn_id=f"t-{i // 2:016x}", created_at="2026-01-01T00:00:00.000000Z"))
        return self._sealed[:n]

    def setup(self, n: int) -> None:
        self.cid = f"bench-{uuid.uuid4().hex[:12]}"
        self.store.create(self.Conversation(id=self.cid, title="bench"))
        prefix = self.sealed(n)
        if prefix:
            self.store.append(self.cid, prefix)
        self.last = prefix[-1] if prefix else None

    def turn(self) -> None:
        tid = self.new_turn_id()
        user = self.Message.seal(self.last, role="user", content=USER, turn_id=tid)
        self.store.append(self.cid, [user])
        reply = self.Message.seal(user, role="assistant", content=REPLY, turn_id=tid,
                                  model="fake-model", usage={"prompt_tokens": 100,
                                                             "completion_tokens": 100})
        self.store.append(self.cid, [reply])
        self.last = reply

    def teardown(self) -> None:
        self.store.delete(self.cid)


def lc_messages(n: int) -> list[Any]:
    from langchain_core.messages import AIMessage, HumanMessage

    return [HumanMessage(c) if r == "user" else AIMessage(c) for r, c in prefix_texts(n)]


class LangchainFile:
    """langchain_community FileChatMessageHistory: add_message per message."""

    def __init__(self, work: Path, url: str | None) -> None:
        self.work = work

    def setup(self, n: int) -> None:
        from langchain_community.chat_message_histories import FileChatMessageHistory
        from langchain_core.messages import messages_to_dict

        self.path = self.work / f"lc-{uuid.uuid4().hex}.json"
        # its add_messages rewrites the file per message: write the prefix directly
        self.path.write_text(json.dumps(messages_to_dict(lc_messages(n))))
        self.history = FileChatMessageHistory(str(self.path))

    def turn(self) -> None:
        from langchain_core.messages import AIMessage, HumanMessage

        self.history.add_message(HumanMessage(USER))
        self.history.add_message(AIMessage(REPLY))

    def teardown(self) -> None:
        self.path.unlink()


class LangchainSql:
    """langchain_community SQLChatMessageHistory on a SQLite file (SQLAlchemy defaults)."""

    def __init__(self, work: Path, url: str | None) -> None:
        from sqlalchemy import create_engine

        self.engine = create_engine(f"sqlite:///{work / 'lc-sql.db'}")

    def setup(self, n: int) -> None:
        from langchain_community.chat_message_histories import SQLChatMessageHistory

        self.history = SQLChatMessageHistory(session_id=uuid.uuid4().hex,
                                             connection=self.engine)
        if n:
            self.history.add_messages(lc_messages(n))  # one commit

    def turn(self) -> None:
        from langchain_core.messages import AIMessage, HumanMessage

        self.history.add_message(HumanMessage(USER))
        self.history.add_message(AIMessage(REPLY))

    def teardown(self) -> None:
        self.history.clear()


class AgentsSqlite:
    """openai-agents SQLiteSession (file database): add_items per message."""

    def __init__(self, work: Path, url: str | None) -> None:
        self.db = work / "agents.db"
        self.loop = asyncio.new_event_loop()

    @staticmethod
    def item(role: str, content: str) -> dict[str, Any]:
        if role == "user":
            return {"role": "user", "content": content}
        return {"id": f"msg_{uuid.uuid4().hex}", "type": "message", "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": content, "annotations": []}]}

    def setup(self, n: int) -> None:
        from agents import SQLiteSession

        self.session = SQLiteSession(uuid.uuid4().hex, self.db)
        if n:
            self.loop.run_until_complete(self.session.add_items(
                [self.item(r, c) for r, c in prefix_texts(n)]))

    def turn(self) -> None:
        run = self.loop.run_until_complete
        run(self.session.add_items([self.item("user", USER)]))
        run(self.session.add_items([self.item("assistant", REPLY)]))

    def teardown(self) -> None:
        self.loop.run_until_complete(self.session.clear_session())
        self.session.close()


class Llm:
    """simonw's llm as a library: an offline Model plugin class, then response.log_to_db().

    llm logs a turn (prompt + reply) in one transaction after the reply: it has no
    way to persist the user's message before the call. Its prefix is built once
    per length into a template database that each repetition copies.
    """

    def __init__(self, work: Path, url: str | None) -> None:
        import llm

        class BenchEcho(llm.Model):
            model_id = "bench-echo"
            can_stream = True

            def execute(self, prompt: Any, stream: bool, response: Any,
                        conversation: Any) -> Any:
                yield REPLY

        self.model = BenchEcho()
        self.work = work
        self.templates: dict[int, tuple[Path, Any, list[Any]]] = {}

    def _template(self, n: int) -> tuple[Path, Any, list[Any]]:
        import sqlite_utils
        from llm.logs import LogStore

        if n not in self.templates:
            conv = self.model.conversation()
            response = None
            for i in range(n // 2):
                response = conv.prompt(text(2 * i))
                response.text()
            path = self.work / f"llm-template-{n}.db"
            path.unlink(missing_ok=True)
            db = sqlite_utils.Database(path)
            store = LogStore(db)  # migrates
            if response is not None:
                db.execute("PRAGMA synchronous=OFF")  # the template is not what is measured
                with db.atomic():
                    tip = store.ensure_chain(response.prompt.messages)
                    store.ensure_chain(response._messages_now(), parent=tip)
            db.close()
            self.templates[n] = (path, conv, list(conv.responses))
        return self.templates[n]

    def setup(self, n: int) -> None:
        import sqlite_utils

        template, self.conv, responses = self._template(n)
        self.conv.responses = list(responses)
        self.path = self.work / f"llm-{uuid.uuid4().hex}.db"
        shutil.copyfile(template, self.path)
        self.db = sqlite_utils.Database(self.path)

    def turn(self) -> None:
        response = self.conv.prompt(USER)
        response.text()
        response.log_to_db(self.db)

    def teardown(self) -> None:
        self.db.close()
        self.path.unlink()


SYSTEMS = {"floor": Floor, "chatstate-json": Chatstate, "chatstate-sqlite": Chatstate,
           "chatstate-s3": Chatstate, "chatstate-postgresql": Chatstate,
           "langchain-file": LangchainFile, "langchain-sql": LangchainSql,
           "agents-sqlite": AgentsSqlite, "llm": Llm}


def main() -> None:
    name, work = sys.argv[1], Path(sys.argv[2])
    system = SYSTEMS[name](work, sys.argv[3] if len(sys.argv) > 3 else None)

    def setup(n: int) -> dict[str, Any]:
        system.setup(n)
        return {"ok": True}

    def turns(k: int, mark: bool = False) -> dict[str, Any]:
        times = []
        if mark:
            os.getppid()
        for _ in range(k):
            t0 = time.perf_counter_ns()
            system.turn()
            times.append(time.perf_counter_ns() - t0)
        if mark:
            os.getppid()
        return {"times_ns": times}

    def teardown() -> dict[str, Any]:
        system.teardown()
        return {"ok": True}

    serve({"setup": setup, "turns": turns, "teardown": teardown})


if __name__ == "__main__":
    main()
