"""Read run directories into pandas dataframes.

What is read (``pdbench.results.store`` defines the first three)::

    <run>/manifest.json              provenance, composed config
    <run>/points/<id>.json           PointResult -> ``points`` (one row) + ``turns`` (by_turn)
    <run>/requests/<id>.jsonl        RequestRecord lines -> ``requests``
    <run>/traces/<dir>/*.jsonl       one line per KV transfer -> ``traces``; <dir> is a
                                     point id or a deployment id
    <run>/transfer_bench/*.json      transfer-bench records (``connector/bench_record.py``)

A point or request file that is not valid JSON (truncated by a crash, edited by hand) is a
*corrupt* record: named by file in ``RunData.corrupt``, never counted ok;
``python -m analysis`` exits non-zero on any unless told ``--skip-corrupt``.

Record fields read beyond ``pdbench.results.store``' dataclasses (absent in older runs, then the
default): a Point's ``repetition`` (0) and ``order_index`` (-1, its place in its
Deployment's measured run order); a request's ``ttft_split`` (dict of ms parts) and
``split_source``, ``tpot_ms``, ``chunk_tokens``.

Trace lines come from the connector plugin, whose field names may differ between versions;
``TRACE_FIELDS`` below is the one place that says which names are accepted for what. A
line without bytes or a transfer time is counted as unreadable and skipped.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from pdbench.results.store import TTFT_SPLIT_PARTS as SPLIT_PARTS
from pdbench.results.store import CorruptRecord, RunStore

# canonical column -> accepted names, first match wins (connector/transfer_trace.py writes
# the first name of each). Times in seconds unless the name says ``_ms``/``_us``
# (converted); ``transfer_s`` falls back to ``end - post`` when absent. ``bytes`` < 0 (NIXL
# telemetry off) is unknown: the analysis then estimates it from ``tokens``. ``direction``
# is ``D<-P`` (D reads the hand-off), ``P<-D`` (P pulls the history), ``P->D`` (a push);
# without one it is derived from ``op`` (READ/WRITE). Lines with ``status`` other than
# ``ok`` are counted, not used.
TRACE_FIELDS: dict[str, tuple[str, ...]] = {
    "request_id": ("request_id", "req_id", "rid", "id"),
    "direction": ("direction", "dir"),
    "op": ("op", "kind"),
    "tokens": ("tokens", "num_tokens", "n_tokens"),
    "blocks": ("blocks", "num_blocks", "n_blocks"),
    "bytes": ("bytes", "nbytes", "num_bytes", "size_bytes", "size"),
    "descriptors": ("descriptors", "num_descs", "descs", "num_descriptors", "descriptor_count"),
    "post_s": ("post_time", "post_s", "posted_at", "t_post", "start_s", "start", "ts"),
    "end_s": ("done_time", "end_s", "end", "completed_at", "t_done", "finish_s"),
    "transfer_s": ("transfer_s", "transfer_time", "xfer_s", "duration_s", "elapsed_s", "time_s"),
    "transfer_ms": ("transfer_ms", "xfer_ms", "duration_ms", "elapsed_ms", "time_ms"),
    "transfer_us": ("transfer_us", "xfer_us", "duration_us", "elapsed_us"),
    "status": ("status",),
}

Progress = Callable[[str], None]


def _first(line: dict[str, Any], names: tuple[str, ...]) -> Any:
    for name in names:
        if name in line and line[name] is not None:
            return line[name]
    return None


def _float(value: Any) -> float | None:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


def normalize_trace(line: dict[str, Any]) -> dict[str, Any] | None:
    """One trace line in canonical columns; None without a transfer time or a size."""
    out: dict[str, Any] = {k: _first(line, TRACE_FIELDS[k]) for k in TRACE_FIELDS}
    seconds = _float(out.pop("transfer_s"))
    ms, us, end = _float(out.pop("transfer_ms")), _float(out.pop("transfer_us")), out.pop("end_s")
    post = _float(out["post_s"])
    if seconds is None and ms is not None:
        seconds = ms / 1e3
    if seconds is None and us is not None:
        seconds = us / 1e6
    if seconds is None and _float(end) is not None and post is not None:
        seconds = _float(end) - post
    nbytes, tokens = _float(out["bytes"]), _float(out["tokens"])
    if seconds is None or seconds < 0 or ((nbytes is None or nbytes < 0) and not tokens):
        return None
    out["transfer_s"], out["post_s"], out["tokens"] = seconds, post, tokens
    out["bytes"] = nbytes if nbytes is not None and nbytes >= 0 else math.nan
    op = str(out["op"] or "").upper()
    direction = str(out["direction"] or "")
    if not op:
        op = "READ" if "<-" in direction else "WRITE" if "->" in direction else ""
    out["op"] = op
    out["direction"] = direction or op.lower() or "?"
    out["status"] = str(out["status"] or "ok")
    ok = seconds > 0 and out["bytes"] == out["bytes"]
    out["gb_s"] = out["bytes"] / seconds / 1e9 if ok else math.nan
    return out


def _first_line(text: str) -> str:
    lines = str(text or "").strip().splitlines()
    return lines[0] if lines else ""


# Workload fields that are not its shape: a Point's own history length and repetition (and
# the seed, which is the repetition's), its load (named apart, below), an operational one.
NOT_SHAPE = frozenset(
    {"history_tokens", "repetition", "seed", "conversations", "concurrency", "request_timeout_s"}
)


def workload_shape(workload: dict[str, Any]) -> str:
    """A Point's workload fields that make its requests what they are besides the Point's own
    axes (the API, lengths, edits, ...), as canonical JSON."""
    shape = {k: v for k, v in workload.items() if k not in NOT_SHAPE}
    return json.dumps(shape, sort_keys=True, separators=(",", ":"), default=str)


def point_row(run_dir: str, p: dict[str, Any]) -> dict[str, Any]:
    """The flat row of one PointResult (deployment and workload keys pulled up)."""
    dep = p.get("deployment") or {}
    model = dep.get("model") or {}
    topo = dep.get("topology") or {}
    pre, dec = topo.get("prefill") or {}, topo.get("decode") or {}
    wl = p.get("workload") or {}
    s = p.get("summary") or {}
    tr = p.get("transfer") or {}
    history = wl.get("history_tokens", 0)
    if isinstance(history, list):  # a workload dict that kept the whole sweep axis
        history = history[0] if len(history) == 1 else -1
    p_tp, d_tp = int(pre.get("tp", 0) or 0), int(dec.get("tp", 0) or 0)
    repetition = wl.get("repetition", p.get("repetition", 0))
    return {
        "run_dir": run_dir,
        "point_id": p.get("point_id", ""),
        "repetition": int(repetition or 0),
        "order_index": int(p.get("order_index", -1) if p.get("order_index") is not None else -1),
        "status": p.get("status", "failed"),
        "error": _first_line(p.get("error", "")),
        "flow": p.get("flow", "?"),
        "deployment_id": dep.get("deployment_id", "?"),
        "model": model.get("name", "?"),
        "transport": (dep.get("transport") or {}).get("name", "?"),
        "ucx_tls": str((dep.get("transport") or {}).get("ucx_tls", "") or ""),
        "p_count": int(pre.get("count", 0) or 0),
        "p_tp": p_tp,
        "d_count": int(dec.get("count", 0) or 0),
        "d_tp": d_tp,
        "tp_pair": f"{p_tp}->{d_tp}" if p_tp and d_tp else "agg",
        "placement": str(topo.get("placement", "")),
        "threshold": dep.get("kv_recompute_threshold"),
        "ttl_s": dep.get("decoder_kv_blocks_ttl_s"),
        "block_size": (dep.get("server") or {}).get("block_size"),
        "history_tokens": int(history or 0),
        "kind": wl.get("kind", ""),
        "workload_shape": workload_shape(wl),
        "conversations": wl.get("conversations"),
        "concurrency": wl.get("concurrency"),
        "arrival": str(wl.get("arrival") or "waves"),
        "request_rate": float(wl.get("request_rate") or 0.0),
        "achieved_rate": (p.get("offered_load") or {}).get("achieved_rate"),
        "kept_up": (p.get("offered_load") or {}).get("kept_up"),
        "turns": wl.get("turns"),
        "user_tokens": wl.get("user_tokens", 0),
        "output_tokens": wl.get("output_tokens", 0),
        "requests": s.get("requests", 0),
        "failed_requests": s.get("failed_requests", 0),
        "ttft_ms_p50": (s.get("ttft_ms") or {}).get("p50"),
        "ttft_ms_mean": (s.get("ttft_ms") or {}).get("mean"),
        "itl_ms_p50": (s.get("itl_ms") or {}).get("p50"),
        "transfer_bytes": tr.get("bytes", 0.0),
        "transfer_seconds": tr.get("seconds", 0.0),
        "transfer_count": tr.get("count", 0.0),
        "started_at": p.get("started_at", 0.0),
        "finished_at": p.get("finished_at", 0.0),
        "flags": "; ".join(p.get("flags") or []),
        "flag_count": len(p.get("flags") or []),
        "transport_used": json.dumps(p.get("transport_used") or {}, sort_keys=True),
        "hosts": json.dumps(p.get("hosts") or {}, sort_keys=True),
        **{f"bill_{k}": v for k, v in (p.get("decode_bill") or {}).items()},
    }


POINT_COLUMNS = list(point_row("", {"point_id": "?"}))


def shape_kinds(rows: list[dict[str, Any]]) -> None:
    """Name the workload shape in ``kind`` where one (deployment, kind, history length) holds
    Points of several (in place): requests must pair within a shape, never across.

    ``workload.conversations`` and ``concurrency`` (several values) make Points that differ only in
    their load, named ``<kind> <N> conv x<C>``; jobs of a ``-m`` sweep that share a run dir
    and its servers (``workload.api=completions,chat``) make Points that differ in another
    workload field, named ``<kind> api=chat`` (each field that differs, ``key=value``; one
    a record lacks is not compared: older records)."""
    shapes: dict[tuple, dict[tuple, dict[str, Any]]] = {}
    for r in rows:
        cell = (r["deployment_id"], r["kind"], r["history_tokens"])
        load = (r.get("conversations"), r.get("concurrency"))
        fields = json.loads(r.get("workload_shape") or "{}")
        shapes.setdefault(cell, {})[(load, r.get("workload_shape") or "{}")] = fields
    for r in rows:
        cell = shapes[(r["deployment_id"], r["kind"], r["history_tokens"])]
        if len(cell) < 2:
            continue
        name = [r["kind"]]
        if len({load for load, _ in cell}) > 1:
            name.append(f"{r.get('conversations')} conv x{r.get('concurrency')}")
        mine = json.loads(r.get("workload_shape") or "{}")
        common = set.intersection(*(set(f) for f in cell.values()))
        for key in sorted(common):
            if len({json.dumps(f[key], sort_keys=True) for f in cell.values()}) > 1:
                value = mine[key]
                name.append(f"{key}={value if isinstance(value, str) else json.dumps(value)}")
        r["kind"] = " ".join(name)


def turn_rows(point: dict[str, Any], row: dict[str, Any]) -> list[dict[str, Any]]:
    keep = (
        "run_dir",
        "point_id",
        "deployment_id",
        "flow",
        "status",
        "history_tokens",
        "kind",
        "repetition",
    )
    out = []
    for t in point.get("by_turn") or []:
        paths = t.get("paths") or {}
        out.append(
            {
                **{k: row[k] for k in keep},
                **{k: v for k, v in t.items() if k != "paths"},
                "paths": ", ".join(f"{k}:{v}" for k, v in sorted(paths.items())),
            }
        )
    return out


@dataclass
class RunData:
    run_dirs: list[Path]
    manifests: dict[str, dict[str, Any]]  # run dir -> manifest
    points: pd.DataFrame
    turns: pd.DataFrame
    requests: pd.DataFrame
    traces: pd.DataFrame
    bench: pd.DataFrame
    deployments: dict[str, dict[str, Any]]  # deployment id -> PointResult.deployment
    notes: list[str] = field(default_factory=list)  # what is missing or odd, for the reader
    corrupt_points: list[str] = field(default_factory=list)  # "<file>: <what is wrong>"
    corrupt_requests: list[str] = field(default_factory=list)  # request files with bad lines

    @property
    def corrupt(self) -> list[str]:
        """Every corrupt record file, named (never counted ok)."""
        return self.corrupt_points + self.corrupt_requests

    @property
    def ok_points(self) -> pd.DataFrame:
        return self.points[self.points["status"] == "ok"] if len(self.points) else self.points


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _read_jsonl(path: Path, bad_lines: list[str]) -> list[dict[str, Any]]:
    """The lines that parse to objects; ``<path>: N unreadable line(s)`` into ``bad_lines``."""
    rows, bad = [], 0
    for line in path.read_text(errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            bad += 1
            continue
        if isinstance(row, dict):
            rows.append(row)
        else:
            bad += 1
    if bad:
        bad_lines.append(f"{path}: {bad} unreadable line(s)")
    return rows


DROPPED = ("output_token_ids", "itl_ms", "chunk_tokens", "ttft_split")


def _request_rows(point: dict[str, Any], row: dict[str, Any], recs: list[dict]) -> list[dict]:
    out = []
    for r in recs:
        itl = [x for x in (r.get("itl_ms") or []) if isinstance(x, int | float)]
        split = r.get("ttft_split") if isinstance(r.get("ttft_split"), dict) else {}
        out.append(
            {
                "run_dir": row["run_dir"],
                "point_id": row["point_id"],
                "deployment_id": row["deployment_id"],
                "flow": r.get("flow", row["flow"]),
                "kind": row["kind"],
                "point_history_tokens": row["history_tokens"],
                "repetition": row["repetition"],
                "order_index": row["order_index"],
                **{k: v for k, v in r.items() if k not in DROPPED},
                "output_tokens": len(r.get("output_token_ids") or []),
                "itl_ms_mean": sum(itl) / len(itl) if itl else None,
                **{f"split_{k}": _float(split.get(k)) for k in SPLIT_PARTS if split},
            }
        )
    return out


def _point_at(windows: list[tuple[float, float, str]], t: float | None) -> str:
    """The Point whose [started_at, finished_at] holds time ``t`` ("" if none)."""
    if t is None:
        return ""
    return next((pid for start, end, pid in windows if start <= t <= end), "")


def _load_traces(
    root: Path, run_dir: str, points: list[dict[str, Any]], notes: list[str], run: str = ""
) -> list[dict[str, Any]]:
    """Trace dirs are named by Point or by deployment; a deployment's lines are given the
    Point whose time window holds their post time. ``run``: the run's label, when ids are
    qualified by it (``qualify``)."""
    point_dep = {p["point_id"]: p["deployment_id"] for p in points}
    windows: dict[str, list[tuple[float, float, str]]] = {}
    for p in points:
        if p["started_at"] and p["finished_at"]:
            windows.setdefault(p["deployment_id"], []).append(
                (p["started_at"], p["finished_at"], p["point_id"])
            )
    rows, skipped, failed = [], 0, 0
    for path in sorted((root / "traces").glob("**/*.jsonl")):
        owner = qualify(run, path.parent.name)
        for line in _read_jsonl(path, notes):  # a torn trace line is a note, not a record
            norm = normalize_trace(line)
            if norm is None:
                skipped += 1
                continue
            if norm["status"] != "ok":
                failed += 1
                continue
            dep = point_dep.get(owner) or qualify(run, line.get("deployment_id") or "") or owner
            point = owner if owner in point_dep else _point_at(windows.get(dep, []), norm["post_s"])
            rows.append(
                {
                    "run_dir": run_dir,
                    "point_id": point,
                    "deployment_id": dep,
                    "file": str(path.relative_to(root)),
                    **norm,
                }
            )
    if skipped:
        names = ", ".join(f"{k}: {'|'.join(v)}" for k, v in TRACE_FIELDS.items())
        notes.append(f"{run_dir}: {skipped} trace line(s) without a size or a time ({names})")
    if failed:
        notes.append(f"{run_dir}: {failed} traced transfer(s) failed (status != ok)")
    return rows


def _load_bench(root: Path, run_dir: str, notes: list[str]) -> list[dict[str, Any]]:
    rows = []
    for path in sorted((root / "transfer_bench").glob("*.json")):
        try:
            rec = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            notes.append(f"{path}: unreadable transfer-bench record ({exc})")
            continue
        flat = {k: (",".join(map(str, v)) if isinstance(v, list) else v) for k, v in rec.items()}
        flat.pop("times_s", None)
        rows.append({"run_dir": run_dir, **flat})
    return rows


def _read_point(path: Path, corrupt: list[str]) -> dict[str, Any] | None:
    """A PointResult dict, or None with ``<path>: <why>`` in ``corrupt``."""
    try:
        p = json.loads(path.read_text(errors="replace"))
    except json.JSONDecodeError as exc:
        corrupt.append(f"{path}: not valid JSON (truncated?): {exc}")
        return None
    except OSError as exc:
        corrupt.append(f"{path}: unreadable: {exc}")
        return None
    if not isinstance(p, dict) or not p.get("point_id"):
        corrupt.append(f"{path}: not a PointResult (no point_id)")
        return None
    return p


def run_labels(run_dirs: list[str | Path]) -> dict[str, str]:
    """A short name per run dir: its folder name, or as many trailing parts of its path as
    tell it from the others."""
    paths = [Path(d) for d in run_dirs]
    for depth in range(1, max((len(p.parts) for p in paths), default=1) + 1):
        names = ["/".join(p.parts[-depth:]) for p in paths]
        if len(set(names)) == len(names):
            return {str(p): name for p, name in zip(paths, names, strict=True)}
    return {str(p): str(p) for p in paths}


def qualify(run: str, record_id: str) -> str:
    """``run:id`` when several runs are analysed together, so that no Point or deployment of
    one run is ever pooled with another's (two runs of one config share their ids)."""
    return f"{run}:{record_id}" if run and record_id else record_id


