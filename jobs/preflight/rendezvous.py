"""The preflight's cross-node protocol, through a rendezvous directory in the run dir.

Every task (rank r of N) of one preflight, in the same directory ``rdv``:

1. starts a ``TokenServer`` on its node address (an ephemeral TCP port that answers every
   connection with this task's random token);
2. ``publish``es ``node-<r>.json`` (rank, host, address, port, token), atomically;
3. ``wait_for_peers``: every other rank's file must appear. One that does not is the
   run-dir check failing: the directory is not shared (or that task never started);
4. ``probe_peer`` for each peer: connect to its address and port and read back its token.
   Reaching a port that answers with another token means the address led elsewhere (a
   loopback alias); refused or timed out means the address is not reachable from here;
5. ``mark_done`` then ``wait_done`` (every rank probed) before stopping its TokenServer.

Files, not sockets, carry the addresses: the run dir is the one channel tasks already share.
"""

from __future__ import annotations

import json
import secrets
import socket
import threading
import time
from pathlib import Path
from typing import Any

from connector.shared_files import write_bytes_atomic

POLL_S = 0.2


def node_file(rdv: Path, rank: int) -> Path:
    return rdv / f"node-{rank}.json"


def done_file(rdv: Path, rank: int) -> Path:
    return rdv / f"done-{rank}"


def report_file(rdv: Path, rank: int) -> Path:
    """Where rank ``rank`` leaves its ``NodeReport`` (``runner.run_preflight``)."""
    return Path(rdv) / f"report-{rank}.json"


def new_token() -> str:
    return secrets.token_hex(16)


def write_atomic(path: Path, text: str) -> None:
    write_bytes_atomic(path, text.encode())


def publish(rdv: Path, rank: int, record: dict[str, Any]) -> Path:
    rdv.mkdir(parents=True, exist_ok=True)
    path = node_file(rdv, rank)
    write_atomic(path, json.dumps(record, sort_keys=True))
    return path


def _read(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def wait_for_peers(
    rdv: Path, ranks: list[int], timeout_s: float
) -> tuple[dict[int, dict[str, Any]], list[int]]:
    """Records of ``ranks`` as they appear; (found, missing) after ``timeout_s`` at most."""
    found: dict[int, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout_s
    while True:
        for rank in ranks:
            if rank not in found:
                record = _read(node_file(rdv, rank))
                if record is not None:
                    found[rank] = record
        missing = [r for r in ranks if r not in found]
        if not missing or time.monotonic() >= deadline:
            return found, missing
        time.sleep(POLL_S)


def mark_done(rdv: Path, rank: int) -> None:
    write_atomic(done_file(rdv, rank), "done\n")


def wait_done(rdv: Path, ranks: list[int], timeout_s: float) -> list[int]:
    """Ranks not done after ``timeout_s`` (empty when all are)."""
    deadline = time.monotonic() + timeout_s
    while True:
        missing = [r for r in ranks if not done_file(rdv, r).exists()]
        if not missing or time.monotonic() >= deadline:
            return missing
        time.sleep(POLL_S)


class TokenServer:
    """A TCP listener on ``address`` that answers each connection with ``token``."""

    def __init__(self, address: str, token: str):
        self.token = token
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((address, 0))
        self._sock.listen(16)
        self._sock.settimeout(POLL_S)
        self.port = self._sock.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="preflight-token", daemon=True)

    def __enter__(self) -> TokenServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sock.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                try:
                    conn.sendall(self.token.encode() + b"\n")
                except OSError:
                    pass


def probe_peer(address: str, port: int, token: str, timeout_s: float = 5.0) -> str:
    """ "" when ``address:port`` answers with ``token``; else what happened, in words."""
    try:
        with socket.create_connection((address, port), timeout=timeout_s) as conn:
            conn.settimeout(timeout_s)
            data = b""
            while not data.endswith(b"\n") and len(data) < 256:
                chunk = conn.recv(256)
                if not chunk:
                    break
                data += chunk
    except TimeoutError:
        return f"{address}:{port} timed out after {timeout_s:.0f} s"
    except OSError as err:
        return f"{address}:{port}: {err.strerror or err}"
    answer = data.decode(errors="replace").strip()
    if answer != token:
        return f"{address}:{port} answered as another process (not that node's preflight)"
    return ""
