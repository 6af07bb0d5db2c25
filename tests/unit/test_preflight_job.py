"""The preflight as the job's first step: its spec from the launch spec, the one-line
verdict over every node's report, the findings kept in the manifest, GPU indices mapped
through the task's own devices, and the ``preflight`` command of the CLI."""

from __future__ import annotations

import json

import pytest

from jobs.preflight.checks import failed, passed
from jobs.preflight.job import one_line, record_findings, verdict
from jobs.preflight.spec import spec_from_launch
from pdbench.cli import parse_argv, precheck
from pdbench.config.schema import Command, Placement
from pdbench.plan.deployments import make_plan
from pdbench.results.preflight import NodeReport
from pdbench.results.store import RunStore
from pdbench.spec.launch import build_launch, describe_preflight, map_devices, visible_devices
from tests.unit.helpers import cpu_run, gpu_run

pytestmark = pytest.mark.unit


def report(rank: int, *results, node: str = "") -> dict:
    node = NodeReport(rank, node or f"node{rank + 1}", "vm", list(results))
    node.findings = {"driver": "550.54.15", "packages": {"vllm": "0.32.0"}}
    return node.to_dict()


MODEL_GONE = failed("model", "/nowhere/m: no such directory", "model.path=<a shared dir>")
UCX_GONE = failed("ucx", "NIXL's UCX lists tcp/eth0: none of the expected rc_mlx5", "load it")


def test_every_node_passed_is_no_verdict():
    reports = {r: report(r, passed("model", "/m (ok)")) for r in (0, 1)}
    assert verdict(reports, 2, 60) == ""


def test_the_first_failure_is_one_line_naming_node_check_found_fix():
    reports = {0: report(0, passed("model", "/m")), 1: report(1, MODEL_GONE, UCX_GONE)}
    line = verdict(reports, 2, 60)
    assert "\n" not in line
    assert line.startswith("preflight node1 (node2) model: found /nowhere/m: no such directory")
    assert ". Fix: model.path=<a shared dir>" in line
    assert line.endswith("(+1 more failed check(s))")


def test_a_node_without_a_report_failed():
    line = verdict({0: report(0, passed("model", "/m"))}, 2, 60)
    assert line.startswith("preflight node1 report: found no preflight report from node1 after 60")
    assert "Fix: read node1's task log" in line
    assert one_line([]) == ""


def test_reports_round_trip():
    data = report(1, MODEL_GONE)
    back = NodeReport.from_dict(json.loads(json.dumps(data)))
    assert back.to_dict() == data and not back.ok


def test_findings_go_to_the_manifest_per_node_and_beside_the_records(tmp_path):
    store = RunStore(tmp_path)
    store.write_manifest({"name": "x", "provenance": {"git_sha": "abc"}})
    # Two SLURM nodes on one host (the local test cluster): kept apart by node name.
    record_findings(store, "dep-a", {0: report(0, node="gpu-a01")}, "")
    record_findings(store, "dep-b", {0: report(0, node="gpu-a01")}, "")
    record_findings(store, "dep-b", {1: report(1, MODEL_GONE, node="gpu-a02")}, "preflight ...")
    manifest = store.read_manifest()
    nodes = manifest["provenance"]["nodes"]
    assert manifest["provenance"]["git_sha"] == "abc" and manifest["name"] == "x"
    assert nodes["gpu-a01"]["deployments"] == ["dep-a", "dep-b"]
    assert nodes["gpu-a01"]["driver"] == "550.54.15" and nodes["gpu-a01"]["preflight_ok"]
    assert nodes["gpu-a02"]["preflight_ok"] is False
    kept = json.loads((tmp_path / "preflight" / "dep-b.json").read_text())
    assert kept["ok"] is False and kept["line"] == "preflight ..."
    assert [r["rank"] for r in kept["reports"]] == [1]


def test_preflight_spec_comes_from_the_launch_spec():
    cfg = gpu_run(p=2, d=2, placement=Placement.cross_node, nodes=2)
    cfg.transport.expected_ucx_transports = ["rc"]
    cfg.cluster.gpu_memory_gib = 79.6
    cfg.cluster.python = "/venv/bin/python"
    cfg.server.env = {"HF_HUB_OFFLINE": "1"}
    dep = build_launch(cfg, make_plan(cfg), "/shared/m").deployments[0]
    spec = spec_from_launch(dep)
    assert [(n.node, n.gpus) for n in spec.nodes] == [(0, (0, 1)), (1, (0, 1))]
    assert spec.model_path == "/shared/m" and spec.python == "/venv/bin/python"
    assert spec.expected_ucx_transports == ("rc",) and spec.gpu_memory_gib == 79.6
    assert not spec.local
    # The stack the servers share, not one instance's ports, devices or bookkeeping.
    assert spec.server_env == {"UCX_TLS": "rc,cuda_copy", "HF_HUB_OFFLINE": "1"}
    line = describe_preflight(dep)
    assert "model /shared/m, UCX transports expected: rc, GPU memory: 79.6 GiB" in line


def test_a_local_run_is_checked_as_one_machine():
    cfg = cpu_run()
    dep = build_launch(cfg, make_plan(cfg), "/m").deployments[0]
    assert spec_from_launch(dep).local and dep.preflight
    cfg.launch.preflight = False
    dep = build_launch(cfg, make_plan(cfg), "/m").deployments[0]
    assert describe_preflight(dep) == "preflight: off (launch.preflight=false)"


def test_plan_gpus_are_the_tasks_own_devices():
    assert visible_devices([0, 1], None) == "0,1"
    assert visible_devices([0, 1], "") == "0,1"
    assert visible_devices([0, 1], "4,6") == "4,6"
    assert visible_devices([1], "GPU-a,GPU-b") == "GPU-b"
    with pytest.raises(ValueError, match="sees CUDA_VISIBLE_DEVICES=3 \\(1\\)"):
        visible_devices([0, 1], "3")
    cfg = gpu_run(p=2, d=2, placement=Placement.cross_node, nodes=2)
    dep = build_launch(cfg, make_plan(cfg), "/m").deployments[0]
    mapped = map_devices(dep, 1, "2,3,6,7")
    env = {i.name: i.env["CUDA_VISIBLE_DEVICES"] for i in mapped.instances}
    assert env == {"prefill0": "0", "prefill1": "1", "decode0": "2", "decode1": "3"}
    assert [i.gpus for i in mapped.instances] == [i.gpus for i in dep.instances]


def test_the_cli_knows_the_preflight_command():
    (job,) = precheck(parse_argv(["preflight", "+experiment=smoke"]))
    assert job.cfg.command is Command.preflight


def test_the_vllm_cli_the_servers_start_with_is_checked_on_the_node():
    from jobs.preflight.checks import check_server
    from pdbench.spec.vllm_install import VllmInstall

    cfg = gpu_run()
    plan = make_plan(cfg)
    cuda = VllmInstall("vllm", "0.32.1", "vllm")
    dep = build_launch(cfg, plan, "/m", vllm=cuda).deployments[0]
    assert spec_from_launch(dep).server_cli == "vllm"
    assert spec_from_launch(build_launch(cfg, plan, "/m").deployments[0]).server_cli == ""
    assert check_server("vllm", "/venv/bin/vllm").ok
    assert check_server("", None).skipped
    line = check_server("vllm", None).line("node0 (gpu-a01)")
    assert line.startswith("preflight node0 (gpu-a01) server: found no vllm here")
    assert "Fix: make install-gpu in the venv cluster.setup activates" in line
