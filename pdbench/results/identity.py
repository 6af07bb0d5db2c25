"""What a run's identity covers: the settings that change a measurement, not the operational
knobs one changes to get a run through (timeouts, ports, paths, tracking, where it runs).

One rule, written once here and used twice: ids (``pdbench.plan.deployments``: a
Deployment's id hashes its measured server-side settings; ``pdbench.plan.points``: a Point's
id its Deployment, flow and measured workload) and the run dir's manifest
(``pdbench.results.manifest``: a launch whose measured config differs from the dir's is
refused). A rerun after a crash may change any operational knob and still resumes: its
Points keep their ids, so those recorded ``ok`` are skipped.

=========  ============================================  =====================================
section    measured: in ids                              operational: not in ids
=========  ============================================  =====================================
model      every field (shape, weights path, dtype...)
topology   every field (roles, TP, placement)
transport  backends, memory kind, UCX settings, env      expected_ucx_transports, expected_gb_s,
                                                         preflight_floor_share (checks and
                                                         flags, not the transfer)
server     vLLM flags, KV space, threads, env, extra     startup_timeout_s, base_port,
           args, kv_load_failure_policy                  side_channel_base_port, router_port,
                                                         vllm_base_port, cpu_start (how a
                                                         server starts, not what it runs)
flow       kv_recompute_threshold, decoder_kv_blocks_   kv_sample_period_s (how often D's KV
           ttl_s, kv_tail (D waits out the TTL after    occupancy is read, not what D does),
                                                         serve (what `serve` serves)
           each Point); for decode_first Points also
           cache_hit_threshold, decode_first_fallback;
           for policy, static_light and static_heavy
           Points policy, policy_force
workload   every field (shape, rate, seed, history)      request_timeout_s
connector  trace (tracing costs time on the servers)
others     -                                             cluster, tracking, launch, bench, name,
                                                         dir, cache_dir, command: where and how
                                                         it runs (each launch's hardware is in
                                                         the manifest's history)
=========  ============================================  =====================================

The sweep axes (``SWEEP_AXES``) are measured, but each Point carries its own value of them:
a launch may add values (another history length, flow or threshold) to a dir without
changing what is already there, so the manifest's comparison leaves the lists out.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pdbench.config.axes import axes_of
from pdbench.config.schema import RunConfig
from pdbench.results.jsonable import to_jsonable

# Config sections whose settings change what is measured.
MEASURED_SECTIONS = ("model", "topology", "transport", "server", "flow", "workload", "connector")

# Fields of those sections that do not change a measurement (see the table above).
OPERATIONAL: dict[str, frozenset[str]] = {
    "transport": frozenset({"expected_ucx_transports", "expected_gb_s", "preflight_floor_share"}),
    "server": frozenset(
        {
            "startup_timeout_s",
            "base_port",
            "side_channel_base_port",
            "router_port",
            "vllm_base_port",
            "cpu_start",
        }
    ),
    "workload": frozenset({"request_timeout_s"}),
    "flow": frozenset({"kv_sample_period_s", "serve", "match_prefix"}),
}

# Router knobs that change only the Points of one flow: in those Points' ids.
FLOW_KNOBS: dict[str, tuple[str, ...]] = {
    "decode_first": ("cache_hit_threshold", "decode_first_fallback"),
    "policy": ("policy", "policy_force"),
    "static_light": ("policy", "policy_force"),
    "static_heavy": ("policy", "policy_force"),
}

# Settings whose values become separate Deployments or Points (dotted keys): the schema's
# axes (pdbench.config.axes) and the retired lists that were axes before them.
SWEEP_AXES = frozenset(
    {
        *axes_of(RunConfig),
        "flow.kv_recompute_thresholds",
        "workload.conversation_counts",
        "workload.concurrencies",
        "flow.decoder_kv_blocks_ttls_s",
        # more repetitions add Points; the order seed only reorders them
        "workload.repetitions",
        "workload.order_seed",
    }
)

# Fields retired since run dirs were recorded, with the value every Point id hashed them at:
# ids still hash them so that a dir recorded before resumes (its Points keep their ids).
# (The twin lists of one sweep axis each, pdbench.config.axes: "[]" meant "the one value".)
RETIRED: dict[str, dict[str, Any]] = {
    "workload": {"conversation_counts": [], "concurrencies": []},
}


# Fields added after run dirs were recorded, with the value those runs had without naming it:
# left out of ids and of the manifest's comparison while they hold it, so that a dir
# recorded before resumes (its Points keep their ids); any other value is measured.
ADDED_LATER: dict[str, dict[str, Any]] = {
    "workload": {
        "arrival": "waves",
        "burstiness": 1.0,
        "trace": {
            "path": "",
            "format": "auto",
            "block_tokens": 512,
            "length_scale": 1.0,
            "speedup": 1.0,
            "timing": "auto",
            "start_s": 0.0,
            "end_s": 0.0,
            "max_requests": 0,
            "min_turns": 1,
            "max_conversations": 0,
            "sha256": "",
        },
    },
    "flow": {"policy": "", "policy_force": False},
    "transport": {"nics_by_gpu": []},
}


def measured(section: str, record: dict[str, Any]) -> dict[str, Any]:
    """``record`` (one section of a config, as JSON) without its operational fields, and
    without fields added later that hold the value older records implied (``ADDED_LATER``)."""
    dropped = OPERATIONAL.get(section, frozenset())
    later = ADDED_LATER.get(section, {})
    return {
        k: v for k, v in record.items() if k not in dropped and not (k in later and v == later[k])
    }


def with_retired(section: str, record: dict[str, Any]) -> dict[str, Any]:
    """``record`` (one section as an id hashes it) with the fields retired from it at the value
    ids hashed them at (``RETIRED``)."""
    return {**record, **RETIRED.get(section, {})}


def flow_knobs(flow: str, flow_record: dict[str, Any]) -> dict[str, Any]:
    """The router knobs that change the Points of ``flow`` (``{}`` for most flows)."""
    return {k: flow_record[k] for k in FLOW_KNOBS.get(flow, ())}


def stable_hash(data: Any, length: int = 10) -> str:
    """The first ``length`` hex digits of the SHA-256 of ``data`` as canonical JSON: an id."""
    text = json.dumps(to_jsonable(data), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def _flatten(value: Any, prefix: str, out: dict[str, Any]) -> None:
    if isinstance(value, dict) and value:
        for key, item in value.items():
            _flatten(item, f"{prefix}.{key}" if prefix else str(key), out)
    else:
        out[prefix] = value


def measured_config(config: dict[str, Any]) -> dict[str, Any]:
    """Dotted key -> value of every measured setting of a composed config (its JSON form,
    as the manifest keeps it), sweep axes left out."""
    out: dict[str, Any] = {}
    for section in MEASURED_SECTIONS:
        _flatten(measured(section, config.get(section) or {}), section, out)
    return {k: v for k, v in out.items() if k not in SWEEP_AXES}


def operational_config(config: dict[str, Any]) -> dict[str, Any]:
    """Dotted key -> value of the operational settings of the measured sections."""
    return {
        f"{section}.{key}": (config.get(section) or {}).get(key)
        for section, keys in OPERATIONAL.items()
        for key in sorted(keys)
    }


def differences(old: dict[str, Any], new: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """``(key, old value, new value)`` for every key whose value differs (a missing key: None)."""
    return [
        (key, old.get(key), new.get(key))
        for key in sorted(old.keys() | new.keys())
        if old.get(key) != new.get(key)
    ]
