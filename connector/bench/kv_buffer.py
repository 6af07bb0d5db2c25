"""The bench's buffer operations: integrity pattern, poison, verification, memcpy speed.

The owner's buffer holds its own int32 word index in every word (word ``w`` == ``w``), so
any byte the reader receives names the exact owner word it came from. Before a checked
transfer the reader poisons its buffer (all ``-1``, never a word index); afterwards every
word each descriptor covers must equal the owner word its remote descriptor points at.
Works on CPU and CUDA tensors alike (torch is imported inside each function).
"""

from __future__ import annotations

import time

_CHUNK_WORDS = 1 << 22  # words verified per step: bounds the index tensors to ~100 MB


def fill_pattern(buffer) -> None:
    """Word ``w`` of ``buffer`` (uint8 tensor) := ``w``."""
    import torch  # lazy: torch only on the allocation's tasks

    nwords = buffer.numel() // 4
    if nwords >= 2**31:
        raise ValueError("the integrity pattern covers at most 8 GiB per buffer")
    words = buffer[: nwords * 4].view(torch.int32)
    torch.arange(nwords, dtype=torch.int32, device=buffer.device, out=words)
    _sync(buffer)


def poison(buffer) -> None:
    buffer.fill_(0xFF)
    _sync(buffer)


def verify(buffer, local: list[tuple[int, int, int]], remote: list[tuple[int, int, int]]) -> bool:
    """True when every word under each local descriptor holds its remote word index."""
    import numpy as np  # lazy: ~0.1 s of `python -m pdbench`, which imports the bench job
    import torch  # lazy: torch only on the allocation's tasks

    if not local:
        return True
    loc = np.asarray(local, dtype=np.int64).reshape(-1, 3)
    rem = np.asarray(remote, dtype=np.int64).reshape(-1, 3)
    if np.any(loc[:, :2] % 4) or np.any(rem[:, 0] % 4):
        raise ValueError("verify needs descriptors aligned to 4-byte words")
    dev = buffer.device
    words = buffer[: (buffer.numel() // 4) * 4].view(torch.int32)
    counts = loc[:, 1] // 4
    ends = np.cumsum(counts)
    start = 0
    while start < len(loc):
        limit = (ends[start - 1] if start else 0) + _CHUNK_WORDS
        stop = max(start + 1, int(np.searchsorted(ends, limit, side="right")))
        n = torch.from_numpy(counts[start:stop]).to(dev)
        rep = torch.repeat_interleave(torch.arange(stop - start, device=dev), n)
        first = torch.cumsum(n, 0) - n
        within = torch.arange(int(n.sum()), device=dev) - first[rep]
        idx = torch.from_numpy(loc[start:stop, 0] // 4).to(dev)[rep] + within
        want = torch.from_numpy(rem[start:stop, 0] // 4).to(dev)[rep] + within
        if not torch.equal(words[idx], want.to(torch.int32)):
            return False
        start = stop
    return True


def allocate_like(buffer, nbytes: int):
    """An uninitialised uint8 tensor of ``nbytes`` on ``buffer``'s device."""
    import torch  # lazy: torch only on the allocation's tasks

    return torch.empty(max(nbytes, 1), dtype=torch.uint8, device=buffer.device)


def memcpy_gb_s(src, dst, nbytes: int, iterations: int) -> float:
    """Median GB/s of copying ``nbytes`` from ``src`` to ``dst`` (same memory kind)."""
    if nbytes <= 0:
        return 0.0
    a, b = src[:nbytes], dst[:nbytes]
    b.copy_(a)  # first touch
    _sync(src)
    times = []
    for _ in range(max(1, iterations)):
        start = time.perf_counter()
        b.copy_(a)
        _sync(src)
        times.append(time.perf_counter() - start)
    times.sort()
    return nbytes / times[len(times) // 2] / 1e9


def _sync(tensor) -> None:
    if tensor.device.type == "cuda":
        import torch  # lazy: torch only on the allocation's tasks

        torch.cuda.synchronize(tensor.device)
