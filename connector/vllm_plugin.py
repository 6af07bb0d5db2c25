"""pdbench's vLLM KV-connector plugin: vLLM's NixlConnector plus a KV-params export.

Loaded by vLLM through ``kv_transfer_config.kv_connector_module_path = connector.vllm_plugin``
with ``kv_connector = NixlConnector`` (vLLM enables NIXL-specific behaviour by that name).

Why the export: vLLM returns a finished request's ``kv_transfer_params`` (the blocks D keeps
for the next turn) only in non-streaming responses. The router streams D's tokens to the
client, so the plugin writes those params, on the scheduler side, to
``$PDBENCH_KV_PARAMS_DIR/<request_id>.json`` when the request finishes — before vLLM sends
the last chunk — and the router reads them when the stream ends.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from connector.process_env import KV_PARAMS_DIR_ENV
from connector.request_timing import RequestTimingMixin
from connector.shared_files import write_bytes_atomic

# vLLM's NixlConnector with pdbench's per-transfer tracing (inactive unless a trace dir is set).
from connector.tracing import NixlConnector as _VllmNixlConnector


def export_params(directory: str, request_id: str, params: dict[str, Any]) -> Path:
    """Write one request's params atomically as ``<directory>/<request_id>.json``."""
    path = Path(directory) / f"{request_id}.json"
    # No fsync: this runs in vLLM's scheduler for every finished request, and the router
    # reads the file within seconds (a crash loses the run's servers anyway).
    write_bytes_atomic(path, json.dumps(params, default=list).encode(), fsync=False)
    return path


class NixlConnector(RequestTimingMixin, _VllmNixlConnector):
    """vLLM's NixlConnector that also exports finished requests' KV-transfer params and
    times every request (``connector.request_timing``)."""

    def request_finished(self, request, block_ids):
        delay, params = super().request_finished(request, block_ids)
        self._export(request, params)
        return delay, params

    def request_finished_all_groups(self, request, block_ids):
        delay, params = super().request_finished_all_groups(request, block_ids)
        self._export(request, params)
        return delay, params

    @staticmethod
    def _export(request, params: dict[str, Any] | None) -> None:
        directory = os.environ.get(KV_PARAMS_DIR_ENV)
        if directory and params:
            export_params(directory, str(request.request_id), params)
