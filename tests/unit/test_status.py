import os

import pytest

from pdbench.driver.run_dir import write_manifest
from pdbench.driver.status import print_status
from pdbench.plan.deployments import make_plan
from pdbench.results.jsonable import to_jsonable
from pdbench.results.store import CorruptRecord, RunStore
from records.point import PointResult
from tests.unit.helpers import cpu_run, one_pass

pytestmark = pytest.mark.unit


def test_status_counts_done_failed_pending_and_names_logs(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("pdbench.driver.provenance.collect", lambda: {})
    cfg = one_pass(cpu_run(dir=str(tmp_path)))
    plan = make_plan(cfg)
    store = RunStore(tmp_path)
    write_manifest([to_jsonable(cfg)], plan, store, "/model")
    agg, recompute, _pull = plan.all_points()
    store.write_point(PointResult(agg.point_id, "ok", "", "agg", {}, {}), [])
    store.write_point(
        PointResult(recompute.point_id, "failed", "D died\ntrace", "recompute", {}, {}), []
    )
    print_status(str(tmp_path))
    out = capsys.readouterr().out
    assert "1 ok, 1 failed, 1 pending of 3" in out
    assert f"failed {recompute.point_id}: D died" in out
    assert "server logs:" in out


def test_status_of_a_missing_run_says_how_to_fix(tmp_path):
    with pytest.raises(SystemExit, match="no manifest.json"):
        print_status(str(tmp_path / "nope"))


def test_local_jobs_are_running_or_ended_by_their_process(tmp_path, capsys, monkeypatch):
    import os

    monkeypatch.setattr("pdbench.driver.provenance.collect", lambda: {})
    cfg = one_pass(cpu_run(dir=str(tmp_path)))
    store = RunStore(tmp_path)
    write_manifest([to_jsonable(cfg)], make_plan(cfg), store, "/model")
    with open("/proc/sys/kernel/pid_max") as f:
        no_such_pid = f.read().strip()  # pids stay below pid_max
    logs = {"stdout": "o.log", "stderr": "e.log"}
    manifest = store.read_manifest()
    manifest["jobs"] = [
        {"deployment_id": "a", "job_id": str(os.getpid()), "executor": "local", **logs},
        {"deployment_id": "b", "job_id": no_such_pid, "executor": "local", **logs},
    ]
    store.write_manifest(manifest)
    print_status(str(tmp_path))
    out = capsys.readouterr().out
    assert f"job {os.getpid()} (a): running (local process {os.getpid()})" in out
    assert "(b): ended (local process gone" in out


def test_a_truncated_point_is_named_counted_corrupt_and_the_rest_still_counted(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr("pdbench.driver.provenance.collect", lambda: {})
    cfg = one_pass(cpu_run(dir=str(tmp_path)))
    plan = make_plan(cfg)
    store = RunStore(tmp_path)
    write_manifest([to_jsonable(cfg)], plan, store, "/model")
    agg, recompute, pull = plan.all_points()
    store.write_point(PointResult(agg.point_id, "ok", "", "agg", {}, {}), [])
    store.write_point(PointResult(recompute.point_id, "ok", "", "recompute", {}, {}), [])
    path = store.point_path(recompute.point_id)
    path.write_text(path.read_text()[:20])  # a torn write (copied, disk full, ...)
    print_status(str(tmp_path))
    out = capsys.readouterr().out
    assert "1 ok, 0 failed, 1 corrupt, 1 pending of 3" in out
    assert f"corrupt {path}: corrupt record (" in out
    assert store.point_status(recompute.point_id) == "corrupt"  # not ok: a rerun redoes it
    with pytest.raises(CorruptRecord, match=f"{path}: corrupt record"):
        store.iter_points()


def test_a_corrupt_manifest_is_named_with_a_rerun_that_works(tmp_path, capsys):
    (tmp_path / "manifest.json").write_text('{"name": "x", "jo')
    print_status(str(tmp_path))  # no exit: the Points are still there to count
    out = capsys.readouterr().out
    assert f"{tmp_path}/manifest.json: corrupt record (" in out
    assert "Fix: rerun the command that made the run with dir=" in out


def fake_slurm_bin(tmp_path, monkeypatch, squeue: str) -> None:
    """``squeue`` and ``scontrol`` that run ``squeue``'s shell text, first on PATH; what the
    real ones do against a live controller is the e2e tier's (tests/e2e/test_local_slurm.py)."""
    for name in ("squeue", "scontrol"):
        tool = tmp_path / "bin" / name
        tool.parent.mkdir(exist_ok=True)
        tool.write_text(f"#!/bin/sh\n{squeue}\n")
        tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")


def test_a_controller_that_does_not_answer_is_said_not_read_as_a_forgotten_job(
    tmp_path, monkeypatch
):
    from pdbench.driver import slurm_state

    # squeue's words when slurmctld is down (slurm 22.05, after ~18 s of retries), exit 1
    fake_slurm_bin(
        tmp_path,
        monkeypatch,
        'echo "slurm_load_jobs error: Unable to contact slurm controller (connect failure)" >&2'
        "; exit 1",
    )
    said = slurm_state.slurm_state("123")
    assert said.startswith("SLURM's controller did not answer (squeue: slurm_load_jobs error")
    # a controller that answers, not knowing the job: nothing said (status: "not known")
    fake_slurm_bin(tmp_path, monkeypatch, "exit 0")
    assert slurm_state.slurm_state("123") == ""


def test_a_controller_that_does_not_answer_in_time_is_said_with_the_wait(tmp_path, monkeypatch):
    from pdbench.driver import slurm_state

    # the real squeue retries a dead controller for ~18 s before its error (slurm 22.05)
    monkeypatch.setattr(slurm_state, "QUERY_TIMEOUT_S", 1)
    fake_slurm_bin(tmp_path, monkeypatch, "sleep 5")
    assert slurm_state.slurm_state("123") == "SLURM's controller did not answer within 1 s (squeue)"
