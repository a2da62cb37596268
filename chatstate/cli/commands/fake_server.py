"""`chatstate fake-server`: the built-in OpenAI-compatible fake model, in the foreground."""

from __future__ import annotations

import click


@click.command("fake-server")
@click.option("--port", type=int, default=0, show_default=True, help="0 picks a free port.")
@click.option("--latency", type=float, default=0.0, help="Seconds before each response.")
@click.option("--chunk-delay", type=float, default=0.0, help="Seconds between stream chunks.")
@click.option("--reply-words", type=int, default=8, show_default=True,
              help="Filler words after the echo.")
@click.option("--context-window", type=int, default=None, metavar="N",
              help="Answer 400 (\"maximum context length is N tokens\") past N prompt "
                   "tokens, one token per word.")
def fake_server(port: int, latency: float, chunk_delay: float, reply_words: int,
                context_window: int | None) -> None:
    """Serve the fake model on 127.0.0.1 and print its base URL (Ctrl-C stops it).

    Scriptable over HTTP: POST /_fake/control, GET /_fake/log, POST /_fake/reset.
    """
    from chatstate.testing.fake_server import serve

    serve(port=port, latency=latency, chunk_delay=chunk_delay, reply_words=reply_words,
          context_window=context_window)
