"""Test helpers that ship with chatstate: a fake OpenAI-compatible model server.

    from chatstate.testing import FakeModel
    with FakeModel() as fake:
        fake.base_url          # http://127.0.0.1:PORT/v1
        fake.fail_next(429, times=2, retry_after=1)

Stdlib only, so importing it costs next to nothing. ``chatstate.testing.store_contract``
(which needs pytest, and is imported only by name) holds the store contract as test
classes a store subclasses: see docs/writing-a-store.md.
"""

from __future__ import annotations

from chatstate.testing._replies import reply_text
from chatstate.testing._script import Controls
from chatstate.testing.control import FakeControl
from chatstate.testing.fake_server import FakeModel, serve

__all__ = ["Controls", "FakeControl", "FakeModel", "reply_text", "serve"]
