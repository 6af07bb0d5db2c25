"""A self-contained HTML report: the answer first, then one section per question the run
asked (its tables and plots, PNG inlined, from ``registry``), the Points, notes, the method
and provenance. No scripts, no external resources."""

from __future__ import annotations

import base64
import html
import math
import time
from pathlib import Path
from typing import Any

from analysis.method.deployment import Context
from analysis.method.stats import CALIBRATION_RUNS, CALIBRATION_SIGMAS
from analysis.output.plotting import Plot
from analysis.output.tables import Tables
from analysis.questions.question import Answered

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 0 auto;
       max-width: 1180px; padding: 1.2em 1.6em 3em; color: #1d232b; line-height: 1.45; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; } h3 { font-size: 1em; margin: 1.2em 0 0.2em; }
h2 { font-size: 1.2em; margin-top: 1.8em; border-bottom: 1px solid #d6dbe1;
     padding-bottom: 0.2em; }
.answer { background: #eef5ff; border-left: 4px solid #2c6fd6; padding: 0.5em 1em; }
.answer ul { list-style: none; padding: 0; margin: 0.3em 0; }
.answer li { margin: 0.35em 0; } .answer .q { display: block; font-size: 0.85em;
  color: #2c4f86; font-weight: 600; } .answer ul.a { font-size: 1.05em; margin: 0; }
.answer ul.a li { margin: 0.1em 0; }
.muted { color: #5c6773; font-size: 0.9em; }
.answer li.flags, .details li.flags { color: #b42318; }
.details li { margin: 0.35em 0; font-size: 0.92em; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.6em 0; max-width: 100%; }
th, td { border: 1px solid #d6dbe1; padding: 3px 7px; text-align: right; vertical-align: top;
         overflow-wrap: break-word; }
td.l { max-width: 30em; }
th { background: #f1f3f6; } td.l, th.l { text-align: left; }
tr:nth-child(even) td { background: #fafbfc; }
.bad { color: #b42318; font-weight: 600; } .scroll { overflow-x: auto; }
.invalid { background: #fdecea; border-left: 4px solid #b42318; padding: 0.6em 1em; }
figure { margin: 1em 0 1.6em; } figure img { max-width: 100%; border: 1px solid #e3e7ec; }
figcaption { font-size: 0.9em; color: #5c6773; }
ol.notes { font-size: 0.8em; color: #5c6773; margin-top: 0; }
code, pre { font-size: 0.85em; background: #f4f6f8; padding: 0 3px; }
"""


def esc(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def cell(value: Any) -> str:
    """A table cell: a number that is not one (nan, inf) or nothing is a dash."""
    if value is None or isinstance(value, float) and not math.isfinite(value):
        return "–"
    if isinstance(value, str) and value.strip().lstrip("+-").lower() in ("nan", "inf"):
        return "–"
    return esc(value)


LONG_CELL = 60  # characters: longer text goes below the table, the cell keeps its start


def table(rows: list[dict[str, Any]], left: tuple[str, ...] = (), bad: str | None = None) -> str:
    """An HTML table of dict rows; columns in ``left`` align left, ``bad`` marks a row red.
    A cell of long text keeps its first clause and a note mark; the whole text follows the
    table as a numbered note, so the table stays narrow."""
    if not rows:
        return '<p class="muted">(none)</p>'
    cols = list(dict.fromkeys(c for r in rows for c in r))
    out = ['<div class="scroll"><table><tr>']
    out += [f'<th class="{"l" if c in left else ""}">{esc(c)}</th>' for c in cols]
    out.append("</tr>")
    notes: list[str] = []
    for r in rows:
        cls = ' class="bad"' if bad and r.get(bad) not in (None, "", "ok") else ""
        out.append(f"<tr{cls}>")
        for c in cols:
            value = r.get(c)
            if isinstance(value, str) and len(value) > LONG_CELL:
                if value not in notes:  # one note for text repeated down a column
                    notes.append(value)
                shown = f"{esc(lead(value))} <sup>[{notes.index(value) + 1}]</sup>"
            else:
                shown = cell(value)
            out.append(f'<td class="{"l" if c in left else ""}">{shown}</td>')
        out.append("</tr>")
    out.append("</table></div>")
    if notes:
        out.append('<ol class="notes">' + "".join(f"<li>{esc(n)}</li>" for n in notes))
        out.append("</ol>")
    return "".join(out)


def lead(text: str) -> str:
    """The start of a long cell: up to its first parenthesis, ';' or the length allowed."""
    cut = min((i for i in (text.find(" ("), text.find("; ")) if i > 0), default=len(text))
    head = text[: min(cut, LONG_CELL)].rstrip()
    return head + ("…" if len(head) < len(text) else "")


def points_tables(rows: list[dict[str, Any]]) -> str:
    """One table per deployment (the label as a heading)."""
    if not rows:
        return '<p class="muted">(no Point records)</p>'
    out = []
    for label in dict.fromkeys(r["deployment"] for r in rows):
        mine = [{k: v for k, v in r.items() if k != "deployment"} for r in rows]
        mine = [m for m, r in zip(mine, rows, strict=True) if r["deployment"] == label]
        out.append(f"<h3>{esc(label)}</h3>")
        out.append(table(mine, left=("flow", "flags", "error"), bad="status"))
    return "\n".join(out)


def _img(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def _card(card: dict[str, Any]) -> str:
    """A question, small, above its answers; the facts of the run without one."""
    items = []
    for answer in card["answers"]:
        bad = answer.startswith(("A/A control FAILED", "INVALID")) or " flagged: " in answer
        cls = ' class="flags"' if bad else ""
        items.append(f"<li{cls}>{esc(answer)}</li>")
    head = f"<span class='q'>{esc(card['question'])}</span>" if card["question"] else ""
    return f"<li>{head}<ul class='a'>{''.join(items)}</ul></li>"


def _answer_item(line: str) -> str:
    first = line.split("\n", 1)[0]
    bad = " flagged: " in first or first.startswith(("INVALID RUN", "Corrupt records"))
    cls = ' class="flags"' if bad else ""
    body = esc(line).replace("\n  ", "<br>&emsp;").replace("\n", "<br>")
    return f"<li{cls}>{body}</li>"


STATISTICS = f"""
<p><b>Statistics.</b> A repetition is one Point per flow at a (deployment, workload kind,
history length), with fresh conversations; repetition r of every flow uses the same
conversations, so requests pair across flows by (repetition, conversation, turn). A
repetition's requests (batched waves) are averaged first; the 95% intervals come from the
spread between repetitions at each history length: a stratified cluster bootstrap
(Rao&ndash;Wu rescaled, so 3 repetitions are not under-counted), used in closed form where
the statistic is linear, with Student-t quantiles and Welch&ndash;Satterthwaite degrees of
freedom (a percentile bootstrap over 3&ndash;5 repetitions covers well under 95%). A
difference whose interval spans 0, or a crossover whose interval leaves the measured range,
is <i>inconclusive</i>, with the repetitions estimated to decide it (80% power). Each
interval is <i>pointwise</i>: the band around the fitted saving holds the true saving at
each length with 95%, not the whole curve at once. The method is checked by
<code>tests/unit/test_analysis_calibration.py</code>: on {CALIBRATION_RUNS} seeded synthetic
runs as rough as a real crossover run, with a known crossover, the cells at every length and
the band at both ends and at the crossover cover the truth at 50% and 95% within
{CALIBRATION_SIGMAS:.0f} binomial standard deviations of nominal, and the same check fails
for each deliberate break of the method (standard errors 20% off, z for t, no Rao&ndash;Wu
rescaling, pooled degrees of freedom, no strata, the wrong repetitions paired).</p>
"""


def _figure(p: Plot) -> str:
    caption = esc(p.title) + (": " + esc(p.caption) if p.caption else "")
    return (
        f'<figure id="plot-{esc(p.name)}"><img alt="{esc(p.title)}" src="{_img(p.path)}">'
        f"<figcaption>{caption}</figcaption></figure>"
    )


def question_section(a: Answered, tables: Tables, plots: list[Plot]) -> list[str]:
    """A heading, the question's tables and its plots."""
    out = [f'<h2 id="q-{esc(a.question.name)}">{esc(a.question.title)}</h2>']
    for name, rows in tables.questions.get(a.question.name, {}).items():
        out += [f"<h3>{esc(name.replace('_', ' '))}</h3>", table(rows, left=LEFT)]
    out += [_figure(p) for p in plots if p.question == a.question.name]
    return out


LEFT = ("deployment", "deployments", "flow", "kind", "why", "source", "placement", "verdict",
        "measured crossover", "recommended threshold", "threshold", "by fits",
        "by first principles", "routes", "run", "predicts")  # fmt: skip


def render(
    ctx: Context,
    answered: list[Answered],
    plots: list[Plot],
    summary: dict[str, Any],
    tables: Tables,
    title: str = "pdbench analysis",
) -> str:
    """The report of an analysis: ``summary`` (``answer.summary_dict``: its answer lines and
    validity) and ``tables`` (``tables.Tables``) as computed once for every output."""
    data = ctx.data
    names = ", ".join(Path(d).name for d in data.run_dirs)
    cards = "".join(_card(card) for card in summary["cards"])
    answer = "".join(_answer_item(line) for line in summary["answer"])
    asked = [a for a in answered if a.asked and a.question.name != "flagged"]
    banner = (
        ""
        if summary["valid"]
        else '<p class="invalid"><b>INVALID RUN</b>: the A/A control failed; see '
        '<a href="#q-control">the control</a>. Its verdicts are not evidence.</p>'
    )
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>{esc(title)} — {esc(names)}</title><style>{CSS}</style></head><body>",
        f"<h1>{esc(title)}: {esc(names)}</h1>",
        f'<p class="muted">generated {esc(time.strftime("%Y-%m-%d %H:%M:%S"))} by '
        f"<code>python -m analysis</code>; every interval is a 95% confidence interval</p>",
        banner,
        f'<div class="answer" id="answer"><ul>{cards}</ul></div>',
        '<h2 id="details">Every answer in detail</h2>',
        f'<div class="details"><ul>{answer}</ul></div>',
    ]
    for a in asked:
        parts += question_section(a, tables, plots)
    notes = data.notes + [f"{d.label}: {n}" for d in ctx.deployments() for n in d.notes]
    if data.corrupt:
        notes = [f"corrupt record: {c}" for c in data.corrupt] + notes
    if notes:
        parts.append("<h2>Notes</h2><ul>" + "".join(f"<li>{esc(n)}</li>" for n in notes))
        parts.append("</ul>")
    parts += [
        "<h2>Points</h2>",
        points_tables(tables.points),
        "<h2>Transfer bench</h2>",
        table(tables.bench, left=("op", "layout", "tp_split", "ucx_tls", "memory"))
        if tables.bench
        else '<p class="muted">(no transfer-bench records in these run dirs)</p>',
        "<h2>Method</h2>",
        STATISTICS,
        "<ul>" + "".join(f"<li>{a.question.method}</li>" for a in answered if a.question.method),
        "</ul>",
        "<h2>Provenance</h2>",
        table(tables.provenance, left=("run dir", "name", "git sha", "packages", "CPU")),
        table(tables.hosts, left=("run dir", "instance", "host:port")),
        "</body></html>",
    ]
    return "\n".join(parts)
