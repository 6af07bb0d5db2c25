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

Every record is read back into its type (``records.read``: ``PointResult``,
``RequestRecord``, ``TransferTraceRecord``, ``TransferRecord``), a newer ``schema_version``
refused with the version named; the frames' columns come from those types' attributes.
A trace line without bytes (NIXL telemetry off) gets them estimated from its tokens.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, TypeVar

import pandas as pd

from pdbench.results.store import CorruptRecord, RunStore
from records import read
from records.bench import TransferRecord
from records.manifest import Manifest
from records.model import ModelShape
from records.point import TTFT_SPLIT_PARTS as SPLIT_PARTS
from records.point import DeploymentView, PointResult, PointStatus, RequestRecord, view
from records.read import RecordError, SchemaVersionError
from records.trace import TransferTraceRecord

Progress = Callable[[str], None]
T = TypeVar("T")


def _float(value: Any) -> float | None:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


def trace_row(t: TransferTraceRecord) -> dict[str, Any]:
    """One traced transfer as a ``traces`` row: ``transfer_s`` and ``post_s`` (seconds),
    ``bytes`` (NaN when NIXL telemetry was off: the analysis estimates it from ``tokens``)
    and the GB/s they give."""
    nbytes = float(t.bytes) if t.bytes >= 0 else math.nan
    ok = t.transfer_s > 0 and nbytes == nbytes
    return {
        "request_id": t.request_id,
        "direction": t.direction or t.op.lower() or "?",
        "op": t.op.upper(),
        "tokens": float(t.tokens),
        "blocks": t.blocks,
        "bytes": nbytes,
        "descriptors": t.descriptors,
        "post_s": t.post_time,
        "transfer_s": t.transfer_s,
        "status": t.status,
        "gb_s": nbytes / t.transfer_s / 1e9 if ok else math.nan,
    }


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


def _row_fields(record: Any) -> dict[str, Any]:
    """A record's fields for a row, as ``_shallow`` reads them (``asdict``'s deep copies cost
    more than the rest of a turn's row)."""
    return {f.name: _shallow(getattr(record, f.name)) for f in fields(record)}


def _shallow(value: Any) -> Any:
    """A record's field for a row: its dicts copied one level (a row never shares the
    record's), anything else as it is (the fields left are numbers, strings and dicts)."""
    return dict(value) if isinstance(value, dict) else value


def point_row(run_dir: str, p: PointResult) -> dict[str, Any]:
    """The flat row of one PointResult (its deployment's and workload's fields pulled up)."""
    dep, wl = p.deployment_view, p.workload_view
    pre, dec = dep.topology.prefill, dep.topology.decode
    s, tr, offered = p.summary, p.transfer, p.offered_view
    p_tp, d_tp = (pre.tp if pre.count else 0), (dec.tp if dec.count else 0)
    return {
        "run_dir": run_dir,
        "point_id": p.point_id,
        "repetition": wl.repetition if wl.repetition is not None else p.repetition,
        "order_index": p.order_index,
        "status": p.status.value,
        "error": _first_line(p.error),
        "flow": p.flow,
        "deployment_id": dep.deployment_id or "?",
        "model": dep.model.name or "?",
        "transport": dep.transport.name or "?",
        "ucx_tls": dep.transport.ucx_tls,
        "p_count": pre.count,
        "p_tp": p_tp,
        "d_count": dec.count,
        "d_tp": d_tp,
        "tp_pair": f"{p_tp}->{d_tp}" if p_tp and d_tp else "agg",
        "placement": dep.topology.placement,
        "threshold": dep.kv_recompute_threshold,
        "ttl_s": dep.decoder_kv_blocks_ttl_s,
        "block_size": dep.server.block_size or None,
        "history_tokens": wl.history_tokens,
        "kind": wl.kind,
        "workload_shape": workload_shape(p.workload),
        "conversations": wl.conversations,
        "concurrency": wl.concurrency,
        "arrival": wl.arrival or "waves",
        "request_rate": wl.request_rate,
        "achieved_rate": offered.achieved_rate,
        "kept_up": offered.kept_up,
        "turns": wl.turns,
        "user_tokens": wl.user_tokens,
        "output_tokens": wl.output_tokens,
        "requests": s.requests,
        "failed_requests": s.failed_requests,
        "ttft_ms_p50": s.ttft_ms.p50,
        "ttft_ms_mean": s.ttft_ms.mean,
        "itl_ms_p50": s.itl_ms.p50,
        "transfer_bytes": tr.bytes,
        "transfer_seconds": tr.seconds,
        "transfer_count": tr.count,
        "started_at": p.started_at,
        "finished_at": p.finished_at,
        "flags": "; ".join(p.flags),
        "flag_count": len(p.flags),
        "transport_used": json.dumps(p.transport_used, sort_keys=True),
        "hosts": json.dumps(p.hosts, sort_keys=True),
        **{f"bill_{k}": v for k, v in _row_fields(p.decode_bill).items()},
    }


