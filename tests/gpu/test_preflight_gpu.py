"""The preflight on a GPU node (device only): GPUs found as planned, CUDA transports in the
UCX that NIXL bundles, the driver/CUDA/GPU facts recorded for the provenance, and the
transfer preflight's VRAM read with its GB/s and transport."""

from __future__ import annotations

import sys

import pytest

from jobs.preflight import NodeExpectation, PreflightSpec, run_preflight

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)


def vram_probe():
    """One KV-shaped read of Llama 3 8B's shape between two GPUs (or one GPU's two
    processes), GPU 0 to GPU 1."""
    from pdbench.spec.transfer_probe import TransferProbe

    reader_gpu = 1 if torch.cuda.device_count() > 1 else 0
    return TransferProbe(
        owner="prefill0",
        owner_node=0,
        owner_gpu=0,
        reader="decode0",
        reader_node=0,
        reader_gpu=reader_gpu,
        memory="VRAM",
        split="1->1",
        tokens=4096,
        model="llama3_8b",
        dtype="bfloat16",
        num_layers=32,
        num_kv_heads=8,
        head_dim=128,
        dtype_bytes=2,
        block_size=16,
        backends=("UCX",),
        ucx_tls="cuda_ipc,cuda_copy,tcp",
        expected_transports=("cuda_ipc",),
        expected_gb_s=200.0,
        floor_gb_s=0.0,  # a figure, not a verdict: the GPU machine's link is not known here
    )


def test_preflight_on_one_gpu(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"\0" * 64)
    spec = PreflightSpec(
        nodes=(NodeExpectation(0, (0,)),),
        run_dir=str(tmp_path / "run"),
        model_path=str(model),
        server_env={"UCX_TLS": "cuda_ipc,cuda_copy,tcp"},
        expected_ucx_transports=("cuda_copy",),
        imports=("nixl",),
    )
    report = run_preflight(spec)
    checks = {r.check: r for r in report.results}
    print("\n".join(report.lines()))
    assert checks["gpus"].ok and not checks["gpus"].skipped, checks["gpus"]
    assert checks["ucx"].ok and "cuda_copy/cuda" in checks["ucx"].found, checks["ucx"]
    assert report.findings["driver"] and report.findings["cuda"]
    assert report.findings["gpus"][0]["memory_gib"] > 0


def test_transfer_preflight_reads_vram_and_names_its_transport(tmp_path):
    """The transfer preflight between two GPUs (or one GPU's two processes): one KV-shaped
    NIXL read of Llama 3 8B's shape, its GB/s and the UCX transport that carried it."""
    from jobs.preflight.probes import probe_env
    from jobs.preflight.transfer import run_transfer

    probe = vram_probe()
    env = probe_env({"UCX_TLS": probe.ucx_tls})
    result, found = run_transfer(probe, 0, tmp_path / "transfer", sys.executable, env)
    print(result.line("node0"), found)
    assert result.ok and found["integrity_ok"], result.line("node0")
    assert found["gb_s"] > 0 and found["ucx_transports"], found


def test_the_transfer_preflight_reads_both_ways_for_a_deployment_that_pulls(tmp_path):
    """A deployment that pulls on GPUs is read both ways (D reads P's, then P reads D's, as a
    pull does): both reads land, each its own check and findings."""
    from dataclasses import replace

    from jobs.preflight import runner
    from jobs.preflight.probes import probe_env
    from pdbench.results.preflight import NodeReport

    forward = vram_probe()
    back = replace(
        forward,
        owner=forward.reader,
        owner_gpu=forward.reader_gpu,
        reader=forward.owner,
        reader_gpu=forward.owner_gpu,
    )
    spec = PreflightSpec(
        nodes=(NodeExpectation(0, tuple(sorted({0, forward.reader_gpu}))),),
        run_dir=str(tmp_path / "run"),
        model_path=str(tmp_path),
        transfer=forward,
        transfer_back=back,
    )
    report = NodeReport(rank=0, node_name="node0", hostname="gpu")
    runner.transfer_check(spec, 0, tmp_path, probe_env({"UCX_TLS": forward.ucx_tls}), report)
    checks = {r.check: r for r in report.results}
    print("\n".join(report.lines()))
    assert checks["transfer"].ok and checks["transfer back"].ok, checks
    assert report.findings["transfer"]["integrity_ok"]
    assert report.findings["transfer_back"]["integrity_ok"]
