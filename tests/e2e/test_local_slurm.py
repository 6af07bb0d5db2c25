"""The real local SLURM cluster (scripts/local-slurm.sh): 2-node jobs through pdbench's executor.

Needs root (the script installs Debian's slurm and munge when missing, edits /etc/hosts and
runs the daemons). The session fixture starts the cluster and stops it afterwards if it was
not up before. Waits are bounded polls; nothing asserts on wall-clock durations.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from pdbench.config.schema import ClusterConfig, ExecutorKind, register_configs
from pdbench.driver.executors import SlurmJob, make_executor
from pdbench.spec.sbatch import sbatch_script

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "local-slurm.sh"
JOB_TIMEOUT_S = 300  # bound on waiting for a job; a healthy cluster needs seconds


def _script(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), *args], capture_output=True, text=True, check=check, timeout=900
    )


@pytest.fixture(scope="session")
def local_slurm() -> Iterator[str]:
    """Start the local cluster; yields its SLURM_CONF (also exported for submitit's calls)."""
    if os.geteuid() != 0:
        pytest.skip("the local SLURM cluster needs root (daemons, /etc/hosts, apt-get)")
    if shutil.which("slurmctld") is None and shutil.which("apt-get") is None:
        pytest.skip("SLURM is not installed and there is no apt-get to install it")
    was_up = _script("status", check=False).returncode == 0
    started = _script("start", check=False)
    if started.returncode != 0:
        pytest.fail(f"scripts/local-slurm.sh start failed:\n{started.stdout}\n{started.stderr}")
    conf = _script("env").stdout.strip().removeprefix("export SLURM_CONF=")
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = conf
    yield conf
    if previous is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = previous
    if not was_up:
        _script("stop", check=False)


def slurm_preset() -> ClusterConfig:
    """conf/cluster/slurm.yaml composed by Hydra (the cluster group alone)."""
    register_configs()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
            cfg = compose(overrides=["+cluster=slurm"])
    finally:
        GlobalHydra.instance().clear()
    cluster = OmegaConf.to_object(cfg.cluster)
    assert isinstance(cluster, ClusterConfig)
    return cluster


def wait_done(job, timeout_s: float = JOB_TIMEOUT_S) -> None:
    """Until SLURM says the job ended, asked every 0.5 s as the driver asks (pdbench's
    ``SlurmJob.done(force_check=True)``: submitit's reads a once-a-minute cache for a 2-node
    job)."""
    deadline = time.monotonic() + timeout_s
    while not job.done(force_check=True):
        if time.monotonic() > deadline:
            pytest.fail(f"job {job.job_id} not done after {timeout_s}s (state {job.state})")
        time.sleep(0.5)


def wait_state(job, wanted: str, timeout_s: float = JOB_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while (state := job.get_info(mode="force").get("State", "")) != wanted:
        if time.monotonic() > deadline:
            pytest.fail(f"job {job.job_id} not {wanted} after {timeout_s}s (state {state})")
        time.sleep(0.5)


@pytest.mark.e2e
@pytest.mark.slurm
def test_two_node_job_runs_one_task_per_node(local_slurm: str, tmp_path: Path) -> None:
    cluster = slurm_preset()
    assert cluster.executor is ExecutorKind.slurm

    def probe() -> tuple[int, str, str]:
        import os

        from jobs.slurm_env import TaskEnvironment

        task = TaskEnvironment.from_environ()
        return task.global_rank, os.environ.get("SLURMD_NODENAME", ""), task.address

    folder = tmp_path / "submitit"
    executor = make_executor(cluster, folder, nodes=2, job_name="pdbench-probe")
    job = executor.submit(probe)
    # What was submitted is what a dry run prints.
    submitted = job.paths.submission_file.read_text()
    assert submitted == sbatch_script(cluster, 2, "pdbench-probe", folder.absolute())
    wait_done(job)
    results = sorted(job.results())
    assert [(rank, node) for rank, node, _ in results] == [(0, "node1"), (1, "node2")]
    addresses = [address for _, _, address in results]
    assert addresses == [socket.gethostbyname("node1"), socket.gethostbyname("node2")]
    assert len(set(addresses)) == 2
    assert "127.0.0.1" not in addresses
    wait_state(job, "COMPLETED")  # the results exist before SLURM ends the job


@pytest.mark.e2e
@pytest.mark.slurm
def test_cancelled_job_is_seen_without_sacct(local_slurm: str, tmp_path: Path) -> None:
    assert subprocess.run(["sacct"], capture_output=True).returncode != 0, "expected no sacct"
    cluster = slurm_preset()
    executor = make_executor(cluster, tmp_path / "submitit", nodes=2, job_name="pdbench-sleep")
    job = executor.submit(time.sleep, 3600)
    wait_state(job, "RUNNING")
    subprocess.run(["scancel", job.job_id], check=True, timeout=60)
    wait_done(job)
    assert job.state == "CANCELLED"
    assert SlurmJob.watcher.source == "squeue"


@pytest.mark.e2e
@pytest.mark.slurm
def test_array_job_elements_are_pdbench_jobs(local_slurm: str, tmp_path: Path) -> None:
    cluster = slurm_preset()

    def where(index: int) -> tuple[int, str]:
        import os

        return index, os.environ.get("SLURMD_NODENAME", "")

    executor = make_executor(cluster, tmp_path / "submitit", nodes=1, job_name="pdbench-array")
    jobs = executor.map_array(where, [0, 1])
    assert all(isinstance(job, SlurmJob) for job in jobs)
    for job in jobs:
        wait_done(job)
    results = sorted(job.result() for job in jobs)
    assert [index for index, _ in results] == [0, 1]
    assert {node for _, node in results} <= {"node1", "node2"}
    for job in jobs:
        wait_state(job, "COMPLETED")


@pytest.mark.e2e
def test_local_executor_runs_two_ranked_tasks(tmp_path: Path) -> None:
    """The same probe on LocalExecutor: two tasks on this machine, ranks 0 and 1."""
    cluster = ClusterConfig(executor=ExecutorKind.local, time_limit_min=5)

    def probe() -> tuple[int, int, str, str]:
        from jobs.slurm_env import TaskEnvironment

        task = TaskEnvironment.from_environ()
        return task.global_rank, task.num_tasks, task.executor, task.address

    executor = make_executor(cluster, tmp_path / "submitit", nodes=2, job_name="pdbench-probe")
    job = executor.submit(probe)
    wait_done(job)
    results = sorted(job.results())
    assert [result[:3] for result in results] == [(0, 2, "local"), (1, 2, "local")]
    assert results[0][3] == results[1][3]  # one machine, one address


@pytest.mark.e2e
@pytest.mark.slurm
def test_start_after_daemons_died_mid_job_leaves_idle_nodes(
    local_slurm: str, tmp_path: Path
) -> None:
    """A cluster whose daemons died under a running job (a reboot, a VM restored from a
    snapshot) starts again with idle nodes, not nodes held "alloc" by the dead job."""
    cluster = slurm_preset()
    executor = make_executor(cluster, tmp_path / "submitit", nodes=2, job_name="pdbench-orphan")
    job = executor.submit(time.sleep, 3600)
    wait_state(job, "RUNNING")
    state_dir = Path(local_slurm).parent
    for daemon in ("slurmd-node1", "slurmd-node2", "slurmctld"):
        pid = int((state_dir / "run" / f"{daemon}.pid").read_text())
        os.kill(pid, 9)
        deadline = time.monotonic() + 30
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
    started = _script("start", check=False)
    assert started.returncode == 0, started.stderr
    nodes = _script("status").stdout
    assert "node1 pdbench* idle" in nodes and "node2 pdbench* idle" in nodes, nodes
    # The dead job's tasks are not left running either.
    folder = str(tmp_path / "submitit")
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while folder in _ps() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert folder not in _ps()


@pytest.mark.e2e
@pytest.mark.slurm
def test_the_written_slurm_conf_keeps_the_scripts_comments_as_written(local_slurm: str) -> None:
    """The conf is an unquoted here-document (its ``$VARS`` expand): a backquote in one of
    its comments ran as a command at every start (bash printed a syntax error, and the
    comment lost its words). Every comment line without a ``$`` reaches the file as written."""
    script = SCRIPT.read_text()
    body = script.split('cat >"$tmp" <<EOF\n', 1)[1].split("\nEOF\n", 1)[0]
    comments = [x for x in body.splitlines() if x.startswith("#") and "$" not in x]
    assert len(comments) > 5, comments
    written = Path(local_slurm).read_text()
    assert [x for x in comments if x not in written] == []


def _ps() -> str:
    return subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout


@pytest.mark.e2e
@pytest.mark.slurm
def test_a_partition_slurm_does_not_have_is_refused_by_check_and_launch(
    local_slurm: str, tmp_path: Path
) -> None:
    from tests.e2e.conftest import run_pdbench

    args = ["+experiment=smoke", "cluster=slurm", "cluster.partition=nope", f"dir={tmp_path}/r"]
    for command in (["check", *args], args):
        out = run_pdbench(command, timeout_s=120)
        assert out.returncode == 2, out.stdout + out.stderr
        assert "cluster.partition=nope: is not a partition of this SLURM cluster (sinfo lists " in (
            out.stderr
        )
        assert "Traceback" not in out.stderr
    assert not (tmp_path / "r").exists()  # refused before anything was written


@pytest.mark.e2e
@pytest.mark.slurm
def test_a_relaunch_into_a_dir_whose_detached_job_still_runs_is_refused(
    local_slurm: str, tmp_path: Path
) -> None:
    from tests.e2e.conftest import NO_PREFLIGHT, run_pdbench

    run = tmp_path / "r"
    ports = [  # its own: the servers start on the local cluster while other tests run
        "server.base_port=18100",
        "server.side_channel_base_port=18600",
        "server.router_port=18000",
        "server.vllm_base_port=29000",
    ]
    args = ["+experiment=smoke", "cluster=slurm", NO_PREFLIGHT, f"dir={run}", *ports]
    first = run_pdbench([*args, "launch.detach=true"], timeout_s=300)
    assert first.returncode == 0, first.stdout + first.stderr
    job_ids = [str(j["job_id"]) for j in json.loads((run / "manifest.json").read_text())["jobs"]]
    try:
        again = run_pdbench(args, timeout_s=300)
        assert again.returncode == 2, again.stdout + again.stderr
        assert "has SLURM jobs of an earlier launch still alive: job " in again.stderr
        assert "Traceback" not in again.stderr
    finally:
        subprocess.run(["scancel", *job_ids], check=False)
