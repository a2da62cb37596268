"""Every error chatstate raises on purpose.

    ChatstateError                 base class; catch this to catch them all
    ├── ConfigurationError         (also a ValueError) called or configured wrong
    │   ├── InvalidConversationId  an id that is not 1-128 of [A-Za-z0-9._-]
    │   ├── InvalidStoreURL        no or unknown scheme, a relative path, a bad part
    │   ├── MissingExtra           an optional dependency is missing; names the extra
    │   ├── InvalidOption          an option or environment value out of range or form
    │   ├── InvalidInput           an import file, content part, price table, ... is bad
    │   │   ├── BatchInputError    a batch input file or record (batch.InputError)
    │   │   └── ProbeReportError   a file given to ``probe diff`` is not a report
    │   ├── InvalidTool            (also a TypeError) a function that cannot be a tool
    │   ├── TemplateError          a saved system prompt is missing, bad or lacks a value
    │   └── Unsupported            the store cannot do that (it has no blob area)
    ├── EphemeralStoreError        the store lives where bytes will not survive a restart
    ├── ConflictError              another writer appended first; nothing of ours was written
    │   ├── ConversationInUse      another live writer holds the conversation's lease
    │   └── LeaseLost              a write carried a lease token that is no longer current
    ├── CorruptTranscriptError     a stored document fails to parse or its hash chain breaks
    │   └── SchemaVersionError     a stored document is from a newer chatstate
    ├── ConversationNotFound       (also a KeyError) no conversation with that id
    ├── StoreUnavailable           the store cannot be reached or written (disk full, EIO)
    ├── ModelError                 the model endpoint failed and retries ran out
    ├── ToolLoopError              the model kept calling tools past ``max_tool_rounds``
    ├── McpServerError             an MCP server did not start, went away or hung in a call
    └── SurvivalError              the survival file could not be written or read
        └── SurvivalFileMissing    there is no survival file where one was expected

``ConfigurationError`` is "called wrong"; the others say "the world failed" (or
the stored data did). Each message says what happened, where (file, key or URL)
and what to do. Foreign errors (OSError, sqlite3, S3 client, HTTP) are translated
into these at one boundary per layer, with the original kept as ``__cause__``.

Internal control flow, never raised to a caller (so not in the tree):

    adapter._policy.AttemptFailed  one failed attempt; the retry loop makes it a ModelError
    stores.s3._transport.Exists    a create-only put found the key taken
    stores.s3._transport.Stale     an If-Match put found the object changed
    stores.s3._chain._Vanished     an object listed was gone when read; read again
    batch._work.OutOfAttempts      the ledger refused another attempt (a ChatstateError)
    ops.migrate._Differs           the destination holds something else under that id
    serve._history.Ambiguous       a header-less history matches more than one conversation
    serve._turns.ForeignConversation  the named conversation is another namespace's
    serve._responses_stored.UnknownResponse  no stored reply of the namespace has that id
"""

from __future__ import annotations


class ChatstateError(Exception):
    """Base class of every error chatstate raises on purpose."""


class ConfigurationError(ChatstateError, ValueError):
    """Called wrong or configured wrong: the fix is in the call, option, URL or file.

    Nothing failed in the world; retrying the same call fails the same way.
    """


class InvalidConversationId(ConfigurationError):
    """A conversation id that could escape the store or is not portable."""


class InvalidStoreURL(ConfigurationError):
    """A store (or batch ledger) URL that cannot be used: no scheme or an unknown one, a
    relative path, a bad bucket, host or query."""


class MissingExtra(ConfigurationError):
    """An optional dependency is not installed; the message names the pip install.

    ``extra`` is the chatstate extra that brings it ("s3", "postgres", ...), or ""
    when the dependency is not one of chatstate's extras.
    """

    def __init__(self, message: str, *, extra: str = "") -> None:
        super().__init__(message)
        self.extra = extra


class InvalidOption(ConfigurationError):
    """An option, argument or environment value out of its range or form."""


class InvalidInput(ConfigurationError):
    """Data handed to chatstate is not what it must be: a file to import, a content part,
    a price table, an item to store. Nothing was stored."""


class BatchInputError(InvalidInput):
    """The batch input could not be read or is malformed (``chatstate.batch.InputError``)."""


class ProbeReportError(InvalidInput):
    """A file given to ``probe diff`` is unreadable or not a probe report."""


