"""A Point's flags from its servers' logs: the transports that carried KV against those the
transport config expects, and KV loads vLLM recomputed or failed (its own log lines)."""

# ruff: noqa: E501 - log lines are quoted as UCX and vLLM print them
from __future__ import annotations

import pytest

from connector.ucx import unexpected_path
from connector.ucx_proto import transports_in_log
from jobs.run import flags
from jobs.serving.server_log import LogWindow, expired_unread_leases, failed_loads, recomputed_loads
from pdbench.plan.deployments import make_plan
from pdbench.spec.launch import build_launch
from records.point import TransferTotals
from tests.unit.helpers import cpu_run

pytestmark = pytest.mark.unit


def read_table(transport: str) -> str:
    """One UCX_PROTO_INFO table of a remote read (NIXL READ) over ``transport``."""
    return f"""\
[1795381663.45] [vm:7908 :0]   | 7998cdcf-44d7 inter-node cfg#1                                   |
[1795381663.45] [vm:7908 :0]   | remote memory read by ucp_get*(multi) into host memory from host |
[1795381663.45] [vm:7908 :0]   +--------+-------------+-------------------------------------------+
[1795381663.45] [vm:7908 :0]   | Range  | Description |                  Config                   |
[1795381663.45] [vm:7908 :0]   +--------+-------------+-------------------------------------------+
[1795381663.45] [vm:7908 :0]   | 0..inf | zero-copy   | {transport}                               |
"""


RECOVERED = "(EngineCore pid=9) WARNING 11-23 10:00:01 [scheduler.py:3427] Recovered from KV load failure: 2 request(s) rescheduled (64 tokens affected).\n"
FAILING = "(EngineCore pid=9) ERROR 11-23 10:00:01 [scheduler.py:3418] Failing 1 request(s) due to KV load failure (failure_policy=fail, 32 tokens affected). Request IDs: {'cmpl-x-0-abc'}\n"


def test_kv_that_moved_over_no_expected_transport():
    assert unexpected_path(["tcp/eth0"], ["rc"])
    assert unexpected_path(["cuda_copy/cuda", "cma/memory"], ["cuda_ipc"])  # host-staged
    assert not unexpected_path(["rc_mlx5/mlx5_0:1", "tcp/eth0"], ["rc"])
    assert not unexpected_path(["cma/memory"], ["sm", "tcp"])  # dram on one host
    assert not unexpected_path([], ["rc"])  # nothing moved: nothing to judge
    assert not unexpected_path(["tcp/eth0"], [])  # no expectation


def test_vllm_says_when_it_recomputed_or_failed_a_kv_load(tmp_path):
    assert recomputed_loads(RECOVERED * 2) == 4 and failed_loads(RECOVERED) == 0
    assert failed_loads(FAILING) == 1 and recomputed_loads("INFO nothing\n") == 0
    log = tmp_path / "decode0.log"
    log.write_text("before the point\n" + RECOVERED)
    window = LogWindow([str(log), str(tmp_path / "missing.log")])
    with log.open("a") as f:
        f.write(FAILING)
    assert window.read() == {str(log): FAILING, str(tmp_path / "missing.log"): ""}


def pd_instances(tmp_path, expected: list[str]):
    """The P and D instances of a CPU run's launch spec, and its transport config."""
    cfg = cpu_run(dir=str(tmp_path))
    cfg.transport.expected_ucx_transports = expected
    plan = make_plan(cfg)
    spec = build_launch(cfg, plan, "/m").deployments[0]
    return spec.instances, plan.deployments[0].transport


def test_a_point_is_flagged_when_the_expected_transport_did_not_carry_kv(tmp_path):
    instances, transport = pd_instances(tmp_path, ["cuda_ipc"])
    prefill, decode = instances
    used = {}
    for inst, carried in ((prefill, "cma/memory"), (decode, "cuda_ipc/cuda")):
        log = tmp_path / f"{inst.name}.log"
        log.write_text(read_table(carried))
        used[inst.name] = transports_in_log(log)
    assert used["prefill0"]["read"] == ["cma/memory"]
    (flag,) = flags.transport_flags(instances, used, transport)
    assert flag.startswith(
        "prefill0: KV moved over ['cma/memory'], none of the transports dram expects (cuda_ipc;"
    )
    # What the dram config expects on one host: shared memory (cma); no flag.
    instances, transport = pd_instances(tmp_path / "dram", ["sm", "tcp"])
    assert flags.transport_flags(instances, {"prefill0": used["prefill0"]}, transport) == []


