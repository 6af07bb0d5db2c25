"""The manifest's history: every launch appended, another experiment refused (with the
keys that differ and the override), the jobs of one sweep let through, status shows it."""

from __future__ import annotations

import copy
import json
import os

import pytest

from pdbench.config.compose import compose_job
from pdbench.config.problems import ConfigError
from pdbench.config.schema import Flow
from pdbench.driver import status
from pdbench.driver.run_dir import RunDir, write_manifest
from pdbench.driver.status import print_status
from pdbench.plan.deployments import make_plan
from pdbench.results.jsonable import to_jsonable
from pdbench.results.manifest import LaunchOrigin, launches
from pdbench.results.store import RunStore
from records.point import PointResult
from tests.unit.helpers import cpu_run
from tests.unit.test_cli import pdbench

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def _no_provenance_probes(monkeypatch):
    monkeypatch.setattr(
        "pdbench.driver.provenance.collect", lambda: {"hostname": "h", "git_sha": "abc"}
    )


def launch_into(cfg, origin: LaunchOrigin) -> None:
    """What ``launch`` does with the manifest before submitting."""
    RunDir.open(cfg, make_plan(cfg), origin, claim=False).begin("/model", origin)


def test_a_resume_with_raised_timeouts_is_appended_and_status_shows_what_changed(tmp_path, capsys):
    cfg = cpu_run(dir=str(tmp_path), name="smoke")
    launch_into(cfg, LaunchOrigin.of(["+experiment=smoke", f"dir={tmp_path}"]))
    again = copy.deepcopy(cfg)
    again.server.startup_timeout_s = 900.0
    again.workload.request_timeout_s = 600.0
    launch_into(again, LaunchOrigin.of(["+experiment=smoke", "server.startup_timeout_s=900"]))
    manifest = RunStore(tmp_path).read_manifest()
    history = launches(manifest)
    assert len(history) == 2
    assert history[1]["command_line"] == (
        "python -m pdbench +experiment=smoke server.startup_timeout_s=900"
    )
    assert history[1]["config"]["server"]["startup_timeout_s"] == 900.0
    assert manifest["config"]["server"]["startup_timeout_s"] == 1800.0  # the dir's: kept
    print_status(str(tmp_path))
    out = capsys.readouterr().out
    assert "launch 1 (" in out and f"dir={tmp_path}" in out
    assert "launch 2 (" in out and "h, git abc" in out
    assert (
        "changed since launch 1: server.startup_timeout_s: 1800.0 -> 900.0; "
        "workload.request_timeout_s: 120.0 -> 600.0"
    ) in out


def test_another_experiment_into_the_dir_is_refused_key_by_key_with_the_override(tmp_path):
    cfg = cpu_run(dir=str(tmp_path), name="smoke")
    launch_into(cfg, LaunchOrigin.of(["+experiment=smoke"]))
    other = copy.deepcopy(cfg)
    other.name = "crossover"
    other.server.block_size = 64
    other.workload.turns = 6
    with pytest.raises(ConfigError) as info:
        launch_into(other, LaunchOrigin.of(["+experiment=crossover"]))
    text = str(info.value)
    assert f"dir={tmp_path}: the run dir holds another experiment" in text
    assert "server.block_size: 32 (dir) -> 64 (this launch)" in text
    assert "workload.turns: 4 (dir) -> 6 (this launch)" in text
    assert "launch 1 (" in text and "python -m pdbench +experiment=smoke" in text
    assert "Fix: a new dir= for a new experiment" in text and "launch.allow_mixed=true" in text
    manifest = RunStore(tmp_path).read_manifest()
    assert manifest["name"] == "smoke" and len(launches(manifest)) == 1  # nothing overwritten
    other.launch.allow_mixed = True
    launch_into(other, LaunchOrigin.of(["+experiment=crossover", "launch.allow_mixed=true"]))
    manifest = RunStore(tmp_path).read_manifest()
    assert manifest["name"] == "smoke"
    assert [launch["name"] for launch in launches(manifest)] == ["smoke", "crossover"]
    assert manifest["config"]["server"]["block_size"] == 32


