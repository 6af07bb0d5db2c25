"""Settings a command line gives that its command never reads (pure): refused, not ignored.

``bench.*`` outside the transfer bench; the workload, flows and topology inside it. (A value
given for a sweep axis is never dropped: an axis is one field, ``pdbench.config.axes``.)
"""

from __future__ import annotations

from pdbench.config.problems import ConfigProblem
from pdbench.config.schema import Command, RunConfig

# Config sections (or keys) a command never reads, and the command that does.
UNREAD: dict[Command, tuple[tuple[str, ...], str]] = {
    Command.run: (("bench",), "+experiment=transfer_bench (command=transfer_bench)"),
    Command.preflight: (("bench",), "+experiment=transfer_bench (command=transfer_bench)"),
    Command.transfer_bench: (
        ("workload", "flow", "topology", "connector", "tracking"),
        "a run (+experiment=smoke, crossover, ...): the bench moves KV between two NIXL "
        "agents, no vLLM server, no workload",
    ),
}


def given_values(overrides: list[str]) -> dict[str, str]:
    """Dotted key -> value as typed, for the keys a job's overrides set (``+``/``~``
    dropped; a group by its name)."""
    given = {}
    for override in overrides:
        key, _, value = override.partition("=")
        key = key.lstrip("+~")
        if key and "/" not in key and not key.startswith("hydra"):
            given[key] = value
    return given


def unread_settings(overrides: list[str], cfg: RunConfig) -> list[ConfigProblem]:
    """Settings ``overrides`` (one job's) give that ``cfg.command`` never reads."""
    if cfg.command not in UNREAD:
        return []
    sections, reader = UNREAD[cfg.command]
    out = []
    for key, value in given_values(overrides).items():
        if key.split(".", 1)[0] in sections:
            out.append(
                ConfigProblem(
                    key,
                    value,
                    f"is not read by the {cfg.command.value} command: it would change nothing "
                    "measured",
                    f"drop it, or give it to {reader}",
                )
            )
    return out
