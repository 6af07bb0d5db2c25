"""What does moving the KV cost, and what does computing it cost? (the fits, per deployment)

The transfer fit ``t = alpha + bytes / beta`` from the history pulls only (``P<-D``
traces; transfer-bench READs when the traces lack sizes), three sizes or more to predict;
the recompute fit ``TTFT = c0 + c1 n + c2 n^2``; each parameter with its 95% interval
(``fits``). A fit with under 2 degrees of freedom makes no prediction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from analysis.kit import plotkit
from analysis.method.deployment import Context, DeploymentAnalysis
from analysis.method.fits import MIN_TRANSFER_SIZES
from analysis.method.samples import NO_TRANSFER_SAMPLES
from analysis.questions.question import PlotSpec, Question


def _ci(bounds: tuple[float, float], scale: float, fmt: str) -> str:
    lo, hi = bounds
    if np.isnan(lo) or np.isnan(hi):
        return "[no interval]"
    hi_text = "∞" if np.isinf(hi) else format(hi * scale, fmt)
    return f"[{format(lo * scale, fmt)}, {hi_text}]"


@dataclass
class TransferAnswer:
    a: DeploymentAnalysis

    def transfer_text(self) -> str:
        t = self.a.transfer_fit
        if t is None:
            return f"transfer fit: none: {NO_TRANSFER_SAMPLES}"
        if np.isfinite(t.gb_s):
            beta = f"{t.gb_s:,.3f} GB/s {_ci(t.gb_s_ci, 1, ',.3f')}"
        else:  # no time per byte measured: the sizes all took the fixed cost alone
            beta = (
                f"bandwidth not resolved (transfer time does not grow with size here; "
                f"at least {t.gb_s_ci[0]:,.3f} GB/s at 95%)"
            )
        text = (
            f"transfer fit ({self.a.transfer_source}): alpha {t.alpha_s * 1e3:,.3f} ms "
            f"{_ci(t.alpha_ci_s, 1e3, ',.3f')}, {beta}, R² {t.quality.r2:.3f}, {t.df} df"
        )
        if not t.predicts:
            text += f"; no prediction: {t.why_not()}"
        elif t.sizes < MIN_TRANSFER_SIZES:
            text += f"; only {t.sizes} sizes"
        return text

    def recompute_text(self) -> str:
        r = self.a.recompute_fit
        if r is None:
            return "recompute fit: none (fewer than two prompt lengths)"
        text = (
            f"recompute fit: c0 {r.c0_s * 1e3:,.2f} ms {_ci(r.ci['c0_s'], 1e3, ',.2f')}, "
            f"c1 {r.c1_s_per_token * 1e6:,.3f} µs/token "
            f"{_ci(r.ci['c1_s_per_token'], 1e6, ',.3f')}"
        )
        if r.quadratic:
            text += (
                f", c2 {r.c2_s_per_token2 * 1e9:,.4f} ns/token² "
                f"{_ci(r.ci['c2_s_per_token2'], 1e9, ',.4f')}"
            )
        text += f", R² {r.quality.r2:.3f}, {r.df} df"
        return text + ("" if r.predicts else "; no prediction (under 2 df)")

    def lines(self) -> list[str]:
        return [f"{self.a.label}: {self.transfer_text()}\n  {self.recompute_text()}"]

    def tables(self) -> dict[str, list[dict[str, Any]]]:
        a, t, r = self.a, self.a.transfer_fit, self.a.recompute_fit
        bw = a.bandwidth_bytes_per_s / 1e9 if a.bandwidth_bytes_per_s else None
        transfer = {
            "deployment": a.label,
            "source": a.transfer_source or "–",
            "sizes": t.sizes if t else 0,
            "α (ms, 95% CI)": (
                f"{t.alpha_s * 1e3:.3f} {_ci(t.alpha_ci_s, 1e3, '.3f')}" if t else "–"
            ),
            "β (GB/s, 95% CI)": f"{t.gb_s:.3f} {_ci(t.gb_s_ci, 1, '.3f')}" if t else "–",
            "R²": f"{t.quality.r2:.4f}" if t else "–",
            "df": t.df if t else "–",
            "predicts": ("yes" if t.predicts else f"no: {t.why_not()}") if t else "–",
            "large-transfer GB/s": "–" if bw is None else f"{bw:.3f}",
            "KV bytes/token": a.kv_bytes_per_token or "–",
            "per transfer": (
                f"{a.transfer_bytes_per_token:,.0f}" if a.transfer_bytes_per_token else "–"
            ),
        }
        recompute = {
            "deployment": a.label,
            "samples": r.quality.n if r else len(a.recompute_samples),
            "c0 (ms, 95% CI)": f"{r.c0_s * 1e3:.2f} {_ci(r.ci['c0_s'], 1e3, '.2f')}" if r else "–",
            "c1 (µs/token, 95% CI)": f"{r.c1_s_per_token * 1e6:.3f} "
            f"{_ci(r.ci['c1_s_per_token'], 1e6, '.3f')}"
            if r
            else "–",
            "c2 (ns/token², 95% CI)": f"{r.c2_s_per_token2 * 1e9:.4f} "
            f"{_ci(r.ci['c2_s_per_token2'], 1e9, '.4f')}"
            if r and r.quadratic
            else "–",
            "R²": f"{r.quality.r2:.4f}" if r else "–",
            "df": r.df if r else "–",
            "prefill (tok/s, measured)": "–" if not a.prefill_tok_s else f"{a.prefill_tok_s:,.0f}",
        }
        return {"transfer_fit": [transfer], "recompute_fit": [recompute]}

    def to_dict(self) -> dict[str, Any]:
        a, t, r = self.a, self.a.transfer_fit, self.a.recompute_fit
        return {
            "deployment_id": a.deployment_id,
            "label": a.label,
            "transfer_source": a.transfer_source,
            "transfer_fit": None
            if t is None
            else {
                "alpha_s": t.alpha_s,
                "alpha_ci_s": list(t.alpha_ci_s),
                "beta_gb_s": t.gb_s,
                "beta_ci_gb_s": list(t.gb_s_ci),
                "sizes": t.sizes,
                "df": t.df,
                "r2": t.quality.r2,
                "predicts": t.predicts,
                "why_not": t.why_not(),
            },
            "recompute_fit": None
            if r is None
            else {
                "c0_s": r.c0_s,
                "c1_s_per_token": r.c1_s_per_token,
                "c2_s_per_token2": r.c2_s_per_token2,
                "ci": {k: list(v) for k, v in r.ci.items()},
                "df": r.df,
                "r2": r.quality.r2,
                "predicts": r.predicts,
            },
            "kv_bytes_per_token": a.kv_bytes_per_token,
            "transfer_bytes_per_token": a.transfer_bytes_per_token,
            "prefill_flops_per_s": a.flops_per_s,
            "prefill_tok_s": a.prefill_tok_s,
            "bandwidth_gb_s": a.bandwidth_bytes_per_s / 1e9 if a.bandwidth_bytes_per_s else None,
            "text": self.lines()[0],
        }


def answer(ctx: Context) -> list[TransferAnswer]:
    return [TransferAnswer(a) for a in ctx.deployments() if a.transfer_fit or a.recompute_fit]


def transfer_bandwidth(plt, answers: list[TransferAnswer], ctx: Context):
    bench, traces = ctx.data.bench, ctx.data.traces
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
        labels = {a.deployment_id: a.label for a in ctx.deployments()}
        shown = traces[traces["gb_s"].notna()]
        for (dep, direction), g in shown.groupby(["deployment_id", "direction"]):
            ax.scatter(
                g["bytes"],
                g["gb_s"],
                s=10,
                alpha=0.5,
                label=f"trace {direction} · {labels.get(dep, dep)}",
            )
    ax.set_xscale("log")
    plotkit.log_y(ax, [v for line in ax.get_lines() for v in line.get_ydata()], ratio=30)
    ax.set_xlabel("transfer size (bytes)")
    ax.set_ylabel("throughput (GB/s)")
    ax.set_title("KV transfer throughput vs size, per layout / TP split / op")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, ncol=2, loc="upper left")
    return fig


def fits(plt, answers: list[TransferAnswer], ctx: Context):
    if not answers:
        return None
    fig, axes = plt.subplots(len(answers), 2, figsize=(10.8, 3.4 * len(answers)), squeeze=False)
    for (ax_r, ax_t), ans in zip(axes, answers, strict=True):
        a = ans.a
        r, s = a.recompute_fit, a.recompute_samples
        if r is not None:
            ax_r.plot(s["tokens"], s["ttft_s"] * 1e3, "o", ms=3.5, label="measured (waves)")
            xs = np.linspace(0, s["tokens"].max() * 1.05, 200)
            ax_r.plot(xs, np.asarray(r.seconds(xs)) * 1e3, "-", label=f"fit, R² {r.quality.r2:.3f}")
            ax_r.legend(fontsize=8)
        ax_r.set_title(f"recompute · {a.label}", fontsize=9)
        ax_r.set_xlabel("prompt tokens computed")
        ax_r.set_ylabel("TTFT p50 of the wave (ms)")
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


QUESTION = Question(
    name="transfer",
    supporting=True,
    title="What do a transfer and a recompute cost?",
    answer=answer,
    plots=(
        PlotSpec("transfer_bandwidth", "Transfer throughput vs size", transfer_bandwidth),
        PlotSpec("fits", "Fits", fits, "recompute TTFT model and transfer alpha-beta model"),
    ),
    method=(
        "<b>Transfer fit</b>: t = &alpha; + bytes/&beta; from the history pulls only "
        "(P&lt;-D traces; transfer-bench READs when the traces lack sizes); three sizes or more "
        "to predict. <b>Recompute fit</b>: TTFT = c0 + c1&middot;n + c2&middot;n&sup2; over the "
        "prompt tokens computed. Both non-negative least squares on relative residuals, "
        "parameters with 95% CIs (the Points resampled); under 2 degrees of freedom, no "
        "prediction. <b>Predicted crossovers</b>: by the fits, c1&middot;h + c2&middot;h&sup2; "
        "&gt; &alpha; + h&middot;bytes/&beta;; by first principles, the FLOPs of h tokens at "
        "the measured prefill FLOP/s vs their KV bytes at the largest transfers' bandwidth."
    ),
)
