"""ClusterConfig -> submitit executor keywords, and the sacct/squeue job-state watcher."""

from __future__ import annotations

from pathlib import Path
from unittest import mock

import pytest
import submitit

from pdbench.config.schema import ClusterConfig, ExecutorKind
from pdbench.driver import executors
from pdbench.driver.executors import (
    PURGED,
    SlurmExecutor,
    SlurmJob,
    SlurmStateWatcher,
    make_executor,
)
from pdbench.plan import attempt
from pdbench.spec import sbatch
from pdbench.spec.sbatch import env_exports, executor_parameters

pytestmark = pytest.mark.unit


def slurm_cluster(**overrides) -> ClusterConfig:
    base = dict(name="test", executor=ExecutorKind.slurm, partition="p", time_limit_min=30)
    return ClusterConfig(**{**base, **overrides})


def test_minimal_slurm_parameters() -> None:
    params = executor_parameters(slurm_cluster(), nodes=2, job_name="dep-1")
    assert params == {
        "job_name": "dep-1",
        "time": 30,
        "nodes": 2,
        "ntasks_per_node": 1,
        "signal_delay_s": attempt.SIGNAL_DELAY_S,
        "array_parallelism": 4,
        "partition": "p",
        "wckey": None,  # submitit's "submitit" would be rejected where wckeys are enforced
        # requeueable whatever the site's JobRequeue (submitit's requeue at the time limit)
        "additional_parameters": {"requeue": True},
    }


def test_every_cluster_field_maps_to_slurm() -> None:
    cluster = slurm_cluster(
        gpus_per_node=8,
        cpus_per_task=32,
        mem_gb=500,
        account="acct",
        qos="high",
        constraint="h100",
        exclusive=True,
        array_parallelism=3,
        additional_parameters={"gres-flags": "enforce-binding"},
        setup=["module load cuda"],
        env={"NCCL_IB_HCA": "mlx5", "ODD": "a b"},
    )
    params = executor_parameters(cluster, nodes=1, job_name="j")
    assert params["gpus_per_node"] == 8
    assert params["cpus_per_task"] == 32
    assert params["srun_args"] == ["--cpus-per-task=32"]
    assert params["mem"] == "500GB"
    assert (params["account"], params["qos"], params["constraint"]) == ("acct", "high", "h100")
    assert params["exclusive"] is True
    assert params["array_parallelism"] == 3
    assert params["additional_parameters"] == {"requeue": True, "gres-flags": "enforce-binding"}
    assert params["setup"] == [
        "module load cuda",
        "export NCCL_IB_HCA=mlx5",
        "export ODD='a b'",
    ]


def test_cpus_per_node_is_the_task_width_when_cpus_per_task_is_unset() -> None:
    params = executor_parameters(slurm_cluster(cpus_per_node=16), nodes=1, job_name="j")
    assert params["cpus_per_task"] == 16
    assert "cpus_per_task" not in executor_parameters(slurm_cluster(), nodes=1, job_name="j")


def test_slurm_parameters_are_valid_for_submitit() -> None:
    """SlurmExecutor rejects unknown keywords: every key must be one of its parameters."""
    cluster = slurm_cluster(
        gpus_per_node=1,
        cpus_per_task=2,
        mem_gb=1,
        exclusive=True,
        setup=["true"],
        env={"A": "1"},
        additional_parameters={"x": 1},
    )
    params = executor_parameters(cluster, nodes=2, job_name="j")
    valid = set(submitit.SlurmExecutor._valid_parameters())
    assert set(params) <= valid


def test_local_parameters_run_one_task_per_plan_node() -> None:
    cluster = ClusterConfig(executor=ExecutorKind.local, time_limit_min=10, env={"X": "1"})
    params = executor_parameters(cluster, nodes=3, job_name="j")
    assert params["tasks_per_node"] == 3
    assert params["timeout_min"] == 10
    assert params["setup"] == ["export X=1"]
    assert "nodes" not in params  # LocalExecutor accepts one node only


def test_local_tasks_see_no_gpu_unless_the_cluster_asks_for_some() -> None:
    """submitit's local controller hides every GPU from a job that asks for none: a local
    run on a GPU machine must ask for ``cluster.gpus_per_node`` of them (the first device
    run's transfer bench found "No CUDA GPUs are available" in its tasks)."""
    cpu = executor_parameters(ClusterConfig(executor=ExecutorKind.local), nodes=2, job_name="j")
    assert "gpus_per_node" not in cpu
    gpu = ClusterConfig(executor=ExecutorKind.local, gpus_per_node=2)
    assert executor_parameters(gpu, nodes=2, job_name="j")["gpus_per_node"] == 2
    picked = executor_parameters(gpu, nodes=2, job_name="j", visible_gpus=(3, 5, 6))
    assert picked["visible_gpus"] == (3, 5, 6)
    with pytest.raises(ValueError, match="gpus_per_node=2 but CUDA_VISIBLE_DEVICES names 1"):
        executor_parameters(gpu, nodes=1, job_name="j", visible_gpus=(4,))