def test_the_jobs_of_one_sweep_share_the_dir_and_a_later_rerun_of_one_job_passes(tmp_path):
    sweep = LaunchOrigin.of(["-m", "+experiment=smoke", "server.block_size=32,64"])
    first = cpu_run(dir=str(tmp_path))
    second = copy.deepcopy(first)
    second.server.block_size = 64
    launch_into(first, sweep)
    launch_into(second, sweep)  # same invocation: the swept key may differ
    launch_into(second, LaunchOrigin.of(["+experiment=smoke", "server.block_size=64"]))
    assert len(launches(RunStore(tmp_path).read_manifest())) == 3
    third = copy.deepcopy(first)
    third.server.block_size = 128
    with pytest.raises(ConfigError, match=r"server.block_size: 32 \(dir\) -> 128"):
        launch_into(third, LaunchOrigin.of(["server.block_size=128"]))


def test_more_values_of_a_sweep_axis_extend_the_dir(tmp_path):
    cfg = cpu_run(dir=str(tmp_path))
    launch_into(cfg, LaunchOrigin.of([]))
    more = copy.deepcopy(cfg)
    more.workload.history_tokens = [0, 1024]
    more.flow.flows = [Flow.agg, Flow.pull]
    more.flow.kv_recompute_threshold = [0, 64]
    launch_into(more, LaunchOrigin.of([]))
    assert len(launches(RunStore(tmp_path).read_manifest())) == 2


def test_a_manifest_from_before_the_history_counts_as_its_one_launch(tmp_path):
    cfg = cpu_run(dir=str(tmp_path), name="old")
    write_manifest([to_jsonable(cfg)], make_plan(cfg), RunStore(tmp_path), "/model")
    manifest = RunStore(tmp_path).read_manifest()
    del manifest["launches"]
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    other = copy.deepcopy(cfg)
    other.model.max_model_len = 4096
    with pytest.raises(ConfigError, match="model.max_model_len: 2048 .dir. -> 4096"):
        launch_into(other, LaunchOrigin.of([]))
    launch_into(copy.deepcopy(cfg), LaunchOrigin.of([]))
    assert [launch["name"] for launch in launches(RunStore(tmp_path).read_manifest())] == [
        "old",
        "old",
    ]


