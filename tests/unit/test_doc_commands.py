"""Every command the README and the docs site show runs: a renamed field, preset, flag or
module fails here, not in a reader's terminal.

Each command runs in an empty working directory of its own, given what it reads (a run dir
made by the synthetic generator, the policy file a ``flow=policy`` preset needs, a trace),
in its cheapest real form: ``python -m pdbench`` lines are composed and validated as
``check`` does (every job of a ``-m`` line), ``--help`` and ``--cfg`` run as typed,
``python -m analysis`` analyses a synthetic run at the path named, small tools run as
written, benchmarks answer ``--help``, ``make`` lines must name a target (``make -n``).
The load generators' lines ``serve`` prints are compared with what it prints.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from analysis.__main__ import main as analysis_main
from jobs.serving import client_commands
from pdbench.cli import UsageError, parse_argv, precheck
from pdbench.config.compose import compose_job
from testbed.synthetic import write_synthetic_run
from tests.unit.doc_commands import NOT_RUN, PAGES, REPO, DocCommand, documented_commands
from tests.unit.helpers import planted_policy

pytestmark = pytest.mark.unit

# each distinct command once (the test's id names where it first appears)
COMMANDS = list(
    {
        c.text.split("  #")[0].strip(): c
        for c in reversed(documented_commands())
        if c.kind not in NOT_RUN
    }.values()
)[::-1]
SHOWN_ONLY = [c for c in documented_commands() if c.kind in NOT_RUN]
# Tools run as written (cheap, and what they write is what a later line reads).
RUN_AS_WRITTEN = {"pdbench.traffic.examples", "testbed.synthetic", "analysis.whatif"}
# Tools that read run dirs: run on a synthetic run at each path named.
ON_SYNTHETIC_RUNS = {"testbed.roughness"}
# Modules a page names as a program, not a command line (no arguments).
HELP_ONLY_PREFIXES = ("benchmarks.", "jobs.preflight")
# Lines the e2e tier runs as written: `serve`'s print of them (tests/e2e/test_serve.py), which
# test_the_load_generators_lines_are_what_serve_prints holds the page to. Here: the module is
# there (its --help alone would import vLLM, ~15 s).
RUN_BY_E2E = {"benchmarks.vllm_bench_serve"}


def module_exists(name: str) -> bool:
    """``name`` is a module or package on the path, found without importing it or its
    parents (``find_spec`` of ``vllm.entrypoints.openai.api_server`` imports vLLM)."""
    top, *rest = name.split(".")
    spec = importlib.util.find_spec(top)
    if spec is None or not rest:
        return spec is not None
    for location in spec.submodule_search_locations or []:
        base = Path(location, *rest)
        if base.with_suffix(".py").is_file() or (base / "__init__.py").is_file():
            return True
    return False


def run(argv: list[str], cwd: Path, timeout_s: float = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "MPLBACKEND": "Agg"}
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s)


def local_path(word: str, cwd: Path) -> Path:
    """A path a page names, inside the command's own directory (``/tmp/x`` included)."""
    return cwd / word.removeprefix("/tmp/").lstrip("/")


def in_cwd(argv: list[str], cwd: Path) -> list[str]:
    return [str(local_path(w, cwd)) if w.startswith("/tmp/") else w for w in argv]


def synthetic_run_at(path: Path) -> None:
    if not (path / "manifest.json").is_file():
        write_synthetic_run(path, histories=(0, 256, 1024), bench=False)


def settings(argv: list[str]) -> dict[str, str]:
    return dict(w.split("=", 1) for w in argv if "=" in w and not w.startswith("-"))