@pytest.mark.parametrize(
    ("value", "indices"),
    [("", ()), ("0", (0,)), ("2, 3", (2, 3)), ("GPU-90de326f", ()), ("0,GPU-1", ())],
)
def test_visible_gpus_reads_indices_only(value: str, indices: tuple[int, ...]) -> None:
    assert executors.visible_gpus({"CUDA_VISIBLE_DEVICES": value}) == indices
    assert executors.visible_gpus({}) == ()


def _visible_devices() -> str:
    import os

    return os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>")


def test_a_local_job_gets_the_gpus_its_cluster_names(tmp_path: Path, monkeypatch) -> None:
    """A real local job (no GPU needed: the variable is what the controller hands on)."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,2")
    for gpus, expected in ((2, "1,2"), (0, "")):
        cluster = ClusterConfig(executor=ExecutorKind.local, gpus_per_node=gpus, time_limit_min=2)
        executor = make_executor(cluster, tmp_path / f"sub{gpus}", nodes=1, job_name="j")
        assert executor.submit(_visible_devices).result() == expected


@pytest.mark.parametrize(("limit_min", "delay_s"), [(30, 120), (4, 120), (3, 90), (1, 30)])
def test_signal_comes_before_the_limit_even_for_short_jobs(limit_min: int, delay_s: int) -> None:
    for cluster in (
        slurm_cluster(time_limit_min=limit_min),
        ClusterConfig(time_limit_min=limit_min),
    ):
        params = executor_parameters(cluster, nodes=1, job_name="j")
        assert params["signal_delay_s"] == delay_s


def test_a_configured_signal_delay_is_what_sbatch_gets() -> None:
    cluster = slurm_cluster(time_limit_min=2)
    cluster.signal_delay_s = 100
    assert executor_parameters(cluster, nodes=1, job_name="j")["signal_delay_s"] == 100
    text = sbatch.sbatch_script(cluster, nodes=1, job_name="j", folder="/F")
    assert "#SBATCH --signal=USR2@100" in text


def test_zero_nodes_is_rejected() -> None:
    with pytest.raises(ValueError, match="at least one node"):
        executor_parameters(slurm_cluster(), nodes=0, job_name="j")


@pytest.mark.parametrize("name", ["1X", "A-B", "A B", ""])
def test_env_names_are_checked(name: str) -> None:
    with pytest.raises(ValueError, match="environment variable name"):
        env_exports({name: "1"})


def test_make_executor_local(tmp_path: Path) -> None:
    cluster = ClusterConfig(executor=ExecutorKind.local, time_limit_min=7)
    executor = make_executor(cluster, tmp_path / "sub", nodes=2, job_name="j")
    assert isinstance(executor, submitit.LocalExecutor)
    assert executor.parameters["tasks_per_node"] == 2
    assert executor.parameters["timeout_min"] == 7


def test_make_executor_debug(tmp_path: Path) -> None:
    cluster = ClusterConfig(executor=ExecutorKind.debug)
    executor = make_executor(cluster, tmp_path / "sub", nodes=1, job_name="j")
    assert isinstance(executor, submitit.DebugExecutor)


def test_make_executor_slurm(tmp_path: Path) -> None:
    cluster = slurm_cluster(cpus_per_task=2, python="/opt/venv/bin/python")
    with mock.patch.object(SlurmExecutor, "affinity", return_value=2):  # no srun needed
        executor = make_executor(cluster, tmp_path / "sub", nodes=2, job_name="j")
    assert isinstance(executor, SlurmExecutor)
    assert executor.job_class is SlurmJob
    assert executor.python == "/opt/venv/bin/python"
    assert executor.parameters == executor_parameters(cluster, nodes=2, job_name="j")


# --- job state without accounting -------------------------------------------------------

SQUEUE_OUTPUT = b"""12|RUNNING|node[1-2]
13|CANCELLED|node1
14_[2-3%2]|PENDING|
14_1|COMPLETED|node2
"""


def squeue_watcher(*registered: str) -> SlurmStateWatcher:
    watcher = SlurmStateWatcher(delay_s=60)
    watcher.source = "squeue"
    for job_id in registered:
        watcher.register_job(job_id)
    return watcher


def test_squeue_output_is_read_like_sacct() -> None:
    info = squeue_watcher("12", "13", "14_1", "14_3").read_info(SQUEUE_OUTPUT)
    assert info["12"]["State"] == "RUNNING"
    assert info["13"]["State"] == "CANCELLED"
    assert info["14_1"]["State"] == "COMPLETED"
    assert info["14_3"]["State"] == "PENDING"
    assert info["12"]["NodeList"] == "node[1-2]"


def test_watched_job_missing_from_squeue_is_purged_and_done() -> None:
    watcher = squeue_watcher("12", "99")
    info = watcher.read_info(SQUEUE_OUTPUT)
    assert info["99"]["State"] == PURGED
    watcher._info_dict.update(info)
    assert watcher.is_done("99", mode="cache")
    assert not watcher.is_done("12", mode="cache")


def test_sacct_is_used_when_it_works() -> None:
    watcher = SlurmStateWatcher()
    watcher.register_job("5")
    with mock.patch.object(executors, "_succeeds", return_value=True):
        command = watcher._make_command()
    assert command is not None and command[0] == "sacct"
    assert watcher.source == "sacct"


def test_squeue_is_used_when_sacct_fails() -> None:
    watcher = SlurmStateWatcher()
    watcher.register_job("5")
    with mock.patch.object(executors, "_succeeds", return_value=False):
        command = watcher._make_command()
    assert command is not None and command[0] == "squeue"
    assert "--states=all" in command
    with mock.patch.object(executors, "_succeeds") as probe:
        watcher._make_command()
    probe.assert_not_called()  # probed once per watcher


def test_state_source_from_environment() -> None:
    with mock.patch.dict("os.environ", {executors.STATE_SOURCE_ENV: "squeue"}):
        watcher = SlurmStateWatcher()
    watcher.register_job("5")
    with mock.patch.object(executors, "_succeeds") as probe:
        assert watcher._make_command()[0] == "squeue"
    probe.assert_not_called()


def test_nothing_to_poll_without_unfinished_jobs() -> None:
    with mock.patch.object(executors, "_succeeds") as probe:
        assert SlurmStateWatcher()._make_command() is None
    probe.assert_not_called()


def test_sbatch_has_no_wckey_unless_the_cluster_names_one() -> None:
    text = sbatch.sbatch_script(slurm_cluster(), 1, "j", "/RUN/submitit")
    assert "wckey" not in text
    text = sbatch.sbatch_script(slurm_cluster(wckey="proj-7"), 1, "j", "/RUN/submitit")
    assert "#SBATCH --wckey=proj-7" in text


def test_sbatch_says_open_mode_append_once() -> None:
    text = sbatch.sbatch_script(slurm_cluster(), 1, "j", "/RUN/submitit")
    assert text.count("--open-mode=append") == 1  # a requeued job appends to its logs


def test_whole_nodes_give_the_task_every_core_slurm_allocates() -> None:
    for cluster in (slurm_cluster(exclusive=True), slurm_cluster(gpus_per_node=8)):
        params = executor_parameters(cluster, nodes=2, job_name="j")
        assert "cpus_per_task" not in params
        assert params["setup"][-1] == "export SRUN_CPUS_PER_TASK=${SLURM_CPUS_ON_NODE}"
    shared = executor_parameters(slurm_cluster(), nodes=1, job_name="j")
    assert "setup" not in shared  # a shared CPU node: SLURM's default, nothing forced
    capped = executor_parameters(slurm_cluster(gpus_per_node=8, cpus_per_task=64), 1, "j")
    assert capped["cpus_per_task"] == 64 and "setup" not in capped


def test_requeues_allowed_follow_the_points_of_the_job(tmp_path) -> None:
    """submitit's default of 3 requeues stopped long sweeps part-way (issue 23): a job may
    be requeued once per Point it measures (an attempt recording none ends the chain), or
    as often as cluster.max_requeues says."""
    assert executors.max_requeues(slurm_cluster(), 40) == 40
    assert executors.max_requeues(slurm_cluster(), 0) == executors.SUBMITIT_MAX_REQUEUES
    assert executors.max_requeues(slurm_cluster(max_requeues=5), 40) == 5
    cluster = ClusterConfig(executor=ExecutorKind.local, time_limit_min=7)
    executor = make_executor(cluster, tmp_path / "sub", nodes=1, job_name="j", points=12)
    assert executor.max_num_timeout == 12


def test_a_searching_job_may_need_a_requeue_per_point_of_its_search() -> None:
    from pdbench.config.compose import compose_job
    from pdbench.plan.attempt import job_points
    from pdbench.plan.deployments import make_plan

    plan = make_plan(compose_job(["+experiment=crossover"]))  # no lengths given: searches
    dep = plan.deployments[0].deployment_id
    search = plan.searches[dep]
    assert job_points(plan, dep) == max(len(plan.points[dep]), search.settings.max_points)
    smoke = make_plan(compose_job(["+experiment=smoke"]))
    dep = smoke.deployments[0].deployment_id
    assert job_points(smoke, dep) == len(smoke.points[dep])


def test_sinfo_partitions_and_the_default_are_read():
    from pdbench.driver.slurm_partitions import partitions

    assert partitions("pdbench*\ngpu\ngpu\ndebug\n") == (["pdbench", "gpu", "debug"], "pdbench")
    assert partitions("") == ([], "")
