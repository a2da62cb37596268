"""Many openers of one new sqlite store at once: every one of them gets the store.

CI caught a worker refusing a store that three others were creating at the same
instant ("a SQLite database that is not a chatstate store (application_id 0x0, 20
schema objects)"): the owner check read the application id and the table count in
two statements, and another opener's migration committed in between. Here threads,
each with its own connection as separate processes have, race on fresh files.
"""

from __future__ import annotations

import threading
from pathlib import Path

from chatstate.batch.ledger import Ledger
from chatstate.stores import open_store

OPENERS = 6
FILES = 30


def race(open_one: object, paths: list[Path]) -> list[BaseException]:
    errors: list[BaseException] = []
    for path in paths:
        start = threading.Barrier(OPENERS)

        def body(path: Path = path, start: threading.Barrier = start) -> None:
            start.wait()
            try:
                open_one(path)  # type: ignore[operator]
            except BaseException as exc:  # collected, asserted by the test
                errors.append(exc)

        threads = [threading.Thread(target=body) for _ in range(OPENERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return errors


def test_openers_racing_on_a_new_store_all_get_it(tmp_path: Path) -> None:
    def open_one(path: Path) -> None:
        open_store(f"sqlite://{path}").close()

    paths = [tmp_path / f"s{i}.db" for i in range(FILES)]
    assert race(open_one, paths) == []
    for path in paths:  # and each file is one good store
        store = open_store(f"sqlite://{path}")
        store.close()


def test_openers_racing_on_a_new_batch_ledger_all_get_it(tmp_path: Path) -> None:
    def open_one(path: Path) -> None:
        Ledger(path).close()

    assert race(open_one, [tmp_path / f"l{i}.db" for i in range(FILES)]) == []
