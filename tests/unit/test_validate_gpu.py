"""GPU and transport validation rules (pdbench/validate_gpu.py): field, value, message, fix."""

from __future__ import annotations

import pytest

from pdbench.validate import validate
from tests.unit.helpers import gpu_run
from tests.unit.test_validate import only, problems_for

pytestmark = pytest.mark.unit


def test_ucx_tls_without_an_active_message_transport_is_rejected():
    cfg = gpu_run()
    cfg.transport.kv_buffer_device = "cuda"
    cfg.transport.ucx_tls = "cuda_ipc,cuda_copy"
    problem = only(cfg, "transport.ucx_tls", "cuda_ipc,cuda_copy", "active messages", "NIXL #1413")
    assert "cuda_ipc,cuda_copy,tcp" in problem.fix
    cfg.transport.ucx_tls = "cuda_ipc,cuda_copy,tcp"
    assert problems_for(cfg, "transport.ucx_tls") == []


def test_expected_transport_must_be_allowed_by_ucx_tls():
    cfg = gpu_run()
    cfg.transport.ucx_tls = "tcp"
    cfg.transport.expected_ucx_transports = ["cuda_ipc"]
    only(
        cfg, "transport.expected_ucx_transports", ["cuda_ipc"], "excluded by transport.ucx_tls=tcp"
    )
    cfg.transport.ucx_tls = ""
    assert validate(cfg) == []
