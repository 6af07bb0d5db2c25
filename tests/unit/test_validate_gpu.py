"""GPU and transport validation rules (pdbench/validate/gpu.py): field, value, message, fix."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

from pdbench.config.schema import ExecutorKind, KvBufferDevice, Placement
from pdbench.spec.containers import srun_args
from pdbench.validate.gpu import check_model_reachable
from pdbench.validate.kv_path import same_node_path
from pdbench.validate.rules import validate
from tests.unit.helpers import cpu_run, gpu_run
from tests.unit.test_validate import only, problems_for

pytestmark = pytest.mark.unit


def test_ucx_tls_without_an_active_message_transport_is_rejected():
    cfg = gpu_run()
    cfg.transport.kv_buffer_device = KvBufferDevice.cuda
    cfg.transport.ucx_tls = "cuda_ipc,cuda_copy"
    problem = only(cfg, "transport.ucx_tls", "cuda_ipc,cuda_copy", "active messages", "NIXL #1413")
    assert "cuda_ipc,cuda_copy,tcp" in problem.fix
    cfg.transport.ucx_tls = "cuda_ipc,cuda_copy,tcp"
    assert problems_for(cfg, "transport.ucx_tls") == []


def test_expected_transport_must_be_allowed_by_ucx_tls():
    cfg = gpu_run()
    cfg.transport.ucx_tls = "tcp"
    cfg.transport.expected_ucx_transports = ["cuda_ipc"]
    only(
        cfg, "transport.expected_ucx_transports", ["cuda_ipc"], "excluded by transport.ucx_tls=tcp"
    )
    cfg.transport.ucx_tls = ""
    assert validate(cfg) == []


def nvlink(cfg):
    cfg.transport.name = "nvlink"
    cfg.transport.kv_buffer_device = KvBufferDevice.cuda
    cfg.transport.ucx_tls = "cuda_ipc,cuda_copy,tcp"
    cfg.transport.expected_ucx_transports = ["cuda_ipc"]
    return cfg


def test_nvlink_across_nodes_is_rejected():
    cfg = nvlink(gpu_run(p=2, d=2, placement=Placement.cross_node, nodes=2))
    problem = only(cfg, "transport", "nvlink", "only inside a node", "node(s) [0]", "[1]")
    assert "transport=rdma" in problem.fix
    assert validate(nvlink(gpu_run(p_tp=2, d_tp=4))) == []  # same node: fine


def test_nvlink_rejected_when_same_node_instances_spill_over():
    # 2 x TP4 prefill + 2 x TP4 decode = 16 GPUs: decode spills onto node 1.
    cfg = nvlink(gpu_run(p_tp=4, d_tp=4, p=2, d=2, nodes=2))
    only(cfg, "transport", "nvlink", "decode on node(s) [1]")


def test_cross_node_transports_may_cross():
    cfg = gpu_run(p=2, d=2, placement=Placement.cross_node, nodes=2)
    cfg.transport.expected_ucx_transports = ["rc"]
    assert problems_for(cfg, "transport") == []


def llama70b(cfg, tp):
    cfg.model = replace(
        cfg.model,
        name="llama3_70b",
        num_layers=80,
        hidden_size=8192,
        num_attention_heads=64,
        intermediate_size=28672,
    )
    cfg.topology.prefill.tp = cfg.topology.decode.tp = tp
    cfg.cluster.gpu_memory_gib = 79.6
    return cfg


def test_70b_does_not_fit_at_tp1_or_tp2_on_80gb_gpus():
    problems = problems_for(llama70b(gpu_run(), 1), "topology.prefill.tp")
    assert len(problems) == 1
    line = str(problems[0])
    for words in ("131.4 GiB of weights", "40.0 GiB of KV", "131072-token", "67.7 GiB"):
        assert words in line, line
    assert "tp >= 4" in problems[0].fix
    # One line per TP size: prefill and decode share it here.
    two = only(llama70b(gpu_run(), 2), "topology.prefill.tp", 2, "65.7 GiB of weights")
    assert "tp >= 4" in two.fix and "max_model_len" not in two.fix  # weights alone too big


def test_70b_fits_at_tp4_and_a_long_context_is_the_fix_when_weights_fit():
    assert validate(llama70b(gpu_run(p_tp=4, d_tp=4), 4)) == []
    cfg = llama70b(gpu_run(p_tp=4, d_tp=4), 4)
    cfg.server.gpu_memory_utilization = 0.5  # 39.8 GiB: weights fit, 128K-token KV not
    problem = only(cfg, "topology.prefill.tp", 4, "10.0 GiB of KV")
    assert "model.max_model_len <= " in problem.fix and "tp >= 8" in problem.fix


def test_weights_fit_is_skipped_when_gpu_memory_is_unknown():
    cfg = llama70b(gpu_run(), 1)
    cfg.cluster.gpu_memory_gib = 0
    assert problems_for(cfg, "topology.prefill.tp") == []


def hub_run(**env):
    cfg = gpu_run()
    cfg.model.path = "meta-llama/Llama-3.1-8B-Instruct"
    cfg.cluster.env = dict(env)
    return cfg


def test_hub_id_offline_without_a_cache_that_holds_it_is_rejected(tmp_path):
    environ = {"HOME": str(tmp_path)}
    cfg = hub_run(HF_HUB_OFFLINE="1")
    problems = check_model_reachable(cfg, environ)
    assert len(problems) == 1
    line = str(problems[0])
    assert line.startswith("model.path=meta-llama/Llama-3.1-8B-Instruct: is a hub id")
    assert "models--meta-llama--Llama-3.1-8B-Instruct" in line and "no HF_HOME set" in line
    assert "cluster.env.HF_HOME" in problems[0].fix
    # Online: vLLM downloads it; nothing to check from here.
    assert check_model_reachable(hub_run(), environ) == []


def test_hub_id_offline_found_in_a_shared_hf_home(tmp_path):
    home = tmp_path / "hf"
    cfg = hub_run(HF_HUB_OFFLINE="1", HF_HOME=str(home))
    assert len(check_model_reachable(cfg, {})) == 0  # HF_HOME not visible here: preflight's job
    (home / "hub").mkdir(parents=True)
    assert len(check_model_reachable(cfg, {})) == 1  # visible and empty: rejected
    snapshot = home / "hub" / "models--meta-llama--Llama-3.1-8B-Instruct" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    assert check_model_reachable(cfg, {}) == []


def container_run(**fields):
    cfg = gpu_run()
    cfg.cluster.container_image = "/lustre/images/pdbench-gpu.sqsh"
    cfg.cluster.container_mounts = ["/lustre/me:/lustre/me", "/models:/models:ro+rprivate"]
    cfg.cluster.python = "python3"
    cfg.cluster.container_has_pdbench = True
    for key, value in fields.items():
        setattr(cfg.cluster, key, value)
    return cfg


def test_a_well_formed_container_config_passes_and_becomes_srun_options():
    cfg = container_run(container_workdir="/lustre/me", srun_args=["--mpi=none"])
    cfg.dir = "/lustre/me/runs/r"  # under a mount at its own path
    cfg.cluster.env = {"UCX_TLS": "rc", "HF_HUB_OFFLINE": "1"}
    assert validate(cfg) == []
    assert srun_args(cfg.cluster) == [
        "--container-image=/lustre/images/pdbench-gpu.sqsh",
        "--container-mounts=/lustre/me:/lustre/me,/models:/models:ro+rprivate",
        "--container-workdir=/lustre/me",
        # the image's entrypoint (vLLM's: vllm serve) would take the task's command
        "--no-container-entrypoint",
        "--no-container-mount-home",  # ~/.local packages would shadow the image's
        "--container-env=HF_HUB_OFFLINE,UCX_TLS",  # the host's values win over the image's
        "--mpi=none",
    ]
    cfg.cluster.container_mount_home = True
    assert "--no-container-mount-home" not in srun_args(cfg.cluster)
    assert srun_args(gpu_run().cluster) == []


def test_container_mounts_must_be_src_dst_flags():
    cfg = container_run(container_mounts=["/a:/b,/c:/d"])
    only(cfg, "cluster.container_mounts", "/a:/b,/c:/d", "SRC:DST[:FLAGS]", "list items")
    only(
        container_run(container_mounts=["models:/models"]),
        "cluster.container_mounts",
        "models:/models",
    )


def test_containers_need_slurm_and_an_interpreter_the_image_has():
    cfg = container_run()
    cfg.cluster.executor = ExecutorKind.local
    only(cfg, "cluster.container_image", cfg.cluster.container_image, "srun option", "local")
    problem = only(container_run(python=""), "cluster.python", "''", "does not have")
    assert "cluster.container_has_pdbench=true cluster.python=python3" in problem.fix
    venv = str(Path(sys.executable).parent.parent)
    mounted = container_run(python="", container_mounts=[f"{venv}:{venv}"])
    assert problems_for(mounted, "cluster.python") == []


def test_mounts_without_an_image_and_reserved_srun_options():
    cfg = gpu_run()
    cfg.cluster.container_mounts = ["/a:/a"]
    only(cfg, "cluster.container_mounts", ["/a:/a"], "no effect without cluster.container_image")
    cfg = gpu_run()
    cfg.cluster.srun_args = ["--cpus-per-task=4", "--container-image=x", "mpi=none"]
    found = [str(p) for p in problems_for(cfg, "cluster.srun_args")]
    assert len(found) == 3, found
    assert "Fix: use cluster.cpus_per_task" in found[0]
    assert "Fix: use cluster.container_image" in found[1]
    assert "is not an option" in found[2]


def test_a_slurm_model_dir_missing_from_the_shared_filesystem_is_rejected(tmp_path):
    shared = tmp_path / "lustre"
    (shared / "models").mkdir(parents=True)
    cfg = gpu_run()  # SLURM
    cfg.dir = str(shared / "runs" / "r1")
    cfg.model.path = str(shared / "models" / "Llama-3.1-8B-Instruct")
    line = str(only(cfg, "model.path", cfg.model.path, "does not exist", "every node shares"))
    assert f"ls {shared / 'models'}" in line
    (shared / "models" / "Llama-3.1-8B-Instruct").mkdir()
    assert problems_for(cfg, "model.path") == []
    cfg.model.path = "/nonexistent-mount/models/x"  # not visible here: the preflight's job
    assert problems_for(cfg, "model.path") == []


def rdma(cfg, ucx_tls="rc,cuda_copy,cuda_ipc"):
    cfg.transport.name = "rdma"
    cfg.transport.ucx_tls = ucx_tls
    cfg.transport.expected_ucx_transports = ["rc"]
    return cfg


def test_rdma_with_p_and_d_on_one_node_is_refused_with_the_cross_node_fix():
    # UCX moves KV between two processes of one node over cuda_ipc when UCX_TLS allows it:
    # the run would report NVLink as "rdma".
    cfg = rdma(gpu_run())
    cfg.topology.name = "1p1d"
    problem = only(cfg, "transport", "rdma", "puts P and D on one node", "over cuda_ipc")
    assert "call it rdma" in problem.message
    assert problem.fix.startswith("topology=1p1d_cross and cluster.nodes=2 to measure rdma")
    assert "transport=nvlink" in problem.fix
    cfg.topology.name, cfg.topology.placement, cfg.cluster.nodes = "x", Placement.cross_node, 2
    assert validate(cfg) == []


def test_rdma_on_one_node_passes_when_ucx_tls_leaves_it_no_node_local_path():
    # UCX_TLS=rc,tcp: rc (HCA loopback) is what carries the KV, as the config says.
    assert validate(rdma(gpu_run(), ucx_tls="rc,tcp")) == []


def test_rdma_refused_for_a_same_node_topology_names_the_placement_override():
    cfg = rdma(gpu_run(p=2, d=2, nodes=2))
    cfg.topology.name = "2p2d"
    problem = only(cfg, "transport", "rdma", "P node 0 -> D node 0")
    assert problem.fix.startswith("topology.placement=cross_node to measure rdma")


def test_tcp_on_one_host_is_what_carries_the_kv():
    cfg = cpu_run()
    cfg.transport.name, cfg.transport.ucx_tls = "tcp", "tcp"
    cfg.transport.expected_ucx_transports = ["tcp"]
    assert problems_for(cfg, "transport") == []
    cfg.transport.ucx_tls = ""  # UCX's choice: shared memory on one host
    only(cfg, "transport", "tcp", "over cma", "transport=dram")


def test_same_node_path_per_memory_kind():
    assert same_node_path("cuda", "rc,cuda_copy,cuda_ipc") == "cuda_ipc"
    assert same_node_path("cuda", "rc,cuda_copy") == ""
    assert same_node_path("cpu", "") == "cma"
    assert same_node_path("cpu", "^cma,knem,xpmem") == "posix"
    assert same_node_path("cpu", "tcp") == ""


def test_an_image_not_known_to_hold_pdbench_is_refused_with_the_recipe():
    # nvcr.io's PyTorch image has no submitit, pdbench, vLLM 0.32.0 or NIXL: the task's
    # "python -u -m submitit.core._submit" would fail on every node.
    cfg = container_run(container_image="nvcr.io#nvidia/pytorch:25.01-py3", python="python")
    cfg.cluster.container_has_pdbench = False
    problem = only(cfg, "cluster.python", "python", "an image not built for pdbench")
    assert "containers/pdbench-gpu.Dockerfile" in problem.fix
    assert "cluster.container_has_pdbench=true" in problem.fix
    # the driver's venv mounted at its own path: its python is there
    venv = str(Path(sys.executable).parent.parent)
    cfg.cluster.container_mounts = [f"{venv}:{venv}"]
    cfg.cluster.python = sys.executable
    assert problems_for(cfg, "cluster.python") == []


def test_a_setup_line_activating_a_venv_outside_the_container_is_refused():
    cfg = container_run(setup=["module load cuda", "source $HOME/pdbench/.venv/bin/activate"])
    problem = only(cfg, "cluster.setup", "source $HOME/pdbench/.venv/bin/activate", "host")
    assert "never reaches the tasks" in problem.message
    for line in (". /x/bin/activate", "conda activate pd", "module load x && source a/activate"):
        cfg.cluster.setup = [line]
        assert len(problems_for(cfg, "cluster.setup")) == 1, line
    cfg.cluster.container_image = ""
    cfg.cluster.container_mounts = []
    cfg.cluster.container_has_pdbench = False
    assert problems_for(cfg, "cluster.setup") == []  # no container: setup is the task's shell


def test_container_has_pdbench_without_an_image_has_no_effect():
    cfg = gpu_run()
    cfg.cluster.container_has_pdbench = True
    only(cfg, "cluster.container_has_pdbench", True, "no effect without cluster.container_image")


def test_an_unquoted_enroot_uri_gets_the_quoting_fix():
    from pdbench.config.overrides import OverrideError, check_overrides

    with pytest.raises(OverrideError) as err:
        check_overrides(["cluster.container_image=nvcr.io#nvidia/pytorch:25.01-py3"])
    assert "LexerNoViableAltException" in str(err.value)
    fix = "'cluster.container_image=\"nvcr.io#nvidia/pytorch:25.01-py3\"'"
    assert fix in str(err.value)
    quoted = check_overrides(["cluster.container_image='nvcr.io#nvidia/pytorch:25.01-py3'"])
    assert quoted[0].value() == "nvcr.io#nvidia/pytorch:25.01-py3"


def test_what_a_task_reads_in_the_container_must_be_mounted_at_its_own_path():
    """The run dir (a task unpickles its job there first), a model directory and HF_HOME:
    each unmounted one is refused with the mount that brings it."""
    cfg = container_run()
    cfg.dir = "/scratch/me/runs/r"
    cfg.model.path = "/data/models/Llama-3.1-8B-Instruct"
    cfg.cluster.env = {"HF_HOME": "/home/me/.cache/huggingface"}
    problems = {
        p.field: p for p in validate(cfg) if p.field in ("dir", "model.path", "cluster.env.HF_HOME")
    }
    assert set(problems) == {"dir", "model.path", "cluster.env.HF_HOME"}, validate(cfg)
    assert "'/scratch/me:/scratch/me'" in problems["dir"].fix
    assert "'/data/models:/data/models'" in problems["model.path"].fix
    cfg.cluster.container_mounts += ["/scratch/me:/scratch/me", "/data:/data", "/home/me:/home/me"]
    assert [p for p in validate(cfg) if p.field in problems] == []
    cfg.cluster.container_mounts = ["/scratch/me:/mnt/run"]  # mounted, at another path
    assert "dir" in {p.field for p in validate(cfg)}


def requeue_refusals(cfg) -> list[str]:
    return [str(p) for p in validate(cfg) if "cannot requeue itself" in str(p)]


def test_a_containerized_run_that_needs_requeues_is_refused_with_a_limit_that_fits():
    """Inside an image without scontrol a job cannot requeue itself (pyxis #129): a run
    needing several attempts would stop at its first time limit, so it is refused before
    submission; the time limit it names holds the job in one attempt."""
    cfg = container_run()
    cfg.cluster.gpu_tflops = 989.0  # an estimate of a Point's time
    cfg.cluster.time_limit_min = 15
    cfg.workload.history_tokens = [0, 32_000, 64_000, 120_000]
    cfg.workload.repetitions = 10
    (refused,) = requeue_refusals(cfg)
    assert "attempts of 15 min" in refused and "cluster.container_has_slurm=true" in refused
    limit = int(refused.split("cluster.time_limit_min=")[1].split(" ")[0])
    cfg.cluster.time_limit_min = limit
    assert requeue_refusals(cfg) == []  # the fix it names works
    cfg.cluster.time_limit_min = 15
    cfg.cluster.container_has_slurm = True  # the image can requeue: nothing to refuse
    assert requeue_refusals(cfg) == []