def test_the_cli_refuses_another_experiment_with_exit_2_and_the_message_alone(tmp_path):
    run_dir = tmp_path / "run"
    cfg = compose_job(["+experiment=smoke", f"dir={run_dir}"])
    write_manifest([to_jsonable(cfg)], make_plan(cfg), RunStore(run_dir), "/model")
    out = pdbench(
        "+experiment=smoke", f"dir={run_dir}", "server.block_size=64", "launch.dry_run=true"
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.startswith("pdbench: 1 problem(s) in the config:\ndir=")
    assert "server.block_size: 32 (dir) -> 64 (this launch)" in out.stderr
    assert "Traceback" not in out.stderr


def test_a_launch_into_a_dir_another_launch_follows_is_refused_with_who_holds_it(tmp_path):
    run_dir = tmp_path / "run"
    held = RunStore(run_dir)
    assert held.claim() is None  # this process holds it now (as a launch following its jobs)
    assert held.claim() is None  # and a second job of its own sweep passes
    out = pdbench("+experiment=smoke", f"dir={run_dir}")  # another process: refused, exit 2
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.startswith(f"pdbench: 1 problem(s) in the config:\ndir={run_dir}: is in use")
    assert f"pid {os.getpid()} on " in out.stderr
    assert "or give this launch its own dir=" in out.stderr
    assert not (run_dir / "manifest.json").exists()  # nothing of the refused launch written


def corrupt_run(tmp_path):
    """A smoke run dir with one Point recorded ok and a manifest torn mid-write."""
    run_dir = tmp_path / "run"
    cfg = compose_job(["+experiment=smoke", f"dir={run_dir}"])
    plan = make_plan(cfg)
    store = RunStore(run_dir)
    origin = LaunchOrigin.of(["+experiment=smoke", f"dir={run_dir}"])
    write_manifest([to_jsonable(cfg)], plan, store, "/model", origin)
    point = plan.all_points()[0]
    store.write_point(PointResult(point.point_id, "ok", "", point.flow.value, {}, {}), [])
    text = store.manifest_path.read_text()
    store.manifest_path.write_text(text[: len(text) // 2])  # torn
    return run_dir, store, point


def test_status_of_a_corrupt_manifest_names_it_counts_the_points_and_gives_the_rerun(
    tmp_path, capsys
):
    run_dir, _, _ = corrupt_run(tmp_path)
    print_status(str(run_dir))
    out = capsys.readouterr().out
    assert out.startswith(f"run in {run_dir}: {run_dir}/manifest.json: corrupt record (")
    assert "  1 ok, 0 failed, 0 corrupt" in out
    assert f"Fix: rerun python -m pdbench +experiment=smoke dir={run_dir} with dir={run_dir}" in out


def test_the_rerun_of_a_corrupt_manifest_sets_it_aside_and_skips_what_is_ok(tmp_path):
    run_dir, store, point = corrupt_run(tmp_path)
    torn = store.manifest_path.read_text()
    dry = pdbench("+experiment=smoke", f"dir={run_dir}", "launch.dry_run=true")
    assert dry.returncode == 0, dry.stderr
    assert f"[pdbench] {run_dir}/manifest.json: corrupt record (" in dry.stdout
    assert "a launch sets it aside and starts a new history" in dry.stdout
    assert f"skip {point.point_id} (ok)" in dry.stdout
    assert store.manifest_path.read_text() == torn  # a dry run writes nothing
    cfg = compose_job(["+experiment=smoke", f"dir={run_dir}"])
    launch_into(cfg, LaunchOrigin.of(["+experiment=smoke"]))  # what the launch does
    (aside,) = run_dir.glob("manifest.corrupt-*.json")
    assert aside.read_text() == torn
    assert len(launches(store.read_manifest())) == 1  # a new history


def test_a_manifest_entry_missing_keys_is_shown_not_a_key_error(tmp_path, capsys, monkeypatch):
    # job 123's state is not this test's matter: no SLURM asked (its controller is not up in
    # the unit tier, and squeue waits for it)
    monkeypatch.setattr(status, "slurm_state", lambda job_id: "")
    cfg = cpu_run(dir=str(tmp_path))
    write_manifest([to_jsonable(cfg)], make_plan(cfg), RunStore(tmp_path), "/model")
    manifest = RunStore(tmp_path).read_manifest()
    manifest["jobs"] = [{"deployment_id": "x"}, {"job_id": "123"}]
    manifest["deployments"].append({"points": ["nope"]})
    manifest["launches"].append({"at": 0})
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    print_status(str(tmp_path))
    out = capsys.readouterr().out
    assert "job ? (x): unknown (the manifest's entry names no job id)" in out
    assert "job 123 (?): " in out and "deployment ?: 0 ok, 0 failed, 1 pending of 1" in out
    # an entry that is no job at all: the manifest is no manifest, said as a corrupt one
    manifest["jobs"].append("junk")
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    print_status(str(tmp_path))
    out = capsys.readouterr().out
    assert "corrupt record" in out and "sets the corrupt manifest aside" in out


def test_a_manifest_of_a_newer_pdbench_is_refused_by_name(tmp_path):
    """status and a relaunch name the version; neither reads it as its own."""
    cfg = cpu_run(dir=str(tmp_path))
    write_manifest([to_jsonable(cfg)], make_plan(cfg), RunStore(tmp_path), "/model")
    manifest = RunStore(tmp_path).read_manifest()
    assert manifest["schema_version"] == 1  # written with its version
    (tmp_path / "manifest.json").write_text(json.dumps({**manifest, "schema_version": 99}))
    with pytest.raises(SystemExit, match="schema_version 99; this pdbench reads up to 1"):
        print_status(str(tmp_path))
    with pytest.raises(ConfigError, match="holds a manifest this pdbench cannot read"):
        RunDir.open(cfg, make_plan(cfg), LaunchOrigin.of([]), claim=False)


def test_a_dry_run_into_a_dir_with_records_says_what_it_skips_first(tmp_path, capsys):
    """The skip/run summary comes before the plan (issue 27: a crossover dry run printed
    ~300 lines with it last); the per-Point list stays at the end."""
    from pdbench.driver.launch import launch

    cfg = cpu_run(dir=str(tmp_path), name="smoke")
    plan = make_plan(cfg)
    write_manifest([to_jsonable(cfg)], plan, RunStore(tmp_path), "/model")
    point = plan.all_points()[0]
    RunStore(tmp_path).write_point(PointResult(point.point_id, "ok", "", "agg", {}, {}), [])
    cfg.launch.dry_run = True
    launch(cfg, LaunchOrigin.of([]))
    out = capsys.readouterr().out
    total = len(plan.all_points())
    head = f"{tmp_path} holds records: 1 Point(s) recorded ok are skipped, {total - 1} run"
    assert out.startswith(head + " (each listed at the end)\n")
    assert out.index("run dir: ") < out.index(f"  skip {point.point_id} (ok)")