def path_id(record_id: str) -> str:
    """The id a record's files are named by (its run's label dropped)."""
    return record_id.rsplit(":", 1)[-1]


def _qualified(p: dict[str, Any], run: str) -> dict[str, Any]:
    """A PointResult whose point and deployment ids name their run (``qualify``)."""
    if not run:
        return p
    dep = dict(p.get("deployment") or {})
    dep["deployment_id"] = qualify(run, str(dep.get("deployment_id", "?")))
    return {**p, "point_id": qualify(run, str(p["point_id"])), "deployment": dep}


def load_runs(run_dirs: list[str | Path], progress: Progress | None = _stderr) -> RunData:
    """Everything under the run dirs; missing pieces become notes, not errors. Several run
    dirs: each Point and deployment id is prefixed with its run's label (``run_labels``)."""
    say = progress or (lambda _msg: None)
    notes: list[str] = []
    corrupt: list[str] = []
    bad_requests: list[str] = []
    manifests: dict[str, dict[str, Any]] = {}
    points, turns, requests, traces, bench = [], [], [], [], []
    read: list[tuple[Path, dict[str, Any], dict[str, Any]]] = []  # (run dir, record, row)
    deployments: dict[str, dict[str, Any]] = {}
    labels = run_labels(run_dirs) if len(run_dirs) > 1 else {}
    for raw in run_dirs:
        root = Path(raw)
        run_dir = str(root)
        run = labels.get(run_dir, "")
        if not root.is_dir():
            notes.append(f"{run_dir}: not a directory")
            continue
        store = RunStore(root)
        try:
            manifests[run_dir] = store.read_manifest()
        except (OSError, CorruptRecord) as exc:
            notes.append(f"{run_dir}: no readable manifest.json (provenance unknown): {exc}")
        files = sorted(store.points_dir.glob("*.json")) if store.points_dir.is_dir() else []
        if len(files) > 50:
            say(f"[analysis] {run_dir}: reading {len(files)} point records ...")
        rows: list[dict[str, Any]] = []
        for i, path in enumerate(files):
            if len(files) > 50 and i and i % 100 == 0:
                say(f"[analysis]   {i}/{len(files)}")
            p = _read_point(path, corrupt)
            if p is None:
                continue
            p = _qualified(p, run)
            rows.append(point_row(run_dir, p))
            read.append((root, p, rows[-1]))
        points.extend(rows)
        traces.extend(_load_traces(root, run_dir, rows, notes, run))
        bench.extend(_load_bench(root, run_dir, notes))
    shape_kinds(points)  # before turns and requests copy each Point's kind
    for root, p, row in read:
        deployments.setdefault(row["deployment_id"], p.get("deployment") or {})
        turns.extend(turn_rows(p, row))
        req_file = root / (p.get("requests_file") or f"requests/{path_id(row['point_id'])}.jsonl")
        if req_file.is_file():
            requests.extend(_request_rows(p, row, _read_jsonl(req_file, bad_requests)))
    return RunData(
        run_dirs=[Path(d) for d in run_dirs],
        manifests=manifests,
        points=_frame(points, POINT_COLUMNS),
        turns=pd.DataFrame(turns),
        requests=pd.DataFrame(requests),
        traces=pd.DataFrame(traces),
        bench=pd.DataFrame(bench),
        deployments=deployments,
        notes=notes,
        corrupt_points=corrupt,
        corrupt_requests=bad_requests,
    )


