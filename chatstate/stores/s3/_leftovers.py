"""What a killed s3 writer may leave that a fresh open did not recover (``leftovers``).

Only the given conversations are looked at, so another user of the same bucket
cannot make a check fail.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from chatstate.stores.s3 import _doc as doc

if TYPE_CHECKING:
    from chatstate.stores.s3._transport import S3IO

_S3_KEY = re.compile(r"(?:header|partial)\.json|(?P<dir>m|snap)/(?P<seq>\d{10})\.json")


def s3_leftovers(io: S3IO, ids: Sequence[str], counts: Mapping[str, int],
                 shifts: Mapping[str, int]) -> list[str]:
    """Under ``conversations/<id>/`` only the header, the segments (slots) and snapshots of
    stored seqs and the one partial reply, as far as listing shows. ``shifts``: each
    conversation's rewrites (a segment's slot is its seq plus those before it)."""
    problems = []
    for cid in ids:
        base = doc.conv_dir(cid) + "/"
        for key, _ in io.keys(doc.conv_dir(cid)):
            rest = key[len(base):] if key.startswith(base) else key
            match = _S3_KEY.fullmatch(rest)
            end = counts.get(cid, 0) + (shifts.get(cid, 0) if match and match["dir"] == "m"
                                        else 0)
            if match is None:
                problems.append(f"orphan object {key} (not part of the store's layout)")
            elif match["seq"] is not None and int(match["seq"]) >= end:
                problems.append(f"orphan object {key}: beyond the stored chain "
                                f"({counts.get(cid, 0)} messages)")
    return problems
