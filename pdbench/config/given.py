"""What a command line gives, against what its job will measure (pure): no value is dropped.

Two ways a value typed on the command line could go unmeasured, both refused here with the
spelling that measures it:

- **A single value beside the list that replaces it.** Some settings exist as one value and
  as a list of values (``SCALAR_AXES``): ``flow.decoder_kv_blocks_ttl_s`` and
  ``flow.decoder_kv_blocks_ttls_s``, ``workload.concurrency`` and ``workload.concurrencies``...
  The rule, for every such pair: a list that is not empty is the axis and replaces the
  single value; ``[]`` means "just the single value". So a preset's list wins over the
  default single value, and a list given on the command line wins over a preset's single
  value (a sweep was asked for). A single value *given* while the composed list is not
  empty would be dropped silently (``+experiment=decode_cost flow.decoder_kv_blocks_ttl_s=3``
  ran TTL 8 s and 20 s): it is refused, and the fix spells the list that measures it
  (``'flow.decoder_kv_blocks_ttls_s=[3]'``). Refused rather than letting the single value win:
  the list is the preset's question (which TTL, which threshold, which working set), a typed
  value must not quietly drop it, and the fix says which of the two the user meant.
- **A setting the command never reads** (``UNREAD``): ``bench.*`` outside the transfer bench,
  the workload, flows and topology inside it.

A unit test walks the schema: every list setting is either a pair's list here or one of
``LISTS_OF_THEIR_OWN``, so a new pair cannot slip by.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pdbench.config.problems import ConfigProblem
from pdbench.config.schema import Command, RunConfig


@dataclass(frozen=True)
class ScalarAxis:
    """A setting given as one value (``scalar``) or as a list of values (``values``)."""

    scalar: str  # dotted key
    values: str  # dotted key of the list that, when not empty, replaces the scalar
    command: Command = Command.run  # the command that reads them


SCALAR_AXES: tuple[ScalarAxis, ...] = (
    ScalarAxis("flow.kv_recompute_threshold", "flow.kv_recompute_thresholds"),
    ScalarAxis("flow.decoder_kv_blocks_ttl_s", "flow.decoder_kv_blocks_ttls_s"),
    ScalarAxis("workload.conversations", "workload.conversation_counts"),
    ScalarAxis("workload.concurrency", "workload.concurrencies"),
    # the transfer bench measures each UCX_TLS variant of bench.ucx_tls; []: transport.ucx_tls
    ScalarAxis("transport.ucx_tls", "bench.ucx_tls", Command.transfer_bench),
)

# List settings that replace no single value: axes of their own, or plain lists.
LISTS_OF_THEIR_OWN: dict[str, str] = {
    "workload.history_tokens": "an axis (a prefix length per Point)",
    "flow.flows": "an axis (a flow per Point)",
    "transport.backends": "NIXL backends, all of them used",
    "transport.expected_ucx_transports": "what the preflight expects, any of them",
    "server.extra_args": "vLLM flags, all passed",
    "cluster.setup": "shell lines, all run",
    "cluster.container_mounts": "bind mounts, all made",
    "cluster.srun_args": "srun options, all passed",
    "bench.tokens": "a bench axis",
    "bench.layouts": "a bench axis",
    "bench.tp_splits": "a bench axis",
    "bench.ops": "a bench axis",
    "bench.descs_per_block": "a bench axis",
}

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


def value_at(cfg: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


def _text(values: list[Any]) -> str:
    return "[" + ",".join(str(getattr(v, "value", v)) for v in values) + "]"


def scalar_beside_list(keys: dict[str, str], cfg: RunConfig) -> list[ConfigProblem]:
    """A single value given while the composed list that replaces it is not empty."""
    out = []
    for axis in SCALAR_AXES:
        if axis.scalar not in keys or cfg.command is not axis.command:
            continue
        values = list(value_at(cfg, axis.values))
        if not values:
            continue
        given = value_at(cfg, axis.scalar)
        given = getattr(given, "value", given)
        listed = f"{axis.values}={_text(values)}"
        if axis.values in keys:
            message = f"is given beside {listed}, which replaces it: it would not be measured"
            fix = f"one of the two: the list alone, or '{axis.values}=[]' {axis.scalar}={given}"
        else:
            message = (
                f"is replaced by {listed}, which the preset sets: each of the list's values "
                "is measured, this one would not be"
            )
            fix = (
                f"'{axis.values}=[{given}]' to measure this value alone, or "
                f"'{axis.values}={_text([*values, given])}' to add it"
            )
        out.append(ConfigProblem(axis.scalar, given, message, fix))
    return out


def unread_settings(given: dict[str, str], cfg: RunConfig) -> list[ConfigProblem]:
    """Settings given that ``cfg.command`` never reads."""
    if cfg.command not in UNREAD:
        return []
    sections, reader = UNREAD[cfg.command]
    out = []
    for key, value in given.items():
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


def given_problems(overrides: list[str], cfg: RunConfig) -> list[ConfigProblem]:
    """Every value of ``overrides`` (one job's) its composed config ``cfg`` would not measure."""
    given = given_values(overrides)
    return scalar_beside_list(given, cfg) + unread_settings(given, cfg)
