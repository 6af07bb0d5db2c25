"""PNG plots of the presets' questions (``questions.py``): TTFT vs ``kv_recompute_threshold``,
TTFT per flow per workload, and same node vs cross node. Each takes matplotlib's ``pyplot``
and the ``Questions`` and returns a figure, or None when that question was not asked.
Values from flagged Points are drawn with a red edge (their TTFT may be a stall)."""

from __future__ import annotations

from typing import Any

import numpy as np

from analysis.compare import LATER, tokens
from analysis.plots import FLOW_COLORS
from analysis.questions import Questions

FLAG_EDGE = "tab:red"
ROUTE_COLORS = {"decode_first": "tab:green", "pull": "tab:blue", "recompute": "tab:red"}


def _log_y(ax, values) -> bool:
    v = [x for x in values if x == x and x > 0]
    if v and max(v) / min(v) > 50:
        ax.set_yscale("log")
        return True
    return False


def _log_x_thresholds(ax, thresholds: list[float]) -> None:
    """Symlog when the positive thresholds span 8x or more (0 stays on the axis)."""
    pos = sorted(t for t in thresholds if t > 0)
    if len(pos) >= 2 and pos[-1] / pos[0] >= 8:
        ax.set_xscale("symlog", linthresh=pos[0], linscale=0.6)
    ax.set_xticks(thresholds)
    ax.set_xticklabels([tokens(t) for t in thresholds], fontsize=8)
    ax.minorticks_off()


def _panels(plt, n: int, width: float = 6.6, height: float = 4.2):
    cols = min(2, max(n, 1))
    rows = -(-max(n, 1) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    flat = list(axes.flat)
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def ttft_vs_threshold(plt, q: Questions):
    """Filled markers: the turns pulled the history; open squares: they recomputed it."""
    if not q.threshold:
        return None
    fig, axes = _panels(plt, len(q.threshold))
    cmap = plt.get_cmap("viridis")
    for ax, a in zip(axes, q.threshold, strict=True):
        t = a.table
        thresholds = sorted(float(x) for x in t["threshold"].unique())
        hs = sorted(t["history_tokens"].unique())
        for i, h in enumerate(hs):
            rows = t[t["history_tokens"] == h].sort_values("threshold")
            color = cmap(0.1 + 0.75 * i / max(len(hs) - 1, 1))
            ax.plot(
                rows["threshold"], rows["ttft_ms"], "-", color=color, label=f"history {tokens(h)}"
            )
            pulled = rows["pulled_share"].fillna(1.0) > 0
            ax.plot(rows["threshold"][pulled], rows["ttft_ms"][pulled], "o", ms=6, color=color)
            ax.plot(
                rows["threshold"][~pulled],
                rows["ttft_ms"][~pulled],
                "s",
                ms=7,
                mfc="white",
                mec=color,
                mew=1.5,
            )
            bad = rows[rows["flagged"]]
            if len(bad):
                ax.plot(
                    bad["threshold"], bad["ttft_ms"], "o", ms=13, mfc="none", mec=FLAG_EDGE, mew=1.5
                )
        ax.axvline(float(a.best), ls="--", color="k", lw=1, label=f"best: {a.best}")
        ax.plot([], [], "o", ms=6, color="gray", label="turns pulled the history")
        if not (t["pulled_share"].fillna(1.0) > 0).all():
            ax.plot([], [], "s", ms=7, mfc="white", mec="gray", label="turns recomputed it")
        if t["flagged"].any():
            ax.plot([], [], "o", ms=10, mfc="none", mec=FLAG_EDGE, label="flagged Point")
        _log_x_thresholds(ax, thresholds)
        log = _log_y(ax, t["ttft_ms"])
        ax.set_ylim(bottom=None if log else 0)
        ax.set_title(f"{a.family} · flow {a.flow}", fontsize=9)
        ax.set_xlabel("kv_recompute_threshold (tokens)")
        ax.set_ylabel(f"TTFT p50, {LATER} (ms{', log' if log else ''})")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    fig.suptitle(f"TTFT vs kv_recompute_threshold ({LATER})")
    return fig


def _bars(ax, answers) -> None:
    """TTFT p50 per flow (bars) per workload kind (groups)."""
    from analysis.flows import ordered

    flows = ordered(f for a in answers for f in a.table["flow"])
    width = 0.8 / max(len(flows), 1)
    values = []
    for i, flow in enumerate(flows):
        xs, ys, flagged, labels, fastest = [], [], [], [], []
        for j, a in enumerate(answers):
            v, flag = a.ttft(flow)
            if v == v:
                xs.append(j + (i - (len(flows) - 1) / 2) * width)
                ys.append(v)
                flagged.append(flag)
                labels.append(f"{v:,.0f}")
                fastest.append(flow == a.best)
        values += ys
        bars = ax.bar(xs, ys, width=width, color=FLOW_COLORS.get(flow), label=flow)
        texts = ax.bar_label(bars, labels=labels, fontsize=7, padding=1)
        for bar, text, flag, best in zip(bars, texts, flagged, fastest, strict=True):
            if flag:
                bar.set_edgecolor(FLAG_EDGE)
                bar.set_linewidth(1.8)
                bar.set_hatch("//")
            elif best:
                bar.set_edgecolor("black")
                bar.set_linewidth(2.0)
            if best:
                text.set_fontweight("bold")
    ax.set_xticks(range(len(answers)))
    ax.set_xticklabels(
        [f"{a.kind}\nhistory {', '.join(map(tokens, a.histories))}" for a in answers], fontsize=8
    )
    log = _log_y(ax, values)
    if log:
        ax.set_ylim(min(v for v in values if v > 0) / 2, max(values) * 12)
    elif values:
        ax.set_ylim(0, max(values) * 1.35)
    ax.set_ylabel(f"TTFT p50, {LATER} (ms{', log scale' if log else ''})")
    ax.grid(axis="y", alpha=0.3)
    from matplotlib.patches import Patch

    handles = [Patch(color=FLOW_COLORS.get(f, "tab:purple"), label=f) for f in flows]
    handles.append(Patch(facecolor="white", edgecolor="black", lw=2.0, label="fastest (bold)"))
    if any(a.ttft(f)[1] for a in answers for f in flows):
        handles.append(Patch(facecolor="white", edgecolor=FLAG_EDGE, hatch="//", label="flagged"))
    ax.legend(handles=handles, fontsize=7, ncol=min(len(handles), 6), loc="upper center")


def _routes(ax, answers) -> None:
    """decode_first: the share of turns >= 2 per route, one stacked bar per kind."""
    have = [a for a in answers if a.routes]
    names = sorted({r for a in have for r in a.routes}, key=lambda r: (r != "decode_first", r))
    left = np.zeros(len(have))
    for r in names:
        share = np.array([a.routes.get(r, 0) / sum(a.routes.values()) for a in have])
        bars = ax.barh(range(len(have)), share, left=left, color=ROUTE_COLORS.get(r), label=r)
        ax.bar_label(
            bars,
            labels=[f"{s:.0%}" if s >= 0.08 else "" for s in share],
            label_type="center",
            fontsize=8,
            color="white",
        )
        left += share
    ax.set_yticks(range(len(have)))
    ax.set_yticklabels([a.kind for a in have], fontsize=8)
    ax.set_xlim(0, 1)
    ax.set_xlabel(f"share of decode_first's turns ({LATER})")
    ax.invert_yaxis()  # the kinds top to bottom as the bars go left to right
    ax.set_title("decode_first: route taken", fontsize=9)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=len(names))


