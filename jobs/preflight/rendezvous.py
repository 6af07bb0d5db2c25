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

Files, not sockets, carry the addresses: the run dir is the one channel tasks already share
(``connector.shared_files.Rendezvous``, the one file rendezvous of every job).
"""

from __future__ import annotations

import secrets
import socket
import threading
from pathlib import Path
from typing import Any

from connector.shared_files import Rendezvous

POLL_S = 0.2


def node_file(rank: int) -> str:
    return f"node-{rank}.json"


def done_file(rank: int) -> str:
    return f"done-{rank}"


def new_token() -> str:
    return secrets.token_hex(16)


def publish(rdv: Path, rank: int, record: dict[str, Any]) -> Path:
    return Rendezvous(rdv).publish_json(node_file(rank), record)


def wait_for_peers(
    rdv: Path, ranks: list[int], timeout_s: float
) -> tuple[dict[int, dict[str, Any]], list[int]]:
    """Records of ``ranks`` as they appear; (found, missing) after ``timeout_s`` at most."""
    names = {node_file(rank): rank for rank in ranks}
    found, missing = Rendezvous(rdv).gather(names, timeout_s, max_pause_s=POLL_S)
    return {names[n]: record for n, record in found.items()}, [names[n] for n in missing]


def mark_done(rdv: Path, rank: int) -> None:
    Rendezvous(rdv).publish(done_file(rank), "done\n")


def wait_done(rdv: Path, ranks: list[int], timeout_s: float) -> list[int]:
    """Ranks not done after ``timeout_s`` (empty when all are)."""
    names = {done_file(rank): rank for rank in ranks}
    meeting = Rendezvous(rdv)
    _, missing = meeting.gather(names, timeout_s, parse=meeting.read, max_pause_s=POLL_S)
    return [names[n] for n in missing]


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
