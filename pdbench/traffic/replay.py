"""A trace as a run replays it: read (once per file version), cut, scaled, with its timing
resolved and its shape before and after; what validation, the dry run, the manifest and the
load generator all work from."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pdbench.config.schema import TraceConfig, TraceTiming
from pdbench.traffic.fitting import TraceCut, cut, largest_fitting_scale, longest_context, scaled
from pdbench.traffic.load import load_trace
from pdbench.traffic.openai_file import TokenCount, word_count
from pdbench.traffic.shape import describe, shape_of
from pdbench.traffic.trace import Trace, TraceFormat

WORDS = "words (the generated model's word-level tokenizer counts one token a word)"


@dataclass
class Replay:
    """What a run sends of a trace."""

    recorded: Trace  # as read
    replayed: Trace  # cut and scaled (times sped up when the timing is recorded)
    timing: TraceTiming  # recorded | arrival (never auto)
    length_scale: float
    speedup: float
    counted_by: str  # how an openai file's lengths were counted
    digest: str  # sha256 of the file: which version of it was replayed
    how: TraceCut  # the requests kept

    def largest_scale(self, max_model_len: int) -> float:
        """The largest length scale at which the kept requests fit ``max_model_len``."""
        return largest_fitting_scale(cut(self.recorded, self.how), max_model_len)

    @property
    def longest_context(self) -> int:
        return longest_context(self.replayed)

    def describe(self) -> list[str]:
        fmt = self.recorded.format.value
        how = (
            f"at the trace's times / {self.speedup:g} (open loop)"
            if self.timing is TraceTiming.recorded
            else "by the workload's arrival settings"
        )
        head = [
            f"trace {self.recorded.path} ({fmt}, sha256 {self.digest[:12]}): "
            f"lengths x {self.length_scale:g}, offered {how}"
        ]
        if self.recorded.format is TraceFormat.openai:
            head.append(f"  lengths counted as {self.counted_by}")
        notes = [f"  note: {n}" for n in self.recorded.notes]
        return head + notes + describe(shape_of(self.recorded), shape_of(self.replayed))

    def record(self) -> dict:
        """The manifest's account of the replay."""
        return {
            "path": self.recorded.path,
            "format": self.recorded.format.value,
            "sha256": self.digest,
            "timing": self.timing.value,
            "length_scale": self.length_scale,
            "speedup": self.speedup,
            "counted_by": self.counted_by,
            "notes": list(self.recorded.notes),
            "recorded": shape_of(self.recorded).record(),
            "replayed": shape_of(self.replayed).record(),
        }


def token_counter(model_path: str, generated: bool) -> tuple[TokenCount, str]:
    """How to count an openai file's tokens here: the model's own tokenizer when its
    ``tokenizer.json`` is on this machine, else words (exact for generated models)."""
    if generated or not model_path:
        return word_count, WORDS
    file = Path(model_path) / "tokenizer.json"
    if not file.is_file():
        return word_count, f"words, an estimate (no tokenizer.json at {model_path} here)"
    from tokenizers import Tokenizer  # lazy: only for openai files with a model's tokenizer

    tokenizer = Tokenizer.from_file(str(file))

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False).ids)

    return count, f"tokens of {file}"


def plan_replay(
    trace: TraceConfig,
    default_output: int,
    count: TokenCount = word_count,
    counted_by: str = WORDS,
) -> Replay:
    """``trace`` read, cut and scaled (``TraceError`` when the file cannot be read)."""
    path = Path(trace.path).expanduser()
    stat = path.stat() if path.is_file() else None
    key = (stat.st_mtime_ns, stat.st_size) if stat else (0, 0)
    recorded, digest = _read(
        str(path), key, trace.format, trace.block_tokens, default_output, counted_by, count
    )
    how = TraceCut(
        trace.start_s, trace.end_s, trace.max_requests, trace.min_turns, trace.max_conversations
    )
    timing = trace.timing
    if timing is TraceTiming.auto:
        timing = TraceTiming.recorded if recorded.timed else TraceTiming.arrival
    speedup = trace.speedup if timing is TraceTiming.recorded else 1.0
    replayed = scaled(cut(recorded, how), trace.length_scale, speedup)
    return Replay(recorded, replayed, timing, trace.length_scale, speedup, counted_by, digest, how)


@functools.lru_cache(maxsize=8)
def _read(
    path: str,
    version: tuple[int, int],
    fmt: TraceFormat,
    block_tokens: int,
    default_output: int,
    counted_by: str,
    count: Callable[[str], int],
) -> tuple[Trace, str]:
    """A file read once per version (validation, the dry run and the manifest share it)."""
    trace = load_trace(path, fmt, block_tokens, count, default_output)
    digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    return trace, digest
