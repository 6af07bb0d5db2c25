# ruff: noqa: E501 - UCX log lines are quoted as UCX prints them
import pytest

from pdbench.ucx_proto import slow_transport_flag, transports_by_operation

pytestmark = pytest.mark.unit

# Shaped as UCX 1.x prints with UCX_PROTO_INFO=y (timestamps, host:pid prefix, tables).
LOG = """\
(Worker pid=1) INFO starting
[1795381663.44] [vm:7908 :0]   +--------+-------------+-----------------------------------+
[1795381663.44] [vm:7908 :0]   | 7998cdcf-44d7 self cfg#0                                 |
[1795381663.44] [vm:7908 :0]   | remote memory write by ucp_put* from host memory to host |
[1795381663.44] [vm:7908 :0]   +--------+-------------+-----------------------------------+
[1795381663.44] [vm:7908 :0]   | 0..inf | zero-copy   | self/memory                       |
[1795381663.44] [vm:7908 :0]   +--------+-------------+-----------------------------------+
[1795381663.44] [vm:7908 :0]   | 7998cdcf-44d7 intra-node cfg#0                           |
[1795381663.44] [vm:7908 :0]   | remote memory write by ucp_put* from host memory to host |
[1795381663.44] [vm:7908 :0]   +--------+-------------+-----------------------------------+
[1795381663.44] [vm:7908 :0]   | Range  | Description |              Config               |
[1795381663.44] [vm:7908 :0]   +--------+-------------+-----------------------------------+
[1795381663.44] [vm:7908 :0]   | 0..inf | zero-copy   | cma/memory                        |
[1795381663.44] [vm:7908 :0]   +--------+-------------+-----------------------------------+
[1795381663.45] [vm:7908 :0]   +--------+-------------+-------------------------------------------+
[1795381663.45] [vm:7908 :0]   | 7998cdcf-44d7 inter-node cfg#1                                   |
[1795381663.45] [vm:7908 :0]   | remote memory read by ucp_get*(multi) into host memory from host |
[1795381663.45] [vm:7908 :0]   +--------+-------------+-------------------------------------------+
[1795381663.45] [vm:7908 :0]   | Range  | Description |                  Config                   |
[1795381663.45] [vm:7908 :0]   +--------+-------------+-------------------------------------------+
[1795381663.45] [vm:7908 :0]   |   0..8184 | short       | tcp/lo                                 |
[1795381663.45] [vm:7908 :0]   | 8185..inf | zero-copy   | 50% on rc_mlx5/mlx5_0:1, 50% on rc_mlx5/mlx5_1:1 |
(Worker pid=1) INFO done
"""


def test_reads_and_writes_are_told_apart():
    found = transports_by_operation(LOG)
    assert found["write"] == ["cma/memory"]
    assert found["read"] == ["rc_mlx5/mlx5_0:1", "rc_mlx5/mlx5_1:1", "tcp/lo"]


def test_flag_tcp_only_reads_of_gpu_memory():
    assert "tcp" in slow_transport_flag("cuda", ["tcp/eth0"])
    assert slow_transport_flag("cuda", ["tcp/eth0", "cuda_ipc/cuda"]) == ""
    assert slow_transport_flag("cpu", ["tcp/lo"]) == ""
    assert slow_transport_flag("cuda", []) == ""
