# ruff: noqa: E501 - UCX log lines are quoted as UCX prints them
from pathlib import Path

import pytest

from connector.ucx_proto import tcp_fallback, transports_in_log

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


def test_reads_and_writes_are_told_apart(tmp_path):
    log = tmp_path / "decode0.log"
    log.write_text(LOG)
    found = transports_in_log(log)
    assert found["write"] == ["cma/memory"]
    assert found["read"] == ["rc_mlx5/mlx5_0:1", "rc_mlx5/mlx5_1:1", "tcp/lo"]


def test_tcp_that_ucx_tls_does_not_name_is_a_fallback():
    # One rule for serving and the transfer bench (connector/bench_record.py's tcp_data_path).
    assert tcp_fallback(["tcp/eth0"], "")
    assert tcp_fallback(["tcp/eth0", "cuda_ipc/cuda"], "cuda_ipc,cuda_copy")  # part of it
    assert not tcp_fallback(["tcp/lo"], "tcp")  # asked for on purpose
    assert not tcp_fallback(["cma/memory"], "")
    assert not tcp_fallback([], "")
    assert transports_in_log(Path("/nonexistent/decode0.log")) == {"read": [], "write": []}


def test_tcp_is_a_fallback_unless_ucx_tls_names_it_for_data():
    tcp = ["tcp/eth0"]
    assert not tcp_fallback(tcp, "TCP,cuda_copy") and not tcp_fallback(tcp, " tcp ")
    assert tcp_fallback(tcp, "^cuda_ipc")  # all but cuda_ipc: TCP allowed, not asked for
    assert tcp_fallback(tcp, "rc,tcp:aux")  # TCP named for wire-up only
    assert tcp_fallback(tcp, "") and not tcp_fallback(["rc_mlx5/mlx5_0:1"], "")
