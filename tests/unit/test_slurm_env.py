"""TaskEnvironment and node-list parsing: pure, the environment patched per test."""

from __future__ import annotations

import os
import socket
from unittest import mock

import pytest

from jobs import slurm_env
from jobs.slurm_env import TaskEnvironment, expand_nodelist

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("nodelist", "expected"),
    [
        ("node1", ["node1"]),
        ("node[1-2]", ["node1", "node2"]),
        ("node[1-2],gpu-[01-03,07]", ["node1", "node2", "gpu-01", "gpu-02", "gpu-03", "gpu-07"]),
        ("a,b,c", ["a", "b", "c"]),
        ("n[08-10]", ["n08", "n09", "n10"]),
        ("rack[1-2]-n[1,3]", ["rack1-n1", "rack1-n3", "rack2-n1", "rack2-n3"]),
        ("gpu[001-002].cluster.org", ["gpu001.cluster.org", "gpu002.cluster.org"]),
        ("x[7]", ["x7"]),
        ("", []),
    ],
)
def test_expand_nodelist(nodelist: str, expected: list[str]) -> None:
    assert expand_nodelist(nodelist) == expected


@pytest.mark.parametrize("bad", ["node[1-2", "node1-2]", "n[[1]]", "n[a-b]", "n[3-1]", "n[1-]"])
def test_expand_nodelist_rejects_malformed(bad: str) -> None:
    with pytest.raises(ValueError, match="node list"):
        expand_nodelist(bad)


SLURM_TASK_1 = {
    "SLURM_JOB_ID": "42",
    "SLURM_PROCID": "1",
    "SLURM_LOCALID": "0",
    "SLURM_NTASKS": "2",
    "SLURM_NODEID": "1",
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_JOB_NODELIST": "node[1-2]",
    "SLURMD_NODENAME": "node2",
}


def test_plain_slurm_task_without_submitit() -> None:
    with mock.patch.dict(os.environ, SLURM_TASK_1, clear=True):
        env = TaskEnvironment.from_environ()
    assert env.executor == "slurm"
    assert (env.job_id, env.global_rank, env.num_tasks) == ("42", 1, 2)
    assert (env.node_rank, env.num_nodes, env.local_rank) == (1, 2, 0)
    assert env.node_name == "node2"
    assert env.node_names == ("node1", "node2")
    assert not env.is_rank_zero


def test_submitit_slurm_task_uses_job_environment() -> None:
    variables = dict(SLURM_TASK_1, SUBMITIT_EXECUTOR="slurm", SUBMITIT_FOLDER="/RUN/submitit")
    facts = slurm_env._submitit_facts
    with (
        mock.patch.dict(os.environ, variables, clear=True),
        mock.patch("jobs.slurm_env._submitit_facts", wraps=facts) as spy,
    ):
        env = TaskEnvironment.from_environ()
    spy.assert_called_once_with()
    with mock.patch.dict(os.environ, variables, clear=True):
        assert facts() is not None  # submitit's JobEnvironment answered
    assert (env.executor, env.job_id, env.global_rank, env.num_tasks) == ("slurm", "42", 1, 2)
    assert env.node_names == ("node1", "node2")


def test_array_element_job_id() -> None:
    variables = dict(SLURM_TASK_1, SLURM_ARRAY_JOB_ID="40", SLURM_ARRAY_TASK_ID="2")
    with mock.patch.dict(os.environ, variables, clear=True):
        assert TaskEnvironment.from_environ().job_id == "40_2"
    with mock.patch.dict(os.environ, dict(variables, SUBMITIT_EXECUTOR="slurm"), clear=True):
        assert TaskEnvironment.from_environ().job_id == "40_2"


def test_local_executor_task() -> None:
    variables = {
        "SUBMITIT_EXECUTOR": "local",
        "SUBMITIT_LOCAL_JOB_ID": "1234",
        "SUBMITIT_LOCAL_NTASKS": "2",
        "SUBMITIT_LOCAL_GLOBALID": "1",
        "SUBMITIT_LOCAL_LOCALID": "1",
        "SUBMITIT_LOCAL_NODEID": "0",
        "SUBMITIT_LOCAL_JOB_NUM_NODES": "1",
    }
    with mock.patch.dict(os.environ, variables, clear=True):
        from_os = TaskEnvironment.from_environ()
    from_mapping = TaskEnvironment.from_environ(variables)
    for env in (from_os, from_mapping):
        assert (env.executor, env.job_id, env.global_rank, env.num_tasks) == ("local", "1234", 1, 2)
        assert env.node_name == socket.gethostname()
        assert env.node_names == (socket.gethostname(),)


def test_debug_executor_is_one_task() -> None:
    with mock.patch.dict(os.environ, {"SUBMITIT_DEBUG_JOB_ID": "DEBUG_1"}, clear=True):
        env = TaskEnvironment.from_environ()
    assert (env.executor, env.job_id, env.global_rank, env.num_tasks) == ("debug", "DEBUG_1", 0, 1)


def test_plain_process_is_rank_zero_of_one() -> None:
    with mock.patch.dict(os.environ, {}, clear=True):
        env = TaskEnvironment.from_environ()
    assert env.executor == "none"
    assert (env.global_rank, env.num_tasks, env.num_nodes) == (0, 1, 1)
    assert env.is_rank_zero


