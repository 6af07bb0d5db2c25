"""Read a trace in any format pdbench knows, detecting the format where the content says it."""

from __future__ import annotations

import json
from pathlib import Path

from pdbench.traffic.mooncake import read_mooncake
from pdbench.traffic.openai_file import TokenCount, read_openai, word_count
from pdbench.traffic.recorded import read_recorded
from pdbench.traffic.trace import Trace, TraceError, TraceFormat


def detect(path: str | Path) -> TraceFormat:
    """The format of ``path`` from its content: a first line with ``hash_ids`` is
    Mooncake's, with ``session`` and ``prompt_tokens`` a pdbench request log; a JSON list
    or object of message lists is an OpenAI conversation file."""
    name = str(path)
    text = Path(path).read_text()
    first = next((line for line in text.splitlines() if line.strip()), "")
    if not first:
        raise TraceError(name, "", "is empty", "a trace with at least one request")
    try:
        row = json.loads(first)
    except json.JSONDecodeError:
        row = None
    if isinstance(row, dict) and "hash_ids" in row:
        return TraceFormat.mooncake
    if isinstance(row, dict) and "session" in row and "prompt_tokens" in row:
        return TraceFormat.pdbench
    if first.lstrip().startswith(("[", "{")):
        return TraceFormat.openai
    raise TraceError(
        name,
        "line 1",
        "is none of the formats pdbench reads (mooncake, openai, pdbench)",
        "set workload.trace.format, or see docs/traffic.md",
    )


def load_trace(
    path: str | Path,
    fmt: TraceFormat = TraceFormat.auto,
    block_tokens: int = 512,
    count: TokenCount = word_count,
    default_output: int = 16,
) -> Trace:
    """The trace at ``path`` read into conversations (``TraceError`` naming the file, the
    line or conversation and the field when it cannot be)."""
    if not Path(path).is_file():
        raise TraceError(str(path), "", "is not a file", "workload.trace.path=<a trace file>")
    kind = detect(path) if fmt is TraceFormat.auto else fmt
    if kind is TraceFormat.mooncake:
        return read_mooncake(path, block_tokens)
    if kind is TraceFormat.openai:
        return read_openai(path, count, default_output)
    return read_recorded(path, default_output)
