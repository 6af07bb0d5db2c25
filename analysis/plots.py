"""PNG plots of a run (matplotlib, Agg backend, imported inside ``make_plots``).

Each plot function draws on a fresh figure and returns it, or None when the run has
nothing for it; ``make_plots`` saves them and returns ``Plot`` entries in reading order:
the presets' question plots first (``question_plots.py``), then these (the turn-indexed
plot first when the run swept no history length).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from analysis.crossover import CROSSING, DeploymentAnalysis
from analysis.load import RunData

FLOW_COLORS = {
    "agg": "tab:gray",
    "recompute": "tab:red",
    "pull": "tab:blue",
    "decode_first": "tab:green",
}
FLOW_ORDER = ("agg", "recompute", "pull", "decode_first")
DPI = 110


@dataclass
class Plot:
    name: str  # file stem
    title: str
    path: Path
    caption: str = ""


def _flows(values) -> list[str]:
    present = list(dict.fromkeys(values))
    return [f for f in FLOW_ORDER if f in present] + [f for f in present if f not in FLOW_ORDER]


def _grid(plt, n: int, cols: int = 2, height: float = 3.6):
    cols = min(cols, max(n, 1))
    rows = -(-max(n, 1) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.4 * cols, height * rows), squeeze=False)
    flat = list(axes.flat)
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def _x_scale(ax, xs) -> None:
    pos = [x for x in xs if x > 0]
    if pos and max(pos) / min(pos) > 30:
        ax.set_xscale("symlog", linthresh=min(pos))


def ttft_vs_history(plt, data: RunData, analyses: list[DeploymentAnalysis]):
    """Turns >= 2 only: at turn 1 every flow computes the whole prompt (nothing to pull)."""
    turns = data.turns
    if not len(turns):
        return None
    later = turns[(turns["status"] == "ok") & (turns["turn"] >= 2)]
    if later["history_tokens_mean"].nunique() < 2:
        return None
    fig, axes = _grid(plt, len(analyses))
    for ax, a in zip(axes, analyses, strict=True):
        rows = later[later["deployment_id"] == a.deployment_id]
        for flow in _flows(rows["flow"]):
            f = rows[rows["flow"] == flow].groupby("history_tokens_mean")["ttft_ms_p50"].mean()
            ax.plot(f.index, f.values, "o-", ms=3.5, color=FLOW_COLORS.get(flow), label=flow)
        if a.measured.status == CROSSING:
            ax.axvline(a.measured.tokens, ls="--", color="k", lw=1, label="measured crossover")
        _x_scale(ax, rows["history_tokens_mean"])
        ax.set_title(a.label, fontsize=10)
        ax.set_xlabel("history length at the turn (tokens)")
        ax.set_ylabel("TTFT p50 (ms)")
        ax.grid(alpha=0.3)
        if len(rows):
            ax.legend(fontsize=8)
    fig.suptitle("TTFT vs history length, per flow (turns >= 2)")
    return fig


def ttft_by_turn(plt, data: RunData, analyses: list[DeploymentAnalysis]):
    turns = data.turns
    if not len(turns):
        return None
    ok = turns[turns["status"] == "ok"]
    panels: list[tuple[DeploymentAnalysis, int]] = []
    for a in analyses:
        hs = sorted(ok[ok["deployment_id"] == a.deployment_id]["history_tokens"].unique())
        if len(hs) > 3:  # the shortest, a middle and the longest swept history
            hs = [hs[0], hs[len(hs) // 2], hs[-1]]
        panels.extend((a, int(h)) for h in hs)
    if not panels:
        return None
    fig, axes = _grid(plt, len(panels), cols=3 if len(panels) > 4 else 2)
    for ax, (a, h) in zip(axes, panels, strict=True):
        rows = ok[(ok["deployment_id"] == a.deployment_id) & (ok["history_tokens"] == h)]
        flows = _flows(rows["flow"])
        width = 0.8 / max(len(flows), 1)
        values = rows["ttft_ms_p50"][rows["ttft_ms_p50"] > 0]
        log = len(values) and values.max() / values.min() > 50  # e.g. agg ms next to P/D s
        for i, flow in enumerate(flows):
            f = rows[rows["flow"] == flow].sort_values("turn")
            bars = ax.bar(
                f["turn"] + (i - (len(flows) - 1) / 2) * width,
                f["ttft_ms_p50"],
                width=width,
                color=FLOW_COLORS.get(flow),
                label=flow,
            )
            if len(rows) <= 16:
                ax.bar_label(bars, fmt="%.0f", fontsize=6, padding=1)
        ax.set_xticks(sorted(rows["turn"].unique()))
        if log:
            ax.set_yscale("log")
            ax.set_ylim(values.min() / 2, values.max() * 8)  # headroom for the legend
        elif len(values):
            ax.set_ylim(0, values.max() * 1.3)
        ax.set_title(f"{a.label}\nprefix {h:,} tokens before turn 1", fontsize=9)
        ax.set_xlabel("turn")
        ax.set_ylabel("TTFT p50 (ms" + (", log scale)" if log else ")"))
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7, ncol=len(flows), loc="upper center")
    fig.suptitle("TTFT by turn, per flow (turn 1: nothing to pull yet)")
    return fig


def speedup(plt, data: RunData, analyses: list[DeploymentAnalysis]):
    have = [a for a in analyses if len(a.pairs)]
    if not have:
        return None
    fig, ax = plt.subplots(figsize=(8.5, 4.6))
    for a in have:
        (line,) = ax.plot(a.pairs["x"], a.pairs["speedup"], "o-", ms=4, label=f"pull · {a.label}")
        if a.measured.status == CROSSING:
            ax.axvline(a.measured.tokens, ls=":", color=line.get_color(), lw=1)
    ax.axhline(1.0, color="k", lw=1)
    _x_scale(ax, [x for a in have for x in a.pairs["x"]])
    ax.set_xlabel("history length (tokens)")
    ax.set_ylabel("speedup: TTFT recompute / TTFT pull (x)")
    ax.set_title("Pull over recompute, per transport (> 1: pulling is faster; dotted: crossover)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    return fig


def transfer_bandwidth(plt, data: RunData, analyses: list[DeploymentAnalysis]):
    bench, traces = data.bench, data.traces
    has_bench = len(bench) and {"bytes", "gb_s", "layout", "tp_split"} <= set(bench.columns)
    has_traces = len(traces) and traces["gb_s"].notna().any()
    if not has_bench and not has_traces:
        return None
    fig, ax = plt.subplots(figsize=(8.5, 4.8))
    if has_bench:
        ok = bench[bench["status"] == "ok"] if "status" in bench else bench
        keys = [k for k in ("layout", "tp_split", "op", "ucx_tls") if k in ok]
        for key, g in ok.groupby(keys, dropna=False):
            g = g.groupby("bytes", as_index=False)["gb_s"].median().sort_values("bytes")
            label = "bench " + " ".join(str(k) for k in key if str(k) not in ("", "nan"))
            ax.plot(g["bytes"], g["gb_s"], "o-", ms=3.5, label=label)
        if "memcpy_gb_s" in ok and ok["memcpy_gb_s"].max() > 0:
            ax.axhline(ok["memcpy_gb_s"].max(), ls="--", color="gray", lw=1, label="local memcpy")
    if has_traces:
        for dep, g in traces[traces["gb_s"].notna()].groupby("deployment_id"):
            label = next((a.label for a in analyses if a.deployment_id == dep), dep)
            ax.scatter(g["bytes"], g["gb_s"], s=10, alpha=0.5, label=f"trace · {label}")
    ax.set_xscale("log")
    lo, hi = ax.get_ylim()
    values = [v for line in ax.get_lines() for v in line.get_ydata() if v > 0]
    if values and max(values) / min(values) > 30:
        ax.set_yscale("log")
    elif lo < 0:
        ax.set_ylim(0, hi)
    ax.set_xlabel("transfer size (bytes)")
    ax.set_ylabel("throughput (GB/s)")
    ax.set_title("KV transfer throughput vs size, per layout / TP split / op")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, ncol=2, loc="upper left")
    return fig


def tp_pairing(plt, data: RunData, analyses: list[DeploymentAnalysis]):
    groups: dict[tuple[str, str], list[DeploymentAnalysis]] = {}
    for a in analyses:
        groups.setdefault((a.model, a.transport), []).append(a)
    multi = {k: v for k, v in groups.items() if len({a.tp_pair for a in v}) > 1}
    if not multi:
        return None
    fig, axes = _grid(plt, len(multi))
    for ax, ((model, transport), deps) in zip(axes, multi.items(), strict=True):
        for a in deps:
            if not len(a.pairs):
                continue
            (line,) = ax.plot(a.pairs["x"], a.pairs["ttft_pull_ms"], "o-", ms=3.5)
            line.set_label(f"pull, TP {a.tp_pair}")
            ax.plot(
                a.pairs["x"],
                a.pairs["ttft_recompute_ms"],
                "s--",
                ms=3,
                color=line.get_color(),
                label=f"recompute, TP {a.tp_pair}",
            )
        ax.set_title(f"{model} · {transport}", fontsize=10)
        ax.set_xlabel("history length (tokens)")
        ax.set_ylabel("TTFT p50 (ms)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("TP pairings (prefill TP -> decode TP), turns >= 2")
    return fig


def fits(plt, data: RunData, analyses: list[DeploymentAnalysis]):
    have = [a for a in analyses if a.recompute_fit or a.transfer_fit]
    if not have:
        return None
    fig, axes = plt.subplots(len(have), 2, figsize=(10.8, 3.4 * len(have)), squeeze=False)
    for (ax_r, ax_t), a in zip(axes, have, strict=True):
        r, s = a.recompute_fit, a.recompute_samples
        if r is not None:
            ax_r.plot(s["tokens"], s["ttft_s"] * 1e3, "o", ms=3.5, label="measured")
            xs = np.linspace(0, s["tokens"].max() * 1.05, 200)
            fit_label = f"fit, R² {r.quality.r2:.3f}"
            ax_r.plot(xs, np.asarray(r.seconds(xs)) * 1e3, "-", label=fit_label)
            ax_r.legend(fontsize=8)
        ax_r.set_title(f"recompute · {a.label}", fontsize=9)
        ax_r.set_xlabel("prompt tokens computed")
        ax_r.set_ylabel("TTFT p50 (ms)")
        ax_r.grid(alpha=0.3)
        t, x = a.transfer_fit, a.transfer_samples
        if t is not None:
            ax_t.plot(x["bytes"], x["seconds"] * 1e3, "o", ms=3, alpha=0.6, label="measured")
            xs = np.geomspace(max(x["bytes"].min(), 1.0), x["bytes"].max(), 200)
            label = f"α {t.alpha_s * 1e3:.2f} ms + bytes / {t.gb_s:.2f} GB/s, R² {t.quality.r2:.3f}"
            ax_t.plot(xs, np.asarray(t.seconds(xs)) * 1e3, "-", label=label)
            ax_t.set_xscale("log")
            ax_t.legend(fontsize=8)
        ax_t.set_title(f"transfer · {a.transfer_source or 'no data'}", fontsize=9)
        ax_t.set_xlabel("bytes per transfer")
        ax_t.set_ylabel("transfer time (ms)")
        ax_t.grid(alpha=0.3, which="both")
    fig.suptitle("Fitted cost models")
    return fig


PLOTS: dict[str, tuple[str, Any, str]] = {
    "ttft_vs_history": ("TTFT vs history length", ttft_vs_history, ""),
    "speedup": ("Speedup of pull over recompute", speedup, ""),
    "ttft_by_turn": ("TTFT by turn", ttft_by_turn, ""),
    "transfer_bandwidth": ("Transfer throughput vs size", transfer_bandwidth, ""),
    "tp_pairing": ("TP pairings", tp_pairing, ""),
    "fits": ("Fits", fits, "recompute TTFT model and transfer alpha-beta model"),
}


def plot_order(data: RunData) -> list[str]:
    order = list(PLOTS)
    swept = len(data.points) and data.ok_points["history_tokens"].nunique() > 1
    if not swept:
        order.remove("ttft_by_turn")
        order.insert(0, "ttft_by_turn")
    return order


def make_plots(
    data: RunData,
    analyses: list[DeploymentAnalysis],
    out_dir: Path,
    progress: Callable[[str], None] | None = None,
    questions: Any = None,
) -> list[Plot]:
    """``questions``: a ``questions.Questions`` (computed here when None)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    from analysis.question_plots import QUESTION_PLOTS
    from analysis.questions import answer_questions

    q = answer_questions(data, analyses) if questions is None else questions
    drawers = {name: (t, lambda p, f=fn: f(p, q), c) for name, (t, fn, c) in QUESTION_PLOTS.items()}
    drawers.update(
        {name: (t, lambda p, f=fn: f(p, data, analyses), c) for name, (t, fn, c) in PLOTS.items()}
    )
    made = []
    with plt.rc_context({"font.size": 9, "axes.titlesize": 10, "figure.dpi": DPI}):
        for name in [*QUESTION_PLOTS, *plot_order(data)]:
            title, fn, caption = drawers[name]
            if progress:
                progress(f"[analysis]   {name}.png")
            fig = fn(plt)
            if fig is None:
                continue
            fig.tight_layout()
            path = out_dir / f"{name}.png"
            fig.savefig(path, dpi=DPI)
            plt.close(fig)
            made.append(Plot(name, title, path, caption))
    return made
