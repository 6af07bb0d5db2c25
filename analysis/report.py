"""A self-contained HTML report: the answer first, then plots (PNG inlined), tables,
notes and provenance. No scripts, no external resources."""

from __future__ import annotations

import base64
import html
import json
import time
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.answer import answer_lines, pct
from analysis.crossover import NO_DATA, DeploymentAnalysis
from analysis.flows import flows_rows
from analysis.load import TRACE_FIELDS, RunData, deployment_label
from analysis.placement import placement_rows
from analysis.plots import Plot
from analysis.questions import Questions, answer_questions
from analysis.threshold import threshold_rows

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 0 auto;
       max-width: 1180px; padding: 1.2em 1.6em 3em; color: #1d232b; line-height: 1.45; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; } h3 { font-size: 1em; margin: 1.2em 0 0.2em; }
h2 { font-size: 1.2em; margin-top: 1.8em; border-bottom: 1px solid #d6dbe1;
     padding-bottom: 0.2em; }
.answer { background: #eef5ff; border-left: 4px solid #2c6fd6; padding: 0.6em 1em; }
.answer li { margin: 0.35em 0; } .muted { color: #5c6773; font-size: 0.9em; }
.answer li.flags { color: #b42318; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.6em 0; }
th, td { border: 1px solid #d6dbe1; padding: 3px 7px; text-align: right; vertical-align: top; }
th { background: #f1f3f6; } td.l, th.l { text-align: left; }
tr:nth-child(even) td { background: #fafbfc; }
.bad { color: #b42318; font-weight: 600; } .scroll { overflow-x: auto; }
figure { margin: 1em 0 1.6em; } figure img { max-width: 100%; border: 1px solid #e3e7ec; }
figcaption { font-size: 0.9em; color: #5c6773; }
code, pre { font-size: 0.85em; background: #f4f6f8; padding: 0 3px; }
"""


def esc(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def table(rows: list[dict[str, Any]], left: tuple[str, ...] = (), bad: str | None = None) -> str:
    """An HTML table of dict rows; columns in ``left`` align left, ``bad`` marks a row red."""
    if not rows:
        return '<p class="muted">(none)</p>'
    cols = list(rows[0])
    out = ['<div class="scroll"><table><tr>']
    out += [f'<th class="{"l" if c in left else ""}">{esc(c)}</th>' for c in cols]
    out.append("</tr>")
    for r in rows:
        cls = ' class="bad"' if bad and r.get(bad) not in (None, "", "ok") else ""
        out.append(f"<tr{cls}>")
        out += [f'<td class="{"l" if c in left else ""}">{esc(r[c])}</td>' for c in cols]
        out.append("</tr>")
    out.append("</table></div>")
    return "".join(out)


def _num(value: Any, fmt: str = ",.0f") -> str:
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return "–"
    return format(value, fmt)


def crossover_rows(analyses: list[DeploymentAnalysis]) -> list[dict[str, Any]]:
    return [
        {
            "deployment": a.label,
            "measured crossover": a.measured.describe(),
            "by fits": a.by_fit.describe(),
            "fits vs measured": pct(a.fit_vs_measured),
            "by first principles": a.by_first_principles.describe(),
            "FP vs measured": pct(a.fp_vs_measured),
            "recommended threshold": _num(a.recommended_threshold),
            "why": a.recommendation,
        }
        for a in analyses
    ]


def recompute_fit_rows(analyses: list[DeploymentAnalysis]) -> list[dict[str, Any]]:
    rows = []
    for a in analyses:
        r = a.recompute_fit
        rows.append(
            {
                "deployment": a.label,
                "samples": r.quality.n if r else len(a.recompute_samples),
                "c0 (ms)": _num(r.c0_s * 1e3, ".2f") if r else "–",
                "c1 (µs/token)": _num(r.c1_s_per_token * 1e6, ".3f") if r else "–",
                "c2 (ns/token²)": _num(r.c2_s_per_token2 * 1e9, ".4f") if r else "–",
                "R²": _num(r.quality.r2, ".4f") if r else "–",
                "RMSE (ms)": _num(r.quality.rmse * 1e3, ".2f") if r else "–",
                "max |residual| (ms)": _num(r.quality.max_abs_residual * 1e3, ".2f") if r else "–",
                "prefill (tok/s, measured)": _num(a.prefill_tok_s),
                "params": _num(a.shape.params if a.shape else None),
            }
        )
    return rows


def transfer_fit_rows(analyses: list[DeploymentAnalysis]) -> list[dict[str, Any]]:
    rows = []
    for a in analyses:
        t = a.transfer_fit
        bw = a.bandwidth_bytes_per_s / 1e9 if a.bandwidth_bytes_per_s else None
        rows.append(
            {
                "deployment": a.label,
                "source": a.transfer_source or "–",
                "α (ms)": _num(t.alpha_s * 1e3, ".3f") if t else "–",
                "β (GB/s)": _num(t.gb_s, ".3f") if t else "–",
                "R²": _num(t.quality.r2, ".4f") if t else "–",
                "RMSE (ms)": _num(t.quality.rmse * 1e3, ".3f") if t else "–",
                "large-transfer GB/s": _num(bw, ".3f"),
                "KV bytes/token": _num(a.kv_bytes_per_token),
                "per transfer": _num(a.transfer_bytes_per_token),
                "saving RMS error, fits / FP (ms)": f"{_num(a.fit_rms_ms, '.2f')} / "
                f"{_num(a.fp_rms_ms, '.2f')}",
            }
        )
    return rows


def fit_rows(analyses: list[DeploymentAnalysis]) -> list[dict[str, Any]]:
    """Both fits in one row per deployment (for W&B)."""
    rec = recompute_fit_rows(analyses)
    xfer = transfer_fit_rows(analyses)
    out = []
    for r, t in zip(rec, xfer, strict=True):
        row = {f"recompute {k}" if k != "deployment" else k: v for k, v in r.items()}
        row.update({f"transfer {k}": v for k, v in t.items() if k != "deployment"})
        out.append(row)
    return out


def point_rows(data: RunData) -> list[dict[str, Any]]:
    if not len(data.points):
        return []
    pts = data.points.sort_values(["deployment_id", "history_tokens", "flow"])
    return [
        {
            "deployment": deployment_label(p["deployment_id"], data.points),
            "flow": p["flow"],
            "history": _num(p["history_tokens"]),
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


def points_tables(data: RunData) -> str:
    """One table per deployment (the label as a heading)."""
    rows = point_rows(data)
    if not rows:
        return '<p class="muted">(no Point records)</p>'
    out = []
    for label in dict.fromkeys(r["deployment"] for r in rows):
        mine = [{k: v for k, v in r.items() if k != "deployment"} for r in rows]
        mine = [m for m, r in zip(mine, rows, strict=True) if r["deployment"] == label]
        out.append(f"<h3>{esc(label)}</h3>")
        out.append(table(mine, left=("flow", "flags", "error"), bad="status"))
    return "\n".join(out)


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
        prov = m.get("provenance") or {}
        jobs = ", ".join(str(j.get("job_id")) for j in m.get("jobs") or [])
        rows.append(
            {
                "run dir": run_dir,
                "name": m.get("name", ""),
                "git sha": prov.get("git_sha", "?"),
                "python": prov.get("python", ""),
                "packages": ", ".join(f"{k} {v}" for k, v in (prov.get("packages") or {}).items()),
                "UCX": prov.get("ucx", ""),
                "CPU": prov.get("cpu", ""),
                "GPUs": ", ".join(prov.get("gpus") or []) or "none",
                "host": prov.get("hostname", ""),
                "SLURM jobs": jobs or "–",
            }
        )
    return rows


def host_rows(data: RunData) -> list[dict[str, Any]]:
    seen: dict[tuple[str, str], str] = {}
    for run_dir in data.manifests:
        for path in sorted((Path(run_dir) / "points").glob("*.json")):
            try:
                hosts = json.loads(path.read_text()).get("hosts") or {}
            except (OSError, json.JSONDecodeError):
                continue
            for inst, where in hosts.items():
                seen[(run_dir, inst)] = where
    return [{"run dir": r, "instance": i, "host:port": h} for (r, i), h in sorted(seen.items())]


def _img(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


METHOD = """
<ul>
<li><b>Measured crossover</b>: TTFT p50 of <code>recompute</code> minus <code>pull</code> at
each turn &ge; 2 (turn 1 has nothing to pull), matched on (swept prefix, turn), against the
turn's history length; linear interpolation around the last sign change.</li>
<li><b>Recompute fit</b>: TTFT = c0 + c1&middot;n + c2&middot;n&sup2; over n prompt tokens
computed (non-negative least squares on relative residuals).
<b>Transfer fit</b>: t = &alpha; + bytes/&beta; from per-transfer traces, else transfer-bench
records of the same TP split, else the pull Points' NIXL totals.</li>
<li><b>Predicted by fits</b>: pull wins when c1&middot;h + c2&middot;h&sup2; &gt; &alpha; +
h&middot;KV bytes per token/&beta;. <b>First principles</b>: FLOPs of h tokens (2 &times; layer
matmul parameters per token + 4&middot;layers&middot;heads&middot;head_dim per earlier token) at
the marginal prefill FLOP/s measured between the shortest and longest recompute prompts
(fixed per-request costs cancel), vs KV bytes at the bandwidth of
the largest transfers, plus &alpha;. Both assume D keeps the history cached in either flow.</li>
<li><b>Recommended kv_recompute_threshold</b>: the crossover rounded up to the block size.</li>
</ul>
"""


def grouped(rows: list[dict[str, Any]], key: str, left: tuple[str, ...]) -> list[str]:
    """One table per value of ``key`` (the value as a heading)."""
    out = []
    for value in dict.fromkeys(r[key] for r in rows):
        mine = [{k: v for k, v in r.items() if k != key} for r in rows if r[key] == value]
        out += [f"<h3>{esc(value)}</h3>", table(mine, left=left)]
    return out


def question_sections(q: Questions) -> list[str]:
    """A heading and a table per question the run asked (``questions.py``)."""
    star = '<p class="muted">* from a flagged Point: the TTFT may measure a stall.</p>'
    out = []
    if q.threshold:
        out += [
            "<h2>Which kv_recompute_threshold?</h2>",
            "<p>TTFT p50 of turns &ge; 2 per threshold and swept history length; "
            "<i>vs best</i>: the geometric mean over lengths of TTFT / the best TTFT.</p>",
            table(threshold_rows(q.threshold), left=("deployments", "flow")),
        ]
    if q.flows:
        out += [
            "<h2>Which flow?</h2>",
            "<p>TTFT p50 of turns &ge; 2 per flow and workload kind (requests pooled).</p>",
            *grouped(flows_rows(q.flows), "deployment", ("kind", "flow", "fastest", "routes")),
        ]
    if q.placement:
        out += [
            "<h2>Same node or cross node?</h2>",
            table(placement_rows(q.placement), left=("deployments", "placement", "flow")),
        ]
    if out and q.flagged:
        out.append(star)
    return out


def _answer_item(line: str) -> str:
    cls = ' class="flags"' if " flagged: " in line.split("\n", 1)[0] else ""
    body = esc(line).replace("\n  ", "<br>&emsp;").replace("\n", "<br>")
    return f"<li{cls}>{body}</li>"


def render(
    data: RunData,
    analyses: list[DeploymentAnalysis],
    plots: list[Plot],
    title: str = "pdbench analysis",
    questions: Questions | None = None,
) -> str:
    q = answer_questions(data, analyses) if questions is None else questions
    names = ", ".join(Path(d).name for d in data.run_dirs)
    answer = "".join(_answer_item(line) for line in answer_lines(data, analyses, q))
    crossover = analyses and (not q.answered or any(a.measured.status != NO_DATA for a in analyses))
    asked = " · ".join(q.titles() + (["Pull or recompute?"] if crossover else []))
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>{esc(title)} — {esc(names)}</title><style>{CSS}</style></head><body>",
        f"<h1>{esc(title)}: {esc(names)}</h1>",
        f'<p class="muted">generated {esc(time.strftime("%Y-%m-%d %H:%M:%S"))} by '
        f"<code>python -m analysis</code></p>",
        f'<div class="answer" id="answer"><b>{esc(asked or "Answer")}</b><ul>{answer}</ul></div>',
        *question_sections(q),
        "<h2>Crossover per deployment</h2>",
        table(crossover_rows(analyses), left=("deployment", "why")),
    ]
    if data.notes or any(a.notes for a in analyses):
        notes = data.notes + [f"{a.label}: {n}" for a in analyses for n in a.notes]
        parts.append("<h2>Notes</h2><ul>" + "".join(f"<li>{esc(n)}</li>" for n in notes))
        parts.append("</ul>")
    parts.append("<h2>Plots</h2>")
    if not plots:
        parts.append('<p class="muted">(nothing to plot)</p>')
    for p in plots:
        parts.append(
            f'<figure id="plot-{esc(p.name)}"><img alt="{esc(p.title)}" src="{_img(p.path)}">'
            f"<figcaption>{esc(p.title)}{': ' + esc(p.caption) if p.caption else ''}"
            "</figcaption></figure>"
        )
    parts += [
        "<h2>Fits</h2>",
        "<p>Recompute cost: TTFT = c0 + c1&middot;n + c2&middot;n&sup2; (n prompt tokens "
        "computed)</p>",
        table(recompute_fit_rows(analyses), left=("deployment",)),
        "<p>Transfer cost: t = &alpha; + bytes/&beta; per transfer (one D rank's KV heads)</p>",
        table(transfer_fit_rows(analyses), left=("deployment", "source")),
        "<h2>Points</h2>",
        points_tables(data),
        "<h2>Transfer bench</h2>",
        table(bench_rows(data.bench), left=("op", "layout", "tp_split", "ucx_tls", "memory"))
        if len(data.bench)
        else '<p class="muted">(no transfer-bench records in these run dirs)</p>',
        "<h2>Method</h2>",
        METHOD,
        '<p class="muted">Trace line fields accepted: '
        + esc("; ".join(f"{k} = {'|'.join(v)}" for k, v in TRACE_FIELDS.items()))
        + "</p>",
        "<h2>Provenance</h2>",
        table(provenance_rows(data), left=("run dir", "name", "git sha", "packages", "CPU")),
        table(host_rows(data), left=("run dir", "instance", "host:port")),
        "</body></html>",
    ]
    return "\n".join(parts)
