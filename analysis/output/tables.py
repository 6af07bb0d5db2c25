"""The rows every output shows of the records themselves (computed once per analysis by
``analysis.pipeline``): the Points per deployment, the transfer bench, provenance and hosts.
The HTML report renders them, W&B logs them."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from analysis.load.runs import RunData, deployment_label
from analysis.method.deployment import Context
from analysis.questions.question import Answered


def _num(value: Any, fmt: str = ",.0f") -> str:
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return "–"
    return format(value, fmt)


def point_rows(data: RunData, labels: dict[str, str]) -> list[dict[str, Any]]:
    """One row per Point, its deployment by label (``labels``: id -> label)."""
    if not len(data.points):
        return []
    pts = data.points.sort_values(["deployment_id", "history_tokens", "flow", "repetition"])
    return [
        {
            "deployment": labels.get(p["deployment_id"], p["deployment_id"]),
            "flow": p["flow"],
            "history": _num(p["history_tokens"]),
            "repetition": p["repetition"],
            "run order": "–" if p["order_index"] < 0 else p["order_index"],
            "status": p["status"],
            "requests": p["requests"],
            "failed": p["failed_requests"],
            "TTFT p50 (ms)": _num(p["ttft_ms_p50"], ".1f") if p["requests"] else "–",
            "ITL p50 (ms)": _num(p["itl_ms_p50"], ".2f") if p["requests"] else "–",
            "KV moved (MB)": _num((p["transfer_bytes"] or 0) / 1e6, ".2f"),
            "flags": p["flags"],
            "error": p["error"],
        }
        for _, p in pts.iterrows()
    ]


def bench_rows(bench: pd.DataFrame) -> list[dict[str, Any]]:
    need = {"op", "layout", "tp_split", "tokens", "gb_s"}
    if not len(bench) or not need <= set(bench.columns):
        return []
    ok = bench[bench["status"] == "ok"] if "status" in bench else bench
    keys = [k for k in ("op", "layout", "tp_split", "ucx_tls", "memory") if k in ok]
    pivot = ok.pivot_table(index=keys, columns="tokens", values="gb_s", aggfunc="median")
    rows = []
    for idx, row in pivot.iterrows():
        idx = idx if isinstance(idx, tuple) else (idx,)
        entry = {k: v for k, v in zip(keys, idx, strict=True)}
        entry.update({f"{int(t):,} tok (GB/s)": _num(v, ".3g") for t, v in row.items()})
        rows.append(entry)
    return rows


def provenance_rows(data: RunData) -> list[dict[str, Any]]:
    rows = []
    for run_dir, m in data.manifests.items():
        prov = m.provenance
        jobs = ", ".join(j.job_id for j in m.jobs)
        rows.append(
            {
                "run dir": run_dir,
                "name": m.name,
                "git sha": prov.git_sha or "?",
                "python": prov.python,
                "packages": ", ".join(f"{k} {v}" for k, v in prov.packages.items()),
                "UCX": prov.ucx,
                "CPU": prov.cpu,
                "GPUs": ", ".join(map(str, prov.gpus)) or "none",
                "host": prov.hostname,
                "SLURM jobs": jobs or "–",
            }
        )
    return rows


def host_rows(data: RunData) -> list[dict[str, Any]]:
    """Where each instance of each run dir ran (the Points' ``hosts``, last one read wins)."""
    seen: dict[tuple[str, str], str] = {}
    pts = data.points
    for run_dir, text in zip(pts["run_dir"], pts["hosts"], strict=True):
        for inst, where in json.loads(str(text or "{}")).items():
            seen[(str(run_dir), inst)] = where
    return [{"run dir": r, "instance": i, "host:port": h} for (r, i), h in sorted(seen.items())]


@dataclass
class Tables:
    """Every table of one analysis: each question's (by question, then name) and the
    records' own."""

    questions: dict[str, dict[str, list[dict[str, Any]]]] = field(default_factory=dict)
    points: list[dict[str, Any]] = field(default_factory=list)
    bench: list[dict[str, Any]] = field(default_factory=list)
    provenance: list[dict[str, Any]] = field(default_factory=list)
    hosts: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def of(cls, ctx: Context, answered: list[Answered]) -> Tables:
        data = ctx.data
        ids = data.points["deployment_id"].unique() if len(data.points) else []
        labels = {d: deployment_label(d, data.points) for d in ids}
        return cls(
            questions={a.question.name: a.tables() for a in answered},
            points=point_rows(data, labels),
            bench=bench_rows(data.bench),
            provenance=provenance_rows(data),
            hosts=host_rows(data),
        )