def prepare_pdbench(argv: list[str], cwd: Path) -> None:
    """What a ``python -m pdbench`` line reads, made in ``cwd``: a policy file, a trace, a
    run dir for the verbs that read one."""
    given = settings(argv)
    trace = given.get("workload.trace.path")
    if trace and not local_path(trace, cwd).exists():
        res = run([sys.executable, "-m", "pdbench.traffic.examples", "mooncake", trace], cwd)
        assert res.returncode == 0, res.stderr
    policy = given.get("flow.policy")
    if policy and not (cwd / policy).exists():
        words = [w for w in parse_argv(argv).overrides if not w.startswith("flow.policy=")]
        words = [w.split(",")[0] if w.count("=") == 1 else w for w in words]  # one job of -m
        cfg = compose_job(words)
        (cwd / policy).parent.mkdir(parents=True, exist_ok=True)
        planted_policy(cfg, cwd / policy)
    verb = next((w for w in argv if "=" not in w and not w.startswith(("-", "+"))), "")
    if verb in ("status", "stop") and "dir" in given:
        synthetic_run_at(cwd / given["dir"])


def check_pdbench(cmd: DocCommand, argv: list[str], cwd: Path, monkeypatch) -> None:
    args = argv[3:]
    if "--help" in args or "-h" in args:
        res = run([sys.executable, "-m", "pdbench", *args], cwd)
        assert res.returncode == 0 and "+experiment=" in res.stdout, res.stdout + res.stderr
        return
    prepare_pdbench(args, cwd)
    monkeypatch.chdir(cwd)
    try:
        jobs = precheck(parse_argv(args))
    except UsageError as err:
        pytest.fail(f"{cmd.where}: `{cmd.text}` is refused:\n{err}")
    assert len(jobs) >= 1


def check_analysis(argv: list[str], cwd: Path, monkeypatch, capsys) -> None:
    """``python -m analysis ARGS`` as its ``main(ARGS)`` in ``cwd`` (the module's own start is
    run by every e2e test that analyses a run; here it would only add ~2 s of imports)."""
    args = in_cwd(argv[3:], cwd)
    paths = [a for a in args if not a.startswith("-")]
    assert paths, "an analysis line names a run dir"
    for p in paths:
        synthetic_run_at(local_path(p, cwd) if not Path(p).is_absolute() else Path(p))
    monkeypatch.chdir(cwd)
    capsys.readouterr()
    rc = analysis_main(args)
    out, err = capsys.readouterr()
    assert rc == 0, out[-3000:] + err[-3000:]
    assert "report" in out, out[-3000:]


def check_module(cmd: DocCommand, argv: list[str], cwd: Path) -> None:
    module = argv[2]
    if len(argv) == 3:  # a page naming the program
        assert module_exists(module), f"{cmd.where}: no module {module}"
        return
    if module in RUN_BY_E2E:
        assert module_exists(module), f"{cmd.where}: no module {module}"
        return
    if module in ON_SYNTHETIC_RUNS:
        args = in_cwd(argv[3:], cwd)
        for path in (a for a in args if not a.startswith("-")):
            synthetic_run_at(local_path(path, cwd) if not Path(path).is_absolute() else Path(path))
        res = run([sys.executable, "-m", module, *args], cwd)
        assert res.returncode == 0, f"{cmd.where}: {res.stdout[-2000:]}{res.stderr[-2000:]}"
        return
    if module in RUN_AS_WRITTEN:
        args = in_cwd(argv[3:], cwd)
        policy = settings(args).get("policy")
        if policy and not (cwd / policy).exists():
            (cwd / policy).parent.mkdir(parents=True, exist_ok=True)
            planted_policy(compose_job(["+experiment=crossover_load"]), cwd / policy)
        res = run([sys.executable, "-m", module, *args], cwd)
        assert res.returncode == 0, f"{cmd.where}: {res.stdout[-2000:]}{res.stderr[-2000:]}"
        return
    if module.startswith(HELP_ONLY_PREFIXES) or module == "pdbench.spec.vllm_install":
        res = run([sys.executable, "-m", module, "--help"], cwd, timeout_s=120)
        assert res.returncode == 0, f"{cmd.where}: {res.stdout[-2000:]}{res.stderr[-2000:]}"
        return
    pytest.fail(f"{cmd.where}: no check for `python -m {module}`: add one to this test")