POINT_COLUMNS = list(point_row("", PointResult("?", PointStatus.failed, "", "?", {}, {})))


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
        load = (r["conversations"], r["concurrency"])
        fields = json.loads(r.get("workload_shape") or "{}")
        shapes.setdefault(cell, {})[(load, r.get("workload_shape") or "{}")] = fields
    for r in rows:
        cell = shapes[(r["deployment_id"], r["kind"], r["history_tokens"])]
        if len(cell) < 2:
            continue
        name = [r["kind"]]
        if len({load for load, _ in cell}) > 1:
            name.append(f"{r['conversations']} conv x{r['concurrency']}")
        mine = json.loads(r.get("workload_shape") or "{}")
        common = set.intersection(*(set(f) for f in cell.values()))
        for key in sorted(common):
            if len({json.dumps(f[key], sort_keys=True) for f in cell.values()}) > 1:
                value = mine[key]
                name.append(f"{key}={value if isinstance(value, str) else json.dumps(value)}")
        r["kind"] = " ".join(name)


def turn_rows(point: PointResult, row: dict[str, Any]) -> list[dict[str, Any]]:
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
    for t in point.by_turn:
        out.append(
            {
                **{k: row[k] for k in keep},
                **{k: v for k, v in _row_fields(t).items() if k != "paths"},
                "paths": ", ".join(f"{k}:{v}" for k, v in sorted(t.paths.items())),
            }
        )
    return out