class InvalidTool(ConfigurationError, TypeError):
    """A function that cannot be a tool (not a function, ``*args``, a bad name), or two
    tools of one name. Also a TypeError, as the not-a-function case always was."""


class TemplateError(ConfigurationError):
    """A template that does not exist, does not parse, or lacks a placeholder value."""


class Unsupported(ConfigurationError):
    """The store cannot do what was asked (it has no blob area to hold or sweep blobs)."""


class EphemeralStoreError(ChatstateError):
    """The store is on storage that will not survive a restart, and that was not allowed."""


class ConflictError(ChatstateError):
    """Compare-and-append lost: the conversation moved on since the caller last read it.

    Nothing the caller tried to write was applied. Reload and try again.
    """

    def __init__(self, message: str, *, expected_seq: int | None = None,
                 actual_seq: int | None = None) -> None:
        super().__init__(message)
        self.expected_seq = expected_seq
        self.actual_seq = actual_seq


class CorruptTranscriptError(ChatstateError):
    """A stored document fails to parse or verify. It is left exactly as it was."""

    def __init__(self, message: str, *, where: str = "", position: int | None = None) -> None:
        super().__init__(message)
        self.where = where
        self.position = position


class SchemaVersionError(CorruptTranscriptError):
    """A stored document carries a schema version newer than this chatstate knows."""


class ConversationNotFound(ChatstateError, KeyError):
    """No conversation with that id in this store."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else "conversation not found"


class StoreUnavailable(ChatstateError):
    """The store could not be read or written; the outcome of a write is unknown.

    A retry of the same append is safe: appends are idempotent by message hash.
    """


class ConversationInUse(ConflictError):
    """Another live writer holds this conversation's lease (host, pid say which).

    Nothing was written. Wait for it to finish (its lease expires if it died), or
    pass a wait timeout.
    """

    def __init__(self, message: str, *, host: str = "", pid: int = 0,
                 until: float = 0.0) -> None:
        super().__init__(message)  # a ConflictError: whoever handles those handles this
        self.host = host
        self.pid = pid
        self.until = until


class LeaseLost(ConflictError):
    """A fenced write was refused: the writer's lease token is no longer the current one.

    Another writer took the conversation over (this writer stalled past its lease
    term, or was SIGSTOPped). Nothing was written; the writer must stop, writing and
    showing nothing more of its turn.
    """

    def __init__(self, message: str, *, fence: str = "") -> None:
        super().__init__(message)
        self.fence = fence


class ModelError(ChatstateError):
    """The model endpoint failed and the adapter's retries ran out."""

    def __init__(self, message: str, *, status: int | None = None,
                 provider_message: str | None = None, retryable: bool = False,
                 overflow: tuple[int | None, int | None] | None = None,
                 kind: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.provider_message = provider_message
        self.retryable = retryable
        self.overflow = overflow
        """(context window, prompt tokens) as the provider counted them, when it said the
        request does not fit; either may be None."""
        self.kind = kind
        """What failed last: http, timeout, connect, cut, malformed or provider."""

    @property
    def misconfigured(self) -> bool:
        """No answer can come until the user changes something: the endpoint cannot be
        reached or does not exist, or the key is refused."""
        return self.kind == "connect" or self.status in (401, 403, 404)



class ToolLoopError(ChatstateError):
    """The model asked for tools in more rounds than ``max_tool_rounds`` allows.

    Everything up to there is stored and the last calls are answered "not run", so
    the transcript stays well-formed; ``chat.retry(tools=...)`` continues the turn.
    """

    def __init__(self, message: str, *, turn_id: str, rounds: int) -> None:
        super().__init__(message)
        self.turn_id = turn_id
        self.rounds = rounds


class McpServerError(ChatstateError):
    """An MCP server failed to start, went away during a call, or did not answer within
    its timeout. The message names the server and its command or URL (never its env or
    headers), and the last line it wrote on stderr. The tool loop turns it into the
    call's error result, so the model is told the tool failed; ``outcome_unknown``: the
    call had reached the server (it timed out, or the server went away during it), so
    for a tool with side effects the result is ``unknown``, not a failure to retry."""

    def __init__(self, message: str, *, outcome_unknown: bool = False) -> None:
        super().__init__(message)
        self.outcome_unknown = outcome_unknown


class SurvivalError(ChatstateError):
    """The survival file could not be written or read."""


class SurvivalFileMissing(SurvivalError):
    """There is no survival file in that directory (never written, or lost)."""