def records_to_run_data(
    items: list[tuple[dict[str, Any], list[dict[str, Any]]]], run_dir: str = "(memory)"
) -> RunData:
    """A ``RunData`` from (PointResult dict, request dicts) pairs held in memory (the
    calibration test analyses hundreds of synthetic runs without writing them)."""
    points, turns, requests = [point_row(run_dir, p) for p, _ in items], [], []
    shape_kinds(points)
    deployments: dict[str, dict[str, Any]] = {}
    for (p, recs), row in zip(items, points, strict=True):
        deployments.setdefault(row["deployment_id"], p.get("deployment") or {})
        turns.extend(turn_rows(p, row))
        requests.extend(_request_rows(p, row, recs))
    return RunData(
        run_dirs=[Path(run_dir)],
        manifests={},
        points=_frame(points, POINT_COLUMNS),
        turns=pd.DataFrame(turns),
        requests=pd.DataFrame(requests),
        traces=pd.DataFrame(),
        bench=pd.DataFrame(),
        deployments=deployments,
    )


def _frame(rows: list[dict[str, Any]], columns: list[str]) -> pd.DataFrame:
    return pd.DataFrame(rows) if rows else pd.DataFrame(columns=columns)


def deployment_label(dep_id: str, points: pd.DataFrame, omit: tuple[str, ...] = ()) -> str:
    """``model · transport · TP P->D · placement · threshold`` for a deployment id.

    ``omit``: parts left out (``"transport"``, ``"tp"``, ``"placement"``, ``"threshold"``,
    ``"ttl"``), to name the family of deployments that differ only by that part. The TTL is
    named only where the deployments differ by it.
    """
    rows = points[points["deployment_id"] == dep_id] if len(points) else points
    if not len(rows):
        return dep_id
    r = rows.iloc[0]
    parts = [str(r["model"])] + ([] if "transport" in omit else [str(r["transport"])])
    if points["run_dir"].nunique() > 1:  # several runs: every line names its own
        parts.insert(0, f"run {dep_id.rsplit(':', 1)[0]}")
    if "tp" not in omit:
        parts.append(f"TP {r['tp_pair']}" if r["tp_pair"] != "agg" else "agg")
    if r.get("placement") and "placement" not in omit:
        parts.append(str(r["placement"]))
    thr = r["threshold"]
    if thr is not None and not pd.isna(thr) and "threshold" not in omit:
        parts.append(f"thr {thr}")
    ttls = points["ttl_s"].dropna().unique() if "ttl_s" in points else []
    if len(ttls) > 1 and "ttl" not in omit:  # a TTL sweep: name each deployment's
        parts.append(f"TTL {r['ttl_s']:g} s")
    return " · ".join(parts)
