"""Which headers cross the proxy, each way.

Upstream, from the client: the OpenAI headers that change what a request means or
who pays for it (``OpenAI-Organization``, ``OpenAI-Project``, ``OpenAI-Beta``) and
the client's ``Idempotency-Key``; nothing else, and never the client's
``Authorization`` (that is chatstate's token, unless ``--pass-client-key``, which
``Proxy.upstream_headers`` handles on its own).

Back to the client, on every response including streamed ones: what a client acts
on or quotes to its provider: ``Retry-After`` (and ``retry-after-ms``), the
request id, the ``x-ratelimit-*`` family and Anthropic's ``anthropic-ratelimit-*``,
and who answered (the upstream's organization, project and version headers). A
plain response relays every upstream header but the hop-by-hop ones
(``_wire.kept_headers``); a stream's own framing headers are the proxy's, so only
these are copied onto it.
"""

from __future__ import annotations

from collections.abc import Mapping

from chatstate.serve._wire import kept_headers

FORWARDED = ("openai-organization", "openai-project", "openai-beta", "idempotency-key")
RELAYED = ("retry-after", "retry-after-ms", "x-request-id", "request-id",
           "openai-organization", "openai-project", "openai-processing-ms", "openai-version",
           "anthropic-organization-id")
RELAYED_PREFIXES = ("x-ratelimit-", "anthropic-ratelimit-")


def forwarded(client: Mapping[str, str]) -> dict[str, str]:
    """The client's headers that go upstream with its request."""
    return {name: client[name] for name in FORWARDED if name in client}


def relayed_headers(upstream: Mapping[str, str]) -> dict[str, str]:
    """The upstream's headers a streamed response carries back to the client (of those
    ``_wire.kept_headers`` lets a client see)."""
    return {name: value for name, value in kept_headers(upstream).items()
            if name.lower() in RELAYED or name.lower().startswith(RELAYED_PREFIXES)}
