"""A Point's flags from its servers' logs: the transports that carried KV against those the
transport config expects, and KV loads vLLM recomputed or failed (its own log lines)."""

# ruff: noqa: E501 - log lines are quoted as UCX and vLLM print them
from __future__ import annotations

import pytest

from jobs.deployment import DeploymentJob
from jobs.serving.server_log import LogWindow, expired_unread_leases, failed_loads, recomputed_loads
from pdbench.config.schema import TrackingConfig
from pdbench.plan.deployments import make_plan
from pdbench.results.store import PointResult, PointStatus
from pdbench.spec.launch import build_launch
from pdbench.spec.ucx import unexpected_path
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


def job_on(tmp_path, expected: list[str]) -> DeploymentJob:
    cfg = cpu_run(dir=str(tmp_path))
    cfg.transport.expected_ucx_transports = expected
    plan = make_plan(cfg)
    dep = plan.deployments[0]
    spec = build_launch(cfg, plan, "/m").deployments[0]
    job = DeploymentJob(dep, plan.points[dep.deployment_id], spec, TrackingConfig(), {})
    job._ran = spec
    return job


def fresh_result() -> PointResult:
    return PointResult("p1", PointStatus.ok, "", "pull", {}, {})


def test_a_point_is_flagged_when_the_expected_transport_did_not_carry_kv(tmp_path):
    job = job_on(tmp_path, ["cuda_ipc"])
    prefill, decode = job._ran.instances
    for inst, transport in ((prefill, "cma/memory"), (decode, "cuda_ipc/cuda")):
        path = tmp_path / inst.log_path.removeprefix(str(tmp_path) + "/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(read_table(transport))
    result = fresh_result()
    job._check_transport(result)
    assert result.transport_used["prefill0"]["read"] == ["cma/memory"]
    (flag,) = result.flags
    assert flag.startswith(
        "prefill0: KV moved over ['cma/memory'], none of the transports dram expects (cuda_ipc;"
    )
    # What the dram config expects on one host: shared memory (cma); no flag. (Its own dir:
    # the expectation is not part of a Deployment's identity, so the logs would be shared.)
    job = job_on(tmp_path / "dram", ["sm", "tcp"])
    result = fresh_result()
    job._check_transport(result)
    assert result.flags == []


def test_a_recomputed_fallback_is_always_a_flag(tmp_path):
    job = job_on(tmp_path, [])
    result = fresh_result()
    job._check_kv_loads(result, RECOVERED + FAILING)
    recomputed, failed = result.flags
    assert recomputed.startswith("2 request(s) recomputed KV that failed to load")
    assert "kv_load_failure_policy=recompute" in recomputed
    assert failed.startswith("1 request(s) failed because their KV did not load")
    result = fresh_result()
    job._check_kv_loads(result, "INFO all fine\n")
    assert result.flags == []


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
