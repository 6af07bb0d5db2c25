"""Draw every asked question's plots into PNG files (matplotlib, Agg, imported here only)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from analysis.kit.plotkit import DPI
from analysis.method.deployment import Context
from analysis.questions.question import Answered


@dataclass
class Plot:
    name: str  # file stem
    title: str
    path: Path
    caption: str = ""
    question: str = ""


def make_plots(
    ctx: Context,
    answered: list[Answered],
    out_dir: Path,
    progress: Callable[[str], None] | None = None,
) -> list[Plot]:
    """The plots of the asked questions, in registry order (a question's plots in its own
    order); a plot with nothing to draw is left out."""
    import matplotlib  # lazy: heavy, and only this step draws

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: as above

    out_dir.mkdir(parents=True, exist_ok=True)
    made = []
    with plt.rc_context({"font.size": 9, "axes.titlesize": 10, "figure.dpi": DPI}):
        for a in answered:
            for spec in a.question.plots if a.asked else ():
                if progress:
                    progress(f"[analysis]   {spec.name}.png")
                fig = spec.draw(plt, a.answers, ctx)
                if fig is None:
                    continue
                fig.tight_layout()
                path = out_dir / f"{spec.name}.png"
                # the saved image holds every artist: a suptitle or a legend outside the axes
                # is not cut off by the figure's frame
                fig.savefig(path, dpi=DPI, bbox_inches="tight", pad_inches=0.08)
                plt.close(fig)
                made.append(Plot(spec.name, spec.title, path, spec.caption, a.question.name))
    return made
