"""The command line before Hydra runs a job: verbs, checks, exit 2 with the message alone."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pdbench.cli import UsageError, parse_argv, precheck
from pdbench.config.schema import Command
from pdbench.help import COMMANDS

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]


def pdbench(*args: str, cwd: Path = REPO, env: dict | None = None):
    """``python -m pdbench ARGS`` as a user runs it."""
    environ = {k: v for k, v in os.environ.items() if k != "PDBENCH_DEBUG"}
    environ.update(PYTHONPATH=str(REPO), **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "pdbench", *args],
        cwd=cwd,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )


def usage_error(*args: str) -> str:
    with pytest.raises(UsageError) as info:
        precheck(parse_argv(list(args)))
    return str(info.value)


def test_verbs_become_commands_and_run_aliases_stay():
    inv = parse_argv(["status", "run.dir=results/x", "-m", "check"])
    assert inv.overrides == ["command=status", "dir=results/x"]
    assert inv.flags == ["-m"] and inv.multirun and inv.check_only
    assert "command=run command=status: one command at a time" in usage_error("run", "status")


def test_a_misspelt_verb_or_option_names_what_was_meant():
    assert "stauts: not a command and not key=value; did you mean status?" in usage_error("stauts")
    assert "--dry-run: not an option; did you mean launch.dry_run=...?" in usage_error("--dry-run")


def test_a_run_dir_or_analysis_without_a_key_gets_a_hint(tmp_path):
    (tmp_path / "manifest.json").write_text("{}")
    assert f"{tmp_path}: not a command and not key=value; did you mean dir={tmp_path}?" in (
        usage_error("status", str(tmp_path))
    )
    assert "analysed by python -m analysis RUN_DIR" in usage_error("analysis")


def test_flags_and_overrides_may_come_in_any_order():
    inv = parse_argv(["check", "-m", "+experiment=smoke", "--cfg", "job", "name=a"])
    assert inv.overrides == ["+experiment=smoke", "name=a"]
    assert inv.flags == ["-m", "--cfg", "job"] and inv.shows_config


def test_a_sweep_needs_multirun_and_cfg_shows_one_job():
    assert "add -m" in usage_error("+experiment=smoke", "name=a,b")
    assert "-m with --cfg/--info" in usage_error("-m", "--cfg", "job", "name=a,b")


def test_a_value_of_the_wrong_type_is_one_plain_line():
    text = usage_error("workload.turns=abc")
    assert "Value 'abc' of type 'str' could not be converted to Integer" in text
    assert "full_key" not in text and "$VALUE" not in text
    text = usage_error("transport.backends=UCX")
    assert text.endswith("Fix: a list is written in brackets and quoted for the shell: "
                         "'transport.backends=[UCX]'")  # fmt: skip


def test_validation_runs_on_every_job_of_a_sweep():
    text = usage_error("-m", "topology.decode.tp=1,3")
    assert "[topology.decode.tp=3] topology.decode.tp=3: does not divide" in text
    assert "[topology.decode.tp=1]" not in text


def test_status_needs_a_run_dir(tmp_path):
    assert "status needs the run directory: status dir=" in usage_error("status")
    text = usage_error("status", f"dir={tmp_path}")
    assert f"dir={tmp_path}: no manifest.json there: not a pdbench run directory" in text


def test_a_valid_sweep_gives_one_typed_job_per_combination():
    jobs = precheck(parse_argv(["-m", "+experiment=smoke", "name=a,b", "launch.dry_run=true"]))
    assert [j.cfg.name for j in jobs] == ["a", "b"]
    assert jobs[0].cfg.dir != jobs[1].cfg.dir  # each its own name, one launch time
    assert jobs[0].cfg.dir.removeprefix("results/a") == jobs[1].cfg.dir.removeprefix("results/b")


def test_command_is_an_enum_and_check_keeps_the_command_it_checks():
    (job,) = precheck(parse_argv(["check", "+experiment=transfer_bench"]))
    assert job.cfg.command is Command.transfer_bench
    assert "cluster.executor=debug: runs one task" in usage_error(
        "check", "+experiment=transfer_bench", "cluster=debug"
    )


def test_a_typo_exits_2_with_the_message_alone():
    for args in (["dry_run=true"], ["+dry_run=true"], ["command=bogus"]):
        out = pdbench(*args)
        assert out.returncode == 2, out
        assert out.stderr.startswith("pdbench: 1 problem(s) on the command line:\n")
        assert "Traceback" not in out.stderr and out.stdout == ""


def test_validation_errors_exit_2_and_debug_shows_the_traceback():
    out = pdbench("+experiment=smoke", "topology.decode.tp=3", "--cfg", "job")
    assert out.returncode == 2 and out.stdout == ""
    assert "topology.decode.tp=3: does not divide num_attention_heads (4)" in out.stderr
    assert "Traceback" not in out.stderr
    debug = pdbench("topology.decode.tp=3", "--cfg", "job", env={"PDBENCH_DEBUG": "1"})
    assert debug.returncode == 1 and "Traceback" in debug.stderr
    assert "UsageError" in pdbench("topology.decode.tp=3", "--debug").stderr


def test_check_validates_and_exits_0():
    out = pdbench("check", "+experiment=smoke")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ok: smoke (run) composes and validates")
    shown = pdbench("check", "--cfg", "job", "+experiment=smoke", "workload.concurrency=2")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("ok: smoke (run) composes and validates")
    assert "concurrency:\n  - 2\n" in shown.stdout  # --cfg kept: the config, as Hydra prints it


def test_a_dry_run_sweep_leaves_nothing_behind(tmp_path):
    out = pdbench(
        "-m",
        "+experiment=smoke",
        "workload.turns=1,2",
        "workload.repetitions=1",
        "launch.check_premises=false",
        "launch.dry_run=true",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("point pull-h0-") == 2
    assert list(tmp_path.iterdir()) == []


def run_module_alone(flag: str) -> subprocess.CompletedProcess:
    """``python -m pdbench FLAG`` in a fresh interpreter, then which heavy modules it loaded."""
    code = (
        f"import runpy, sys; sys.argv = ['pdbench', '{flag}']; "
        "runpy.run_module('pdbench', run_name='__main__'); "
        "print(sorted(m for m in ('torch', 'vllm', 'nixl', 'hydra') if m in sys.modules))"
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_help_is_pdbench_s_own_page_and_imports_nothing_heavy():
    out = run_module_alone("--help")
    assert out.returncode == 0, out.stderr
    page = out.stdout
    assert page.rstrip().endswith("[]")  # no torch, vllm, nixl, nor even Hydra imported
    for text in ("status dir=DIR", "check", "launch.dry_run=true", "cluster=slurm", "-m "):
        assert text in page
    assert "from which history length on does pulling the history from D beat" in page
    assert "cluster     debug, h100_8gpu, local*, slurm" in page
    assert "base_" not in page
    assert "--hydra-help" in page


def test_version_is_pdbench_s_with_the_vllm_and_nixl_it_finds():
    out = run_module_alone("--version")
    assert out.returncode == 0, out.stderr
    line, imported = out.stdout.splitlines()
    assert imported == "[]" and "Hydra" not in line
    assert re.match(r"pdbench \S+ \((vllm(-cpu)? \S+|no vLLM); (nixl \S+|no NIXL); python ", line)


def test_help_lists_every_command_verb():
    listed = {verb.split()[0] for verb, _ in COMMANDS}
    assert {c.value for c in Command} | {"check"} == listed
