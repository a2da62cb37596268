"""``ConversationLocks``: one turn at a time per conversation, and a free one taken at once.

Under a burst every turn of the event loop is long (hundreds of streams are ready in
each), so a lock nobody holds is taken without one: a new conversation's first
chunk does not wait for the loop to come round to it.
"""

from __future__ import annotations

import asyncio

from chatstate.serve._limits import ConversationLocks


async def _never_gone() -> bool:
    return False


def test_a_free_lock_is_taken_without_a_turn_of_the_loop() -> None:
    async def main() -> list[str]:
        locks = ConversationLocks()
        order: list[str] = []
        asyncio.get_running_loop().call_soon(order.append, "the loop turned")
        assert await locks.acquire("ns\nc1", _never_gone)
        order.append("held")
        locks.release("ns\nc1")
        await asyncio.sleep(0)
        return order

    assert asyncio.run(main()) == ["held", "the loop turned"]


def test_a_held_lock_makes_the_next_turn_wait_until_it_is_released() -> None:
    async def main() -> list[str]:
        locks = ConversationLocks()
        order: list[str] = []
        assert await locks.acquire("ns\nc1", _never_gone)

        async def second() -> None:
            assert await locks.acquire("ns\nc1", _never_gone)
            order.append("second holds")
            locks.release("ns\nc1")

        waiting = asyncio.create_task(second())
        await asyncio.sleep(0.05)
        order.append("first releases")
        locks.release("ns\nc1")
        await asyncio.wait_for(waiting, 5)
        assert locks._locks == {}  # nobody holds or waits: forgotten
        return order

    assert asyncio.run(main()) == ["first releases", "second holds"]


def test_a_waiter_whose_client_left_gives_up_and_leaves_the_lock_to_its_holder() -> None:
    async def main() -> None:
        locks = ConversationLocks()
        assert await locks.acquire("ns\nc1", _never_gone)

        async def gone() -> bool:
            return True

        assert not await locks.acquire("ns\nc1", gone)  # polled, then given up
        locks.release("ns\nc1")
        assert locks._locks == {}
        assert await locks.acquire("ns\nc1", _never_gone)  # free again, at once

    asyncio.run(main())