def _fake_hosts(table: dict[str, str]):
    def resolve(name: str) -> str:
        if name not in table:
            raise socket.gaierror(f"unknown host {name}")
        return table[name]

    return mock.patch("jobs.slurm_env.resolve_address", side_effect=resolve)


def test_address_is_the_node_names_address() -> None:
    with mock.patch.dict(os.environ, SLURM_TASK_1, clear=True):
        env = TaskEnvironment.from_environ()
    with _fake_hosts({"node1": "10.0.0.1", "node2": "10.0.0.2"}):
        assert env.address == "10.0.0.2"
        assert env.addresses == {"node1": "10.0.0.1", "node2": "10.0.0.2"}


def test_unresolvable_slurm_node_is_an_error() -> None:
    with mock.patch.dict(os.environ, SLURM_TASK_1, clear=True):
        env = TaskEnvironment.from_environ()
    with _fake_hosts({}), pytest.raises(OSError, match="node2"):
        _ = env.address


def test_off_slurm_address_falls_back_to_hostname_then_loopback() -> None:
    with mock.patch.dict(os.environ, {}, clear=True):
        env = TaskEnvironment.from_environ()
    env = TaskEnvironment(**{**env.__dict__, "node_name": "nowhere", "hostname": "myhost"})
    with _fake_hosts({"myhost": "192.168.1.5"}):
        assert env.address == "192.168.1.5"
    with _fake_hosts({}):
        assert env.address == "127.0.0.1"


# A Debian host: its own name maps to 127.0.1.1 in /etc/hosts.
IFACES = {"lo": ["127.0.0.1"], "eth0": ["10.1.0.7"], "ib0": ["192.168.50.7"]}


def test_routable_resolution_is_kept() -> None:
    choice = slurm_env.choose_node_address("gpu7", "10.1.0.7", True, IFACES, "eth0")
    assert choice.address == "10.1.0.7" and choice.how == "gpu7 resolves to it"


def test_loopback_on_a_multi_node_job_takes_the_default_routes_interface() -> None:
    choice = slurm_env.choose_node_address("gpu7", "127.0.1.1", True, IFACES, "eth0")
    assert choice.address == "10.1.0.7"
    assert "loopback 127.0.1.1" in choice.how and "eth0" in choice.how


def test_loopback_with_one_other_address_takes_it() -> None:
    ifaces = {"lo": ["127.0.0.1"], "ib0": ["192.168.50.7"]}
    choice = slurm_env.choose_node_address("gpu7", "127.0.1.1", True, ifaces, None)
    assert choice.address == "192.168.50.7"


def test_loopback_with_no_way_to_choose_fails_with_one_line() -> None:
    with pytest.raises(slurm_env.NodeAddressError) as err:
        slurm_env.choose_node_address("gpu7", "127.0.1.1", True, IFACES, None)
    line = str(err.value)
    assert "\n" not in line
    assert "gpu7 resolves to 127.0.1.1, a loopback address" in line
    assert "10.1.0.7 (eth0), 192.168.50.7 (ib0)" in line
    assert "Fix: map gpu7 to its network address in /etc/hosts" in line
    assert "PDBENCH_NODE_INTERFACE" in line


def test_an_interface_named_in_the_environment_wins() -> None:
    choice = slurm_env.choose_node_address(
        "gpu7", "10.1.0.7", True, IFACES, "eth0", interface="ib0"
    )
    assert choice.address == "192.168.50.7"
    with pytest.raises(slurm_env.NodeAddressError, match="no IPv4 address on ib1"):
        slurm_env.choose_node_address("gpu7", "10.1.0.7", True, IFACES, "eth0", interface="ib1")


def test_loopback_nodes_only_when_allowed_or_alone() -> None:
    # The local test cluster: node1/node2 are 127.0.10.x aliases of one host, allowed on purpose.
    allowed = slurm_env.choose_node_address(
        "node2", "127.0.10.2", True, IFACES, "eth0", allow_loopback=True
    )
    assert allowed.address == "127.0.10.2" and "PDBENCH_LOOPBACK_NODES=1" in allowed.how
    alone = slurm_env.choose_node_address("node2", "127.0.10.2", False, IFACES, None)
    assert alone.address == "127.0.10.2"


def test_task_environment_applies_the_choice() -> None:
    variables = dict(SLURM_TASK_1)
    with mock.patch.dict(os.environ, variables, clear=True):
        env = TaskEnvironment.from_environ()
    with (
        _fake_hosts({"node2": "127.0.1.1"}),
        mock.patch("jobs.slurm_env.interface_addresses", return_value=IFACES),
        mock.patch("jobs.slurm_env.default_route_interface", return_value="eth0"),
    ):
        assert env.address == "10.1.0.7"
    variables[slurm_env.LOOPBACK_NODES_ENV] = "1"
    with mock.patch.dict(os.environ, variables, clear=True):
        env = TaskEnvironment.from_environ()
    with _fake_hosts({"node2": "127.0.10.2"}):
        assert env.address == "127.0.10.2"


def test_default_route_from_proc_net_route() -> None:
    table = (
        "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\n"
        "eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\n"
        "eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\n"
    )
    assert slurm_env.parse_default_route(table) == "eth0"
    assert slurm_env.parse_default_route(table.splitlines()[0]) is None