def check_make(cmd: DocCommand, argv: list[str], cwd: Path) -> None:
    targets = [w for w in argv[1:] if "=" not in w and not w.startswith("-")]
    res = run(["make", "-n", "-C", str(REPO), *targets], cwd)
    assert res.returncode == 0, f"{cmd.where}: `{cmd.text}`: {res.stderr}"


@pytest.mark.parametrize("cmd", COMMANDS, ids=[f"{c.where} {c.text[:60]}" for c in COMMANDS])
def test_documented_command_runs(cmd: DocCommand, tmp_path, monkeypatch, capsys):
    shown = " ".join(cmd.argv)
    assert "<" not in shown and "..." not in shown, (
        f"{cmd.where}: `{cmd.text}` has a placeholder: write a runnable command "
        "(a concrete path such as results/xo)"
    )
    argv = cmd.argv
    kind = cmd.kind
    if len(argv) == 3 and kind in ("pdbench", "analysis"):  # a page naming the program
        assert module_exists(argv[2]), cmd.where
        return
    if kind == "pdbench":
        check_pdbench(cmd, argv, tmp_path, monkeypatch)
    elif kind == "analysis":
        check_analysis(argv, tmp_path, monkeypatch, capsys)
    elif kind.startswith("python:"):
        check_module(cmd, argv, tmp_path)
    elif kind == "make":
        check_make(cmd, argv, tmp_path)
    else:
        pytest.fail(f"{cmd.where}: no check for `{kind}` commands: add one to this test")


def test_the_pages_show_commands_of_every_kind():
    kinds = {c.kind for c in COMMANDS}
    assert {"pdbench", "analysis", "make", "python:pdbench.traffic.examples"} <= kinds, kinds
    wheres = {c.where.split(":")[0] for c in COMMANDS}
    assert "README.md" in wheres and "docs/gpu.md" in wheres and "docs/policy.md" in wheres


def served_as_documented() -> client_commands.Served:
    clients = "results/serve/clients"
    return client_commands.Served(
        url="http://127.0.0.1:8000",
        model="tiny_llama",
        tokenizer="$MODEL_DIR",
        results_dir=clients,
        conversations_file=f"{clients}/conversations.jsonl",
    )


def test_the_load_generators_lines_are_what_serve_prints():
    """docs/serving.md shows the clients' commands as `serve` prints them; the e2e tier runs
    them as printed, so the page must be that print."""
    shown = {shlex.split(c.text)[0]: shlex.split(c.text) for c in documented_commands()}
    printed = client_commands.commands(served_as_documented())
    assert shown["aiperf"] == shlex.split(printed["AIPerf"])
    assert shown["guidellm"] == shlex.split(printed["GuideLLM"])
    vllm_bench = next(c for c in COMMANDS if "benchmarks.vllm_bench_serve" in c.text)
    assert vllm_bench.argv == shlex.split(printed["vllm bench serve"])
    assert {c.kind for c in SHOWN_ONLY} <= set(NOT_RUN)


def test_every_preset_is_in_the_readme_and_the_presets_page():
    presets = sorted(p.stem for p in (REPO / "conf" / "experiment").glob("*.yaml"))
    for page in (REPO / "README.md", REPO / "docs" / "presets.md"):
        text = page.read_text()
        missing = [p for p in presets if f"`{p}`" not in text]
        assert not missing, f"{page.name} does not list {missing}"


def test_the_readme_is_short_and_every_page_is_in_the_nav():
    assert len((REPO / "README.md").read_text().splitlines()) <= 200
    nav = (REPO / "mkdocs.yml").read_text()
    for page in PAGES[1:]:
        rel = page.relative_to(REPO / "docs").as_posix()
        assert rel in nav, f"docs/{rel} is not in mkdocs.yml's nav"