def flows_by_workload(plt, q: Questions):
    if not q.flows:
        return None
    by_dep: dict[str, list[Any]] = {}
    for a in q.flows:
        by_dep.setdefault(a.label, []).append(a)
    rows = len(by_dep)
    with_routes = any(a.routes for a in q.flows)
    cols = 2 if with_routes else 1
    fig, axes = plt.subplots(
        rows,
        cols,
        figsize=(7.0 + 3.8 * (cols - 1), 4.4 * rows),
        squeeze=False,
        gridspec_kw={"width_ratios": [2, 1][:cols]},
    )
    for (label, answers), row in zip(by_dep.items(), axes, strict=True):
        _bars(row[0], answers)
        row[0].set_title(label, fontsize=9)
        if with_routes:
            if any(a.routes for a in answers):
                _routes(row[1], answers)
            else:
                row[1].set_visible(False)
    fig.suptitle(f"TTFT p50 per flow per workload ({LATER}; hatched: flagged Point)")
    return fig


def placement(plt, q: Questions):
    if not q.placement:
        return None
    fig, axes = plt.subplots(
        len(q.placement),
        2,
        figsize=(11.0, 4.0 * len(q.placement)),
        squeeze=False,
        gridspec_kw={"width_ratios": [2, 1]},
    )
    styles = {"recompute": "s--", "pull": "o-", "decode_first": "^-.", "agg": "x:"}
    for (ax, ax_bw), a in zip(axes, q.placement, strict=True):
        colors = {}
        for r in a.rows:
            for flow in sorted({f for f, _ in r.ttft}):
                pts = sorted((h, v) for (f, h), (v, _) in r.ttft.items() if f == flow)
                (line,) = ax.plot(
                    [h for h, _ in pts],
                    [v for _, v in pts],
                    styles.get(flow, "o-"),
                    ms=4,
                    color=colors.get(r.placement),
                    label=f"{r.placement} · {flow}",
                )
                colors.setdefault(r.placement, line.get_color())
        bad = [(h, v) for r in a.rows for (_, h), (v, flag) in r.ttft.items() if flag]
        if bad:
            ax.plot(*zip(*bad, strict=True), "o", ms=11, mfc="none", mec=FLAG_EDGE, mew=1.5,
                    label="flagged Point")  # fmt: skip
        log = _log_y(ax, [v for r in a.rows for v, _ in r.ttft.values()])
        ax.set_xlabel("swept history length (tokens)")
        ax.set_ylabel(f"TTFT p50, {LATER} (ms{', log' if log else ''})")
        ax.set_title(a.family, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        gb = [r.gb_s if np.isfinite(r.gb_s) else 0.0 for r in a.rows]
        bars = ax_bw.bar(
            [r.placement for r in a.rows],
            gb,
            color=[colors.get(r.placement, "tab:gray") for r in a.rows],
        )
        ax_bw.bar_label(bars, fmt="%.2f", fontsize=8)
        ax_bw.set_ylabel("KV moved (GB/s, NIXL totals)")
        ax_bw.set_title("transfer.bytes / transfer.seconds", fontsize=9)
        ax_bw.grid(axis="y", alpha=0.3)
    fig.suptitle("Same node vs cross node")
    return fig


QUESTION_PLOTS: dict[str, tuple[str, Any, str]] = {
    "ttft_vs_threshold": (
        "TTFT vs kv_recompute_threshold",
        ttft_vs_threshold,
        "one line per swept history length; dashed: the best threshold",
    ),
    "flows_by_workload": (
        "TTFT per flow per workload",
        flows_by_workload,
        "turns >= 2 pooled per flow and workload kind; right: decode_first's routes",
    ),
    "placement": ("Same node vs cross node", placement, "TTFT per flow, and KV throughput"),
}
