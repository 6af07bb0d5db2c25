"""What the shipped transport configs put in a server's environment (conf/transport/*.yaml)."""

from __future__ import annotations

import pytest

from connector.ucx import lacks_connectable_am
from pdbench.plan.deployments import make_plan
from pdbench.spec.serve_command import serve_env
from pdbench.validate.rules import validate
from tests.unit.test_dry_run_golden import LLAMA_8B, compose_run

pytestmark = pytest.mark.unit

GPU = [
    "+experiment=smoke",
    "cluster=h100_8gpu",
    "cluster.nodes=2",
    "dir=/R",
    "cache_dir=/C",
    *LLAMA_8B,
]


def first_server_env(overrides: list[str]) -> dict[str, str]:
    cfg = compose_run(GPU + overrides)
    assert validate(cfg) == [], [str(p) for p in validate(cfg)]
    dep = make_plan(cfg).deployments[0]
    return serve_env(dep, dep.instances[0], "<node0>", "", "/RUN/traces")


def test_nvlink_ucx_tls_carries_active_messages():
    env = first_server_env(["topology=1p1d", "transport=nvlink"])
    assert env["UCX_TLS"] == "cuda_ipc,cuda_copy,tcp"
    assert not lacks_connectable_am(env["UCX_TLS"])


def test_rdma_leaves_the_nic_choice_per_gpu_to_ucx():
    env = first_server_env(["topology=2p2d_cross", "transport=rdma"])
    assert "UCX_NET_DEVICES" not in env  # was mlx5_0:1 for every instance
    assert env["UCX_TLS"] == "rc,cuda_copy,cuda_ipc"
    pinned = first_server_env(
        ["topology=2p2d_cross", "transport=rdma", "transport.ucx_net_devices=mlx5_3:1"]
    )
    assert pinned["UCX_NET_DEVICES"] == "mlx5_3:1"


@pytest.mark.parametrize("name", ["dram", "tcp", "nvlink", "rdma"])
def test_every_transport_expects_a_transport_its_ucx_tls_allows(name):
    cfg = compose_run(GPU + ["topology=1p1d", f"transport={name}"])
    assert cfg.transport.expected_ucx_transports
    fields = {p.field for p in validate(cfg)}
    assert not fields & {"transport.ucx_tls", "transport.expected_ucx_transports"}
