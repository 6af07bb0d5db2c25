"""The deployment job's checkpoint pickles while its servers run (submitit's own USR2 path),
and carries only what a restart needs."""

from __future__ import annotations

import pickle
import signal
import sys

import pytest
from submitit.core.job_environment import _checkpoint
from submitit.helpers import DelayedSubmission

from jobs.entry.deployment import DeploymentJob
from jobs.run.state import JobInterrupted
from jobs.run.task import DeploymentTask
from jobs.serving.server import ServerProcess
from pdbench.plan.deployments import make_plan
from pdbench.results.jsonable import to_jsonable
from pdbench.spec.launch import build_launch
from tests.unit.helpers import cpu_run

pytestmark = pytest.mark.unit

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


@pytest.fixture
def sigterm_restored():
    previous = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, previous)


@pytest.fixture
def running_job(tmp_path):
    """A DeploymentJob as it is mid-run: two real server processes started and held."""
    cfg = cpu_run(dir=str(tmp_path))
    plan = make_plan(cfg)
    dep = plan.deployments[0]
    spec = build_launch(cfg, plan, "/model").deployment(dep.deployment_id)
    job = DeploymentJob(dep, plan.points[dep.deployment_id], spec, cfg.tracking, to_jsonable(cfg))
    procs = [
        ServerProcess(name, SLEEPER, {}, tmp_path / f"{name}.log", "http://127.0.0.1:9/health")
        for name in ("prefill0", "decode0")
    ]
    for proc in procs:
        proc.start()
    # What __call__ holds once the servers are up.
    job.running = DeploymentTask(job.deployment, job.points, spec, job.tracking, job.run_config)
    job.running.task.procs = list(procs)
    job.running.task.ran, job.running.task.job_id = spec, "4242"
    try:
        yield job, procs
    finally:
        for proc in procs:
            proc.stop()


def test_the_job_holding_live_servers_cannot_be_pickled_itself(running_job):
    job, _ = running_job
    with pytest.raises(TypeError, match="cannot pickle"):
        pickle.dumps(job)


def test_checkpoint_at_usr2_pickles_what_a_restart_needs_and_leaves_servers_to_teardown(
    running_job, tmp_path, sigterm_restored
):
    job, procs = running_job
    path = tmp_path / "submitted.pkl"
    # What submitit's USR2 handler does on task 0 before it requeues and exits.
    assert _checkpoint(DelayedSubmission(job), path, countdown=2) == ""
    restarted = DelayedSubmission.load(path)
    again = restarted.function
    assert isinstance(again, DeploymentJob) and again is not job
    assert [p.point_id for p in again.points] == [p.point_id for p in job.points]
    assert again.spec == job.spec and again.deployment.deployment_id == job.deployment.deployment_id
    assert again.running is None  # no live process, no leaving: the restart measures
    assert restarted._timeout_countdown == 2
    assert all(proc.alive() for proc in procs)  # the teardown stops them, not the checkpoint
    # The requeue's SIGTERM must not cut that teardown short, and the Point in progress
    # (its SystemExit possibly swallowed by an event loop callback) is not recorded.
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    with pytest.raises(JobInterrupted, match="the Point in progress is not recorded"):
        job.running.task.check_leaving()


def test_sigterm_leaves_as_a_system_exit_once_and_again_where_it_was_swallowed(
    running_job, sigterm_restored
):
    job, _ = running_job
    task = job.running.task
    task.check_leaving()  # nothing said yet: goes on
    signal.signal(signal.SIGTERM, task.on_sigterm)
    with pytest.raises(JobInterrupted) as info:
        task.on_sigterm(signal.SIGTERM, None)
    assert isinstance(info.value, SystemExit) and not isinstance(info.value, Exception)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN  # a second one waits
    with pytest.raises(JobInterrupted, match="signal 15: the Point in progress is not recorded"):
        task.check_leaving()


def test_an_attempt_cut_by_its_time_limit_with_no_point_recorded_is_not_requeued(
    running_job, tmp_path, sigterm_restored, capfd
):
    """Requeueing an attempt that recorded nothing before its time limit would only repeat
    it (issue 23): checkpoint returns None, submitit ends the chain, the log says why."""
    import time

    from jobs.entry.deployment import point_records

    job, _ = running_job
    limit_s = 60 * job.run_config["cluster"]["time_limit_min"]
    points = tmp_path / "points"
    points.mkdir(exist_ok=True)
    job.started = (time.time() - limit_s, point_records(tmp_path))  # ran to its limit
    assert job.recorded_nothing_by_its_time_limit()
    assert _checkpoint(DelayedSubmission(job), tmp_path / "s.pkl", countdown=2) == (
        "checkpoint function returned None"
    )
    assert "this attempt recorded no Point: the job is not requeued" in capfd.readouterr().out
    (points / "p1.json").write_text("{}")  # a Point recorded: requeued as before
    assert not job.recorded_nothing_by_its_time_limit()
    job.started = (time.time(), point_records(tmp_path))  # early: a preemption notice
    assert not job.recorded_nothing_by_its_time_limit()