def test_tcp_that_ucx_tls_does_not_name_is_a_fallback_flag(tmp_path):
    instances, transport = pd_instances(tmp_path, [])
    used = {i.name: {"read": ["tcp/eth0"], "write": []} for i in instances}
    fallback = flags.transport_flags(instances, used, transport)
    assert len(fallback) == 2 and "TCP, though UCX_TLS=" in fallback[0]
    for inst in instances:
        inst.env["UCX_TLS"] = "tcp"  # asked for on purpose: not a fallback
    assert flags.transport_flags(instances, used, transport) == []


def test_a_recomputed_fallback_is_always_a_flag():
    recomputed, failed = flags.kv_load_flags(RECOVERED + FAILING)
    assert recomputed.startswith("2 request(s) recomputed KV that failed to load")
    assert "kv_load_failure_policy=recompute" in recomputed
    assert failed.startswith("1 request(s) failed because their KV did not load")
    assert flags.kv_load_flags("INFO all fine\n") == []


def test_failed_transfers_late_reads_and_a_slow_link_are_flagged(tmp_path):
    _, transport = pd_instances(tmp_path, [])
    assert flags.transfer_flags(TransferTotals(), "recompute", transport) == []
    failed, late = flags.transfer_flags(
        TransferTotals(failed=2, read_after_expiry=1), "fail", transport
    )
    assert failed.startswith("2 KV transfer(s) failed") and "failed their requests" in failed
    assert late.startswith("1 KV read(s) arrived after the owner's lease had expired")
    transport.expected_gb_s = 10.0
    (slow,) = flags.transfer_flags(TransferTotals(bytes=1e9, seconds=10.0), "fail", transport)
    assert slow.startswith("KV moved at 0.10 GB/s, under 10% of the 10 GB/s")
    assert flags.transfer_flags(TransferTotals(bytes=1e9, seconds=0.5), "fail", transport) == []


def test_turns_without_d_params_and_expired_leases_are_flagged():
    assert flags.handoff_flags({}) == [] and flags.handoff_flags({"missing_params": 0}) == []
    (missing,) = flags.handoff_flags({"missing_params": 3})
    assert missing.startswith("3 turn(s) got no KV params from D")
    line = (
        "Releasing expired KV blocks for request cmpl-pdb-p1-t2-0123-p-0-1a which were "
        "retrieved by 0 remote worker(s) before lease expired."
    )
    (stalled,) = flags.lease_flags([line, line], "p1")
    assert stalled.startswith("2 prefill request(s) of this point had their KV lease expire")
    assert flags.lease_flags([line], "p2") == []


def test_expired_unread_leases_count_only_this_points_requests():
    line = (
        "(Worker pid=1) WARNING [base_worker.py:3032] Releasing expired KV blocks for request "
        "cmpl-pdb-{tag}-t2-0123456789ab-p-0-1a2b3c4d which were retrieved by {n} remote "
        "worker(s) before lease expired."
    )
    text = "\n".join(
        [line.format(tag="p1", n=0), line.format(tag="p1", n=1), line.format(tag="p2", n=0)]
    )
    assert expired_unread_leases(text, "p1") == 1


def test_turns_recomputed_because_ds_lease_ran_out_flag_the_point():
    assert flags.expired_lease_flags({}, 15) == []
    assert flags.expired_lease_flags({"expired_leases": 0}, 15) == []
    (expired,) = flags.expired_lease_flags({"expired_leases": 4, "paths": {"pull": 8}}, 15)
    assert expired.startswith("4 turn(s) were recomputed, not pulled")
    assert "flow.decoder_kv_blocks_ttl_s=15" in expired and "recompute_expired" in expired
