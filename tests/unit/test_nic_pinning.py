"""Each TP rank on its own GPU's NIC (``transport.nics_by_gpu``): the mapping, what the launch
spec sets, what the plugin and the transfer preflight do with it, and the refusals."""

from __future__ import annotations

import os

import pytest

from connector.plugin import nic_pinning
from connector.process_env import NIC_BY_GPU_ENV, nic_for_device, nics_text
from jobs.preflight.transfer import device_env
from pdbench.plan.deployments import make_plan
from pdbench.spec.transfer_probe import transfer_probe
from pdbench.validate.rules import validate
from tests.unit.test_dry_run_golden import compose_run
from tests.unit.test_transport_conf import GPU, first_server_env

pytestmark = pytest.mark.unit

NICS = [f"mlx5_{i}:1" for i in range(8)]
PINNED = "transport.nics_by_gpu=[" + ",".join(NICS) + "]"


def test_a_rank_takes_the_nic_of_the_gpu_it_runs_on():
    by_gpu = nics_text(NICS)
    assert nic_for_device(by_gpu, "4,5", 1) == "mlx5_5:1"  # its 2nd visible device: GPU 5
    assert nic_for_device(by_gpu, None, 3) == "mlx5_3:1"  # no mask: the device is the GPU
    assert nic_for_device(by_gpu, "9", 0) == ""  # a GPU no entry names: UCX's choice
    assert nic_for_device("", "0", 0) == ""
    assert nic_for_device("a:1,b:1;c:1", "0", 0) == "a:1,b:1"  # an entry may list devices


def test_the_launch_spec_hands_the_map_to_every_gpu_server():
    env = first_server_env(["topology=2p2d_cross", "transport=rdma", PINNED])
    assert env[NIC_BY_GPU_ENV] == ";".join(NICS)
    assert "UCX_NET_DEVICES" not in env  # set per rank by the plugin, not per server
    plain = first_server_env(["topology=2p2d_cross", "transport=rdma"])
    assert NIC_BY_GPU_ENV not in plain


def test_the_plugin_pins_the_worker_before_its_agent_exists(monkeypatch):
    monkeypatch.setenv(NIC_BY_GPU_ENV, nics_text(NICS))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    # set through monkeypatch, so that what pin_nic writes is undone after the test: a
    # UCX_NET_DEVICES left in this process failed every later NIXL agent of the worker
    monkeypatch.setenv("UCX_NET_DEVICES", "as-before")
    assert nic_pinning.pin_nic(1) == "mlx5_3:1"
    assert os.environ["UCX_NET_DEVICES"] == "mlx5_3:1"
    assert nic_pinning.pin_nic(None) == ""  # a CPU build: nothing to pin


def test_pinning_leaves_no_nic_behind_for_later_agents():
    """What the test above set is gone (the NIXL agents later tests build in this process
    must find UCX's own choice)."""
    assert os.environ.get("UCX_NET_DEVICES") != "mlx5_3:1"


def test_the_transfer_preflight_reads_over_the_same_nics():
    cfg = compose_run([*GPU, "topology=1p1d_cross", "transport=rdma", PINNED])
    probe = transfer_probe(make_plan(cfg).deployments[0])
    assert probe.nics_by_gpu == tuple(NICS)
    owner = device_env(probe, "owner", "0,1,2,3,4,5,6,7")
    assert owner["UCX_NET_DEVICES"] == NICS[int(owner["CUDA_VISIBLE_DEVICES"])]


@pytest.mark.parametrize(
    ("overrides", "why"),
    [
        (["transport.nics_by_gpu=[mlx5_0:1]"], "names 1 NIC(s) for the 8 GPUs of a node"),
        ([PINNED, "transport.ucx_net_devices=mlx5_0:1"], "pins every rank to the same devices"),
    ],
)
def test_a_map_that_does_not_fit_the_node_is_refused(overrides, why):
    cfg = compose_run([*GPU, "topology=1p1d_cross", "transport=rdma", *overrides])
    problems = [str(p) for p in validate(cfg)]
    assert any(why in p for p in problems), problems


def test_a_map_on_a_cpu_cluster_is_refused():
    cfg = compose_run(["+experiment=smoke", "transport.nics_by_gpu=[mlx5_0:1]"])
    assert any("a cluster of none" in str(p) for p in validate(cfg))
