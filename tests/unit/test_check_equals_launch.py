"""``check`` says what the launch would: for each command line, ``python -m pdbench check
ARGS`` and the dry run ``python -m pdbench ARGS launch.dry_run=true`` exit alike, and where
they refuse, with the same lines (issue 27: check said ok for a crossover into a smoke run
dir, whose refusal lived in the launch only)."""

from __future__ import annotations

import pytest

from pdbench.config.compose import compose_job
from pdbench.driver.run_dir import write_manifest
from pdbench.plan.deployments import make_plan
from pdbench.results.jsonable import to_jsonable
from pdbench.results.manifest import LaunchOrigin
from pdbench.results.store import RunStore
from tests.unit.test_cli import pdbench

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def smoke_dir(tmp_path_factory):
    """A run dir a smoke launch wrote its manifest into."""
    run_dir = tmp_path_factory.mktemp("runs") / "smoke"
    cfg = compose_job(["+experiment=smoke", f"dir={run_dir}"])
    origin = LaunchOrigin.of(["+experiment=smoke", f"dir={run_dir}"])
    write_manifest([to_jsonable(cfg)], make_plan(cfg), RunStore(run_dir), "/model", origin)
    return run_dir


LINES = [
    ["+experiment=smoke", "dir={new}"],
    ["+experiment=smoke", "dir={smoke}"],  # the same experiment: a resume
    ["+experiment=crossover", "dir={smoke}"],  # another experiment into it
    ["+experiment=transfer_bench", "bench.iterations=0"],
    ["+experiment=smoke", "workload.repetitions=1", "dir={new}"],
    ["+experiment=decode_cost", "workload.concurrency=2", "dir={new}"],
    ["serve", "+experiment=decode_cost", "dir={new}"],  # several deployments to serve
    ["serve", "+experiment=smoke", "dir={new}"],
]


def test_the_lines_cover_both_verdicts_and_the_launchs_own_refusals():
    joined = [" ".join(line) for line in LINES]
    assert any("crossover" in j and "{smoke}" in j for j in joined)
    assert any(j.startswith("serve +experiment=decode_cost") for j in joined)


@pytest.mark.parametrize("line", LINES, ids=[" ".join(a) for a in LINES])
def test_checks_verdict_is_the_dry_runs(line, smoke_dir, tmp_path):
    args = [a.format(smoke=smoke_dir, new=tmp_path / "new") for a in line]
    checked = pdbench("check", *args)
    dry = pdbench(*args, "launch.dry_run=true")
    assert checked.returncode == dry.returncode, (checked.stderr, dry.stderr)
    assert checked.returncode in (0, 2), checked.stderr
    if checked.returncode:
        assert checked.stderr == dry.stderr
        assert checked.stderr.startswith("pdbench: ") and "Traceback" not in checked.stderr
    else:
        assert checked.stdout.startswith("ok: ")
    assert not (tmp_path / "new").exists()  # neither wrote anything
