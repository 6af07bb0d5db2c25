"""A process that dies with its parent: Linux's parent-death signal (``PR_SET_PDEATHSIG``).

Servers and the router are started with it (``jobs.serving.server``): SIGKILL when the task
that started them dies, however it dies, so nothing of a run outlives it. A vLLM server's
engine core asks for it too (``connector.plugin.vllm_plugin``, in pdbench's runs only): when its
API server is killed alone, the engine core does not linger holding the server's socket.
The signal follows the parent *thread*: each is started from its starter's main thread.
"""

from __future__ import annotations

import ctypes
import os
import signal

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(parent: int, sig: signal.Signals = signal.SIGKILL) -> bool:
    """Have the kernel send ``sig`` to this process when its parent dies (False where it
    cannot: not Linux); exit at once when ``parent`` is already gone (it died before)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        done = libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False
    if os.getppid() != parent:
        os._exit(1)
    return done
