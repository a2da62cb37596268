"""moto's S3 server with conditional writes made atomic, as on AWS S3, MinIO and R2.

moto checks If-None-Match / If-Match in the request handler and stores the object
afterwards, without a lock, on a threaded server: two racing create-only PUTs of one
key can both succeed (seen: a two-writer race test acknowledged 51 messages and the
store held 50, on a loaded machine). Real servers decide the precondition and the
write in one step; this wrapper serialises every writing request so moto does too.
Reads stay concurrent.

    python tests/support/moto_atomic.py -H 127.0.0.1 -p PORT
"""

from __future__ import annotations

import argparse
import threading
from collections.abc import Callable, Iterable
from typing import Any

from moto.server import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from werkzeug.serving import run_simple

WRITES = {"PUT", "POST", "DELETE"}


def atomic_writes(app: Callable[..., Iterable[bytes]]) -> Callable[..., Iterable[bytes]]:
    lock = threading.Lock()

    def wrapped(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("REQUEST_METHOD") not in WRITES:
            return app(environ, start_response)
        with lock:  # precondition check and write in one step
            return list(app(environ, start_response))

    return wrapped


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-H", "--host", default="127.0.0.1")
    parser.add_argument("-p", "--port", type=int, required=True)
    args = parser.parse_args()
    app = DomainDispatcherApplication(create_backend_app)
    run_simple(args.host, args.port, atomic_writes(app), threaded=True,
               request_handler=MotoRequestHandler)


if __name__ == "__main__":
    main()
