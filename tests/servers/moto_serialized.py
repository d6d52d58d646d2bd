"""moto's S3 server with one request handled at a time: ``python moto_serialized.py HOST PORT``.

moto checks a conditional write's ``If-Match`` / ``If-None-Match`` and then stores the object in
two steps, with no lock, on a thread per request: two conditional writes racing on one key can
both succeed, which S3 never allows (a test of concurrent index changes lost one that way).
Serving requests one at a time makes each check-and-write atomic, as on S3. moto keeps its
state in memory, so the queue of requests is short.
"""

from __future__ import annotations

import io
import os
import sys
import threading
from collections.abc import Iterable
from typing import Any

from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)
from werkzeug.serving import run_simple
from werkzeug.wsgi import get_input_stream


def serialized(app: Any) -> Any:
    """``app`` answering one request at a time, its whole body made inside the lock."""
    lock = threading.Lock()

    def answer(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        # The body is read first: a slow client holds no other request up.
        environ["wsgi.input"] = io.BytesIO(get_input_stream(environ).read())
        with lock:
            return list(app(environ, start_response))

    return answer


def main() -> None:
    host, port = sys.argv[1], int(sys.argv[2])
    os.environ.setdefault("MOTO_PORT", str(port))  # as moto_server does
    app = serialized(DomainDispatcherApplication(create_backend_app))
    run_simple(host, port, app, threaded=True, request_handler=MotoRequestHandler)


if __name__ == "__main__":
    main()