@dataclass
class RunData:
    run_dirs: list[Path]
    manifests: dict[str, Manifest]  # run dir -> its manifest
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

    def deployment_view(self, dep_id: str) -> DeploymentView:
        """The Deployment ``dep_id`` as its Points recorded it, typed."""
        return view(DeploymentView, self.deployments.get(dep_id, {}))

    def model_shape(self, dep_id: str) -> ModelShape:
        """The model shape Deployment ``dep_id``'s record names (``records.model``);
        ``ValueError`` names the sizes it lacks."""
        return self.deployment_view(dep_id).model.shape()

    @property
    def ok_points(self) -> pd.DataFrame:
        return self.points[self.points["status"] == "ok"] if len(self.points) else self.points


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _read_jsonl(path: Path, decode: Callable[[Any, str], T], bad_lines: list[str]) -> list[T]:
    """The lines that parse to records (``decode``); ``<path>: N unreadable line(s)`` into
    ``bad_lines`` for the others (``SchemaVersionError``: a newer pdbench wrote them, raised)."""
    rows, bad = [], 0
    for line in path.read_text(errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            rows.append(decode(json.loads(line), str(path)))
        except (json.JSONDecodeError, RecordError):
            bad += 1
    if bad:
        bad_lines.append(f"{path}: {bad} unreadable line(s)")
    return rows


DROPPED = ("output_token_ids", "itl_ms", "chunk_tokens", "ttft_split", "schema_version")
# A request's columns: its fields but the per-token lists, read without copying them (a
# deep copy of every record, asdict's, was half the time of analysing a run's requests).
REQUEST_COLUMNS = tuple(f.name for f in fields(RequestRecord) if f.name not in DROPPED)


def _request_rows(row: dict[str, Any], recs: list[RequestRecord]) -> list[dict]:
    out = []
    for r in recs:
        split = r.ttft_split
        out.append(
            {
                "run_dir": row["run_dir"],
                "point_id": row["point_id"],
                "deployment_id": row["deployment_id"],
                "flow": r.flow,
                "kind": row["kind"],
                "point_history_tokens": row["history_tokens"],
                "repetition": row["repetition"],
                "order_index": row["order_index"],
                **{k: _shallow(getattr(r, k)) for k in REQUEST_COLUMNS},
                "output_tokens": len(r.output_token_ids),
                "itl_ms_mean": sum(r.itl_ms) / len(r.itl_ms) if r.itl_ms else None,
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
        # a torn trace line is a note, not a record
        for line in _read_jsonl(path, read.trace_line, notes):
            if line.transfer_s < 0 or (line.bytes < 0 and not line.tokens):
                skipped += 1
                continue
            if line.status != "ok":
                failed += 1
                continue
            norm = trace_row(line)
            dep = point_dep.get(owner) or owner
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
        notes.append(
            f"{run_dir}: {skipped} trace line(s) without a size (bytes, tokens) or with a "
            "negative transfer_s"
        )
    if failed:
        notes.append(f"{run_dir}: {failed} traced transfer(s) failed (status != ok)")
    return rows


def bench_row(rec: TransferRecord) -> dict[str, Any]:
    """One transfer-bench case as a ``bench`` row (lists as text, its times left out)."""
    flat = {
        k: (",".join(map(str, v)) if isinstance(v, list) else v) for k, v in asdict(rec).items()
    }
    del flat["times_s"]
    return flat


def _load_bench(root: Path, run_dir: str, notes: list[str]) -> list[dict[str, Any]]:
    rows = []
    for path in sorted((root / "transfer_bench").glob("*.json")):
        try:
            rec = read.bench_record(json.loads(path.read_text()), str(path))
        except (OSError, json.JSONDecodeError, RecordError) as exc:
            notes.append(f"{path}: unreadable transfer-bench record ({exc})")
            continue
        rows.append({"run_dir": run_dir, **bench_row(rec)})
    return rows


def _read_point(path: Path, corrupt: list[str]) -> PointResult | None:
    """A PointResult, or None with ``<path>: <why>`` in ``corrupt`` (``SchemaVersionError``,
    a record of a newer pdbench, is raised: it is no corrupt record)."""
    try:
        return read.point(json.loads(path.read_text(errors="replace")), str(path))
    except json.JSONDecodeError as exc:
        corrupt.append(f"{path}: not valid JSON (truncated?): {exc}")
    except OSError as exc:
        corrupt.append(f"{path}: unreadable: {exc}")
    except SchemaVersionError:
        raise
    except RecordError as exc:
        corrupt.append(f"{exc}")
    return None


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


def _qualified(p: PointResult, run: str) -> PointResult:
    """A PointResult whose point and deployment ids name their run (``qualify``)."""
    if not run:
        return p
    dep = {**p.deployment, "deployment_id": qualify(run, p.deployment_view.deployment_id)}
    return replace(p, point_id=qualify(run, p.point_id), deployment=dep)


def load_runs(run_dirs: list[str | Path], progress: Progress | None = _stderr) -> RunData:
    """Everything under the run dirs; missing pieces become notes, not errors. Several run
    dirs: each Point and deployment id is prefixed with its run's label (``run_labels``)."""
    say = progress or (lambda _msg: None)
    notes: list[str] = []
    corrupt: list[str] = []
    bad_requests: list[str] = []
    manifests: dict[str, dict[str, Any]] = {}
    points, turns, requests, traces, bench = [], [], [], [], []
    measured: list[tuple[Path, PointResult, dict[str, Any]]] = []  # (run dir, record, row)
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
            manifests[run_dir] = store.manifest()
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
            measured.append((root, p, rows[-1]))
        points.extend(rows)
        traces.extend(_load_traces(root, run_dir, rows, notes, run))
        bench.extend(_load_bench(root, run_dir, notes))
    shape_kinds(points)  # before turns and requests copy each Point's kind
    for root, p, row in measured:
        deployments.setdefault(row["deployment_id"], p.deployment)
        turns.extend(turn_rows(p, row))
        req_file = root / (p.requests_file or f"requests/{path_id(row['point_id'])}.jsonl")
        if req_file.is_file():
            recs = _read_jsonl(req_file, read.request, bad_requests)
            requests.extend(_request_rows(row, recs))
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
    """A ``RunData`` from (PointResult, its RequestRecords) pairs held in memory as they are
    written (JSON objects), read back as from files (the calibration test analyses hundreds
    of synthetic runs without writing them)."""
    typed = [(read.point(p), [read.request(r) for r in recs]) for p, recs in items]
    return typed_run_data(typed, run_dir)


def typed_run_data(
    typed: list[tuple[PointResult, list[RequestRecord]]], run_dir: str = "(memory)"
) -> RunData:
    """A ``RunData`` from typed records (a crossover search reads its own Points so far:
    ``jobs.run.search_judge``); no traces, bench records or manifests."""
    points, turns, requests = [point_row(run_dir, p) for p, _ in typed], [], []
    shape_kinds(points)
    deployments: dict[str, dict[str, Any]] = {}
    for (p, recs), row in zip(typed, points, strict=True):
        deployments.setdefault(row["deployment_id"], p.deployment)
        turns.extend(turn_rows(p, row))
        requests.extend(_request_rows(row, recs))
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
    if r["placement"] and "placement" not in omit:
        parts.append(str(r["placement"]))
    thr = r["threshold"]
    if thr is not None and not pd.isna(thr) and "threshold" not in omit:
        parts.append(f"thr {thr}")
    ttls = points["ttl_s"].dropna().unique() if "ttl_s" in points else []
    if len(ttls) > 1 and "ttl" not in omit:  # a TTL sweep: name each deployment's
        parts.append(f"TTL {r['ttl_s']:g} s")
    return " · ".join(parts)
