"""The preflight on a GPU node (device only): GPUs found as planned, CUDA transports in the
UCX that NIXL bundles, the driver/CUDA/GPU facts recorded for the provenance."""

from __future__ import annotations

import pytest

from jobs.preflight import NodeExpectation, PreflightSpec, run_preflight

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)


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
