"""The answer in words and as JSON (pure): the flagged Points, the presets' questions
(``questions.py``), then the crossover per deployment."""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any

from analysis.crossover import CROSSING, NO_DATA, Crossover, DeploymentAnalysis
from analysis.load import RunData
from analysis.questions import Questions, answer_questions, flag_lines, questions_summary


def json_safe(value: Any) -> Any:
    """nan/inf -> None, numpy scalars -> Python, recursively."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, str):
        try:
            value = value.item()
        except (ValueError, AttributeError):
            return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def pct(value: float | None) -> str:
    return "" if value is None else f"{value:+.0%}"


def _crossover_dict(c: Crossover) -> dict[str, Any]:
    return {**asdict(c), "text": c.describe()}


def _prediction_text(c: Crossover, gap: float | None, name: str) -> str:
    if c.status == CROSSING:
        vs = f", {pct(gap)} vs measured" if gap is not None else ""
        return f"{c.tokens:,.0f} by {name}{vs}"
    return f"{c.describe()} by {name}"


def deployment_answer(a: DeploymentAnalysis) -> str:
    """Two lines: the crossover (measured, then predicted) and the threshold to set."""
    m = a.measured
    if m.status == CROSSING:
        head = (
            f"pull beats recompute above {m.tokens:,.0f} tokens of history "
            f"(measured between {m.lo:,.0f} and {m.hi:,.0f})"
        )
    else:
        head = f"measured crossover: {m.describe()}"
    preds = "; ".join(
        (
            _prediction_text(a.by_fit, a.fit_vs_measured, "the fits"),
            _prediction_text(a.by_first_principles, a.fp_vs_measured, "first principles"),
        )
    )
    thr = f"{a.recommended_threshold:,} tokens" if a.recommended_threshold is not None else "none"
    return (
        f"{a.label}: {head}. Predicted: {preds}.\n"
        f"  recommended kv_recompute_threshold: {thr} ({a.recommendation})"
    )


def crossover_lines(analyses: list[DeploymentAnalysis], q: Questions) -> list[str]:
    """Every deployment's crossover; when another question was answered, the deployments
    without a measured one share a line (their predictions stay in the report)."""
    if not q.answered:
        return [deployment_answer(a) for a in analyses]
    measured = [a for a in analyses if a.measured.status != NO_DATA]
    rest = [a for a in analyses if a.measured.status == NO_DATA]
    lines = [deployment_answer(a) for a in measured]
    if rest:
        reasons = sorted({a.measured.reason or "no data" for a in rest})
        lines.append(
            f"pull-vs-recompute crossover not measured on {len(rest)} deployment(s) "
            f"({'; '.join(reasons)}); predictions from the fits are in the report"
        )
    return lines


def answer_lines(
    data: RunData, analyses: list[DeploymentAnalysis], questions: Questions | None = None
) -> list[str]:
    pts = data.points
    if not len(pts):
        return [
            "No Point records found "
            f"({', '.join(str(d) for d in data.run_dirs)}): nothing was measured yet, or the "
            "run dir is wrong (expected <run>/points/*.json)."
        ]
    ok = int((pts["status"] == "ok").sum())
    q = answer_questions(data, analyses) if questions is None else questions
    lines = [f"{ok} of {len(pts)} Points ok across {len(analyses)} deployment(s)."]
    lines += flag_lines(q.flagged)
    lines += q.lines()
    lines += crossover_lines(analyses, q)
    return lines


def _fit_dict(fit: Any) -> dict[str, Any] | None:
    return None if fit is None else asdict(fit)


def deployment_summary(a: DeploymentAnalysis) -> dict[str, Any]:
    shape = a.shape
    return {
        "deployment_id": a.deployment_id,
        "label": a.label,
        "model": a.model,
        "transport": a.transport,
        "tp_pair": a.tp_pair,
        "kv_recompute_threshold_configured": a.threshold,
        "kv_bytes_per_token": a.kv_bytes_per_token,
        "transfer_bytes_per_token": a.transfer_bytes_per_token,
        "params": shape.params if shape else None,
        "flops_per_token": shape.flops_per_token(0.0) if shape else None,
        "measured": _crossover_dict(a.measured),
        "predicted_fit": _crossover_dict(a.by_fit),
        "predicted_first_principles": _crossover_dict(a.by_first_principles),
        "fit_vs_measured_rel": a.fit_vs_measured,
        "first_principles_vs_measured_rel": a.fp_vs_measured,
        "fit_saving_rms_error_ms": a.fit_rms_ms,
        "first_principles_saving_rms_error_ms": a.fp_rms_ms,
        "recommended_kv_recompute_threshold": a.recommended_threshold,
        "recommendation": a.recommendation,
        "recompute_fit": _fit_dict(a.recompute_fit),
        "transfer_fit": _fit_dict(a.transfer_fit),
        "transfer_source": a.transfer_source,
        "prefill_flops_per_s": a.flops_per_s,
        "prefill_tok_s": a.prefill_tok_s,
        "bandwidth_gb_s": a.bandwidth_bytes_per_s / 1e9 if a.bandwidth_bytes_per_s else None,
        "pairs": a.pairs.to_dict(orient="records"),
        "notes": a.notes,
    }


def summary_dict(
    data: RunData,
    analyses: list[DeploymentAnalysis],
    plots: list[str],
    questions: Questions | None = None,
) -> dict[str, Any]:
    q = answer_questions(data, analyses) if questions is None else questions
    pts = data.points
    bench = data.bench
    flagged = int(bench["flag"].fillna(False).astype(bool).sum()) if "flag" in bench else 0
    return json_safe(
        {
            "run_dirs": [str(d) for d in data.run_dirs],
            "answer": answer_lines(data, analyses, q),
            "questions": questions_summary(q),
            "points": {
                "total": len(pts),
                "ok": int((pts["status"] == "ok").sum()) if len(pts) else 0,
                "failed": int((pts["status"] != "ok").sum()) if len(pts) else 0,
                "flagged": len(q.flagged),
            },
            "transfer_bench": {"records": len(bench), "flagged": flagged},
            "traces": len(data.traces),
            "deployments": [deployment_summary(a) for a in analyses],
            "notes": data.notes,
            "plots": plots,
        }
    )
