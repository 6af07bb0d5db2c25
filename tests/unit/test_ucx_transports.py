"""UCX_TLS parsing and the two transport listings (``ucx_info -d``, the bundled UCX's context)."""

from __future__ import annotations

import pytest

from connector.ucx import (
    connectable_am,
    expand,
    lacks_connectable_am,
    matching,
    parse_tls,
    parse_ucp_context_info,
    parse_ucx_info_devices,
    parse_ucx_version,
)
from tests.unit.fixture_text import fixture

pytestmark = pytest.mark.unit


def test_aliases_expand_to_transports():
    assert expand(["rc"]) == {"rc_verbs", "rc_mlx5"}
    assert expand(["sm", "tcp"]) == {"posix", "sysv", "xpmem", "cma", "knem", "tcp"}
    assert expand(["cuda_ipc"]) == {"cuda_ipc"}


def test_ucx_tls_selection():
    assert parse_tls("").allows("cuda_ipc") and parse_tls("all").allows("tcp")
    nvlink = parse_tls("cuda_ipc,cuda_copy,tcp")
    assert nvlink.allows("cuda_ipc") and nvlink.allows("tcp") and not nvlink.allows("rc_mlx5")
    no_ipc = parse_tls("^cuda_ipc")
    assert not no_ipc.allows("cuda_ipc") and no_ipc.allows("rc_mlx5")
    assert parse_tls("rc,ud:aux").allows("ud_mlx5")


@pytest.mark.parametrize(
    "spec, lacks",
    [
        ("cuda_ipc,cuda_copy", True),  # the old nvlink.yaml: no active messages at all
        ("cuda_ipc,cuda_copy,sm,self", True),  # AM, but no peer-failure handler
        ("cuda_ipc,cuda_copy,tcp", False),
        ("rc,cuda_copy,cuda_ipc", False),
        ("^tcp,rc,ud,dc,srd", True),  # ^: every AM transport with peer failure excluded
        ("", False),
    ],
)
def test_ucx_tls_needs_an_am_transport_with_peer_failure(spec, lacks):
    assert lacks_connectable_am(spec) is lacks


def test_ucx_info_devices_of_this_vm():
    text = fixture("ucx_info_d_cpu_vm_1.13.1.txt")
    resources = parse_ucx_info_devices(text)
    assert [r.name for r in resources] == [
        "self/memory0",
        "tcp/lo",
        "tcp/eth0",
        "sysv/memory",
        "posix/memory",
        "cma/memory",
    ]
    by_name = {r.name: r for r in resources}
    assert by_name["tcp/eth0"].am and by_name["tcp/eth0"].peer_failure
    assert by_name["posix/memory"].am and not by_name["posix/memory"].peer_failure
    assert not by_name["cma/memory"].am
    assert [r.name for r in connectable_am(resources)] == ["tcp/lo", "tcp/eth0"]
    assert parse_ucx_version(fixture("ucx_info_v_1.13.1.txt")) == "1.13.1"


def test_ucx_info_devices_of_a_gpu_node():
    resources = parse_ucx_info_devices(fixture("ucx_info_d_h100_ib_written.txt"))
    names = {r.name for r in resources}
    assert {"cuda_ipc/cuda", "cuda_copy/cuda", "rc_mlx5/mlx5_0:1", "dc_mlx5/mlx5_0:1"} <= names
    assert [r.name for r in matching(resources, ["rc"])] == [
        "rc_verbs/mlx5_0:1",
        "rc_mlx5/mlx5_0:1",
    ]
    ipc = next(r for r in resources if r.transport == "cuda_ipc")
    assert ipc.kind == "intra-node" and not ipc.am
    assert "cuda_ipc/cuda" not in {r.name for r in connectable_am(resources)}


def test_bundled_ucx_context_resources():
    resources = parse_ucp_context_info(fixture("ucp_context_nixl_1.23.0_cpu.txt"))
    assert [r.name for r in resources] == [
        "self/memory",
        "tcp/eth0",
        "tcp/lo",
        "sysv/memory",
        "posix/memory",
        "cma/memory",
    ]
    assert all(r.am is None for r in resources)  # the context lists no capabilities
    assert {r.name for r in connectable_am(resources)} == {"tcp/eth0", "tcp/lo"}
    assert [r.name for r in matching(resources, ["sm", "tcp"])][:2] == ["tcp/eth0", "tcp/lo"]
