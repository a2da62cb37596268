"""Threads started together: each runs ``work(i)`` once all are ready (a barrier), so
their calls overlap as much as the machine lets them."""

from __future__ import annotations

import threading
from collections.abc import Callable


def run_together(n: int, work: Callable[[int], None]) -> dict[int, BaseException]:
    """``work(0)`` .. ``work(n - 1)`` in ``n`` threads released at once; what each raised,
    by its index (empty when none did)."""
    start = threading.Barrier(n)
    errors: dict[int, BaseException] = {}

    def body(i: int) -> None:
        start.wait()
        try:
            work(i)
        except BaseException as exc:  # collected, asserted by the caller
            errors[i] = exc

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors
