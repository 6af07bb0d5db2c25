"""D's KV-transfer params, served over HTTP by the process that makes them.

vLLM returns a finished request's ``kv_transfer_params`` (the blocks D keeps for the next
turn) only in non-streaming responses, and the router streams D's tokens. vLLM 0.32 calls
the connector's scheduler side (``request_finished``, in the engine-core process) when the
request finishes, before the engine sends the last output to the API server: the plugin
puts the params on a ``ParamsBoard`` there, and a ``ParamsServer`` in the same process
answers the router::

    GET /kv_params/<id>?wait_s=2   200 the params (JSON) | 404 none after wait_s
    GET /health                    200 ok

Beside vLLM's params each answer holds the request's output token ids
(``OUTPUT_IDS_KEY``): with the prompt the router sent, they say which tokens D holds the
KV of, so the router hands P these params only for a prompt that begins with exactly those
tokens (``jobs.serving.sessions.diverges_at``). The router drops the key before P sees them.

``<id>`` is the ``X-Request-Id`` the router sent; vLLM's own id wraps it
(``cmpl-<id>-0-<random>``), and the board keys each entry by the id it wraps
(``request_timing.external_id``): one dict lookup per GET. No file, no shared filesystem:
nothing depends on how soon NFS shows a new file on another node. Stdlib only (it runs
inside vLLM).
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from connector.plugin.request_timing import external_id

MAX_WAIT_S = 30.0  # the longest one GET may wait for its params
OUTPUT_IDS_KEY = "pdbench_output_token_ids"  # D's output token ids, beside vLLM's params


class ParamsBoard:
    """Finished requests' params by request id, each taken once. Bounded: the oldest go
    first past ``max_entries`` or ``ttl_s`` (params nobody asks for: flows without a pull)."""

    def __init__(self, max_entries: int = 4096, ttl_s: float = 600.0):
        self.max_entries = max_entries
        self.ttl_s = ttl_s
        self._entries: OrderedDict[str, tuple[float, dict[str, Any], list[int] | None]] = (
            OrderedDict()
        )
        self._changed = threading.Condition()

    def put(
        self, request_id: str, params: dict[str, Any], output_ids: list[int] | None = None
    ) -> None:
        """Keep ``params`` (and the request's ``output_ids``) under the id vLLM's
        ``request_id`` wraps. This runs in vLLM's scheduler for every finished request: no
        serialising here (``take`` does it, in the HTTP thread, for the params someone asks
        for)."""
        with self._changed:
            self._entries[external_id(request_id)] = (time.monotonic(), params, output_ids)
            self._drop_old()
            self._changed.notify_all()

    def take(self, key: str, wait_s: float = 0.0) -> bytes | None:
        """The params (JSON) of the request whose ``X-Request-Id`` is ``key``, removed; None
        when none arrives within ``wait_s``."""
        deadline = time.monotonic() + min(max(wait_s, 0.0), MAX_WAIT_S)
        with self._changed:
            while key not in self._entries:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._changed.wait(left)
            _, params, output_ids = self._entries.pop(key)
        if output_ids is not None:
            params = {**params, OUTPUT_IDS_KEY: output_ids}
        return json.dumps(params, default=list).encode()

    def __len__(self) -> int:
        return len(self._entries)

    def _drop_old(self) -> None:
        limit = time.monotonic() - self.ttl_s
        while self._entries and (
            len(self._entries) > self.max_entries or next(iter(self._entries.values()))[0] < limit
        ):
            self._entries.popitem(last=False)


class ParamsServer:
    """``ParamsBoard`` over HTTP on ``host:port``, served from daemon threads."""

    def __init__(self, board: ParamsBoard, host: str, port: int):
        self.board = board
        self.httpd = ThreadingHTTPServer((host, port), _handler(board))
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, name="pdbench-kv-params", daemon=True
        )

    @property
    def port(self) -> int:
        return self.httpd.server_address[1]

    def start(self) -> ParamsServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def parse_addr(addr: str) -> tuple[str, int]:
    """``host:port`` (the ``PDBENCH_KV_PARAMS_ADDR`` the launch spec sets) as a pair."""
    host, _, port = addr.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"PDBENCH_KV_PARAMS_ADDR={addr!r}: expected HOST:PORT")
    return host, int(port)


def _handler(board: ParamsBoard) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: the router asks once per turn

        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            url = urlsplit(self.path)
            if url.path == "/health":
                return self._send(200, b"ok", "text/plain")
            if not url.path.startswith("/kv_params/"):
                return self._send(404, b'{"error": "unknown path"}')
            key = url.path.removeprefix("/kv_params/")
            try:
                wait_s = float(parse_qs(url.query).get("wait_s", ["0"])[0])
            except ValueError:
                wait_s = 0.0
            data = board.take(key, wait_s) if key else None
            if data is None:
                return self._send(404, b'{"error": "no params for this request"}')
            return self._send(200, data)

        def _send(self, status: int, body: bytes, kind: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            return  # one line per request would flood the server's log

    return Handler
