"""The relational core of the sqlite and postgresql stores: the logic once, two dialects.

Both keep a conversation as rows: a head row in ``conversations`` (title, times,
metadata, message count and last hash), one ``messages`` row per message whose
body is the canonical JSON its hash covers, at most one ``partials`` row, and a
``leases`` row per writer lease. What differs is the SQL dialect (parameter
marks, row locks) and the connection (sqlite's one shared connection with group
commit, postgresql's pool): each store supplies a ``Dialect`` and the few hooks
declared abstract below.

Compare-and-append is one transaction that reads the head (locked where the
server has row locks; sqlite's BEGIN IMMEDIATE already serialises writers),
checks the new messages chain from it, inserts them under the primary key
``(conversation_id, seq)`` and moves the head. A fenced write reads the lease
row in that same transaction, so no other writer can take the lease between the
check and the commit. A chain is verified in full the first time this process
writes to it and whenever its head moved under it (``_verified_count``).
"""

from chatstate.stores._relational._base import HEAD as HEAD
from chatstate.stores._relational._base import Dialect as Dialect
from chatstate.stores._relational._base import RelationalBase as RelationalBase
from chatstate.stores._relational._reads import RelationalReads as RelationalReads
from chatstate.stores._relational.store import RelationalStore as RelationalStore
