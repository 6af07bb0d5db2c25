"""pdbench's vLLM KV-connector plugin: vLLM's NixlConnector plus a KV-params service.

Loaded by vLLM through ``kv_transfer_config.kv_connector_module_path``
(``connector.plugin.vllm_plugin``) with ``kv_connector = NixlConnector`` (vLLM enables
NIXL-specific behaviour by that name).

Why the service: vLLM returns a finished request's ``kv_transfer_params`` (the blocks D keeps
for the next turn) only in non-streaming responses. The router streams D's tokens to the
client, so on the scheduler side (vLLM's engine-core process, where ``request_finished``
runs when the request finishes, before vLLM sends the last chunk) the plugin keeps those
params and serves them over HTTP on ``$PDBENCH_KV_PARAMS_ADDR`` (``host:port``, set by the
launch spec on decode instances); the router asks for them when the stream ends
(``connector.plugin.kv_params_service``), with the request's output token ids, so that the router
pulls only onto a prompt that extends exactly what D holds.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.v1.engine.core import EngineCoreProc

from connector.parent_death import die_with_parent
from connector.plugin import engine_idle
from connector.plugin.kv_params_service import ParamsBoard, ParamsServer, parse_addr
from connector.plugin.nic_pinning import current_cuda_device, pin_nic
from connector.plugin.no_lease import release, wants_no_lease
from connector.plugin.request_timing import RequestTimingMixin

# vLLM's NixlConnector with pdbench's per-transfer tracing (inactive unless a trace dir is set).
from connector.plugin.tracing import NixlConnector as _VllmNixlConnector
from connector.process_env import KV_PARAMS_ADDR_ENV, NIC_BY_GPU_ENV, RUN_DIR_ENV

logger = logging.getLogger("vllm.pdbench.kv_params")  # vLLM configures the "vllm" tree


def start_params_service(addr: str) -> ParamsServer:
    """The board and its HTTP server on ``addr``; a port already taken fails the server's
    start with a line that names it (the router could not get D's params otherwise)."""
    host, port = parse_addr(addr)
    try:
        server = ParamsServer(ParamsBoard(), host, port).start()
    except OSError as err:
        raise RuntimeError(
            f"pdbench KV-params service cannot listen on {addr} ({err.strerror or err}): "
            "another process holds the port (a server left from an earlier run?)"
        ) from err
    logger.info("pdbench: KV params served on http://%s:%d/kv_params/<request id>", host, port)
    return server


def wait_engine_when_idle(on_cpu: bool) -> None:
    """``connector.plugin.engine_idle`` on this process's engine core, with a log line."""
    wait_ms = engine_idle.idle_wait_ms(os.environ, on_cpu)
    installed = engine_idle.install(EngineCoreProc, wait_ms)
    logger.info("pdbench: %s", engine_idle.describe(wait_ms if installed else None))


def follow_the_api_server() -> None:
    """In a server pdbench started (``RUN_DIR_ENV`` set), the engine core dies with its API
    server: killed alone, the API server would leave it holding the server's socket."""
    if os.environ.get(RUN_DIR_ENV) and die_with_parent(os.getppid()):
        logger.info("pdbench: this engine core ends with its API server (pid %d)", os.getppid())


class NixlConnector(RequestTimingMixin, _VllmNixlConnector):
    """vLLM's NixlConnector that also serves finished requests' KV-transfer params and
    times every request (``connector.plugin.request_timing``)."""

    def __init__(self, vllm_config, role, kv_cache_config=None):
        if os.environ.get(NIC_BY_GPU_ENV) and role == KVConnectorRole.WORKER:
            pin_nic(current_cuda_device())  # before vLLM creates this worker's NIXL agent
        super().__init__(vllm_config, role, kv_cache_config)
        self.params_service: ParamsServer | None = None
        addr = os.environ.get(KV_PARAMS_ADDR_ENV, "")
        if addr and self.connector_scheduler is not None:  # the scheduler side only
            self.params_service = start_params_service(addr)
        if self.connector_scheduler is not None:  # in the engine-core process
            wait_engine_when_idle(vllm_config.device_config.device_type == "cpu")
            follow_the_api_server()

    def request_finished(self, request, block_ids):
        delay, params = self._unleased(request, *super().request_finished(request, block_ids))
        self._keep(request, params)
        return delay, params

    def request_finished_all_groups(self, request, block_ids):
        finished = super().request_finished_all_groups(request, block_ids)
        delay, params = self._unleased(request, *finished)
        self._keep(request, params)
        return delay, params

    def _unleased(self, request, delay: bool, params: dict[str, Any] | None):
        """A D turn the router marked as one nobody continues (``connector.plugin.no_lease``):
        its blocks freed now, no params kept."""
        sent = request.kv_transfer_params
        if not (delay and wants_no_lease(sent) and not sent.get("do_remote_decode")):
            return delay, params
        if self.connector_scheduler is None or not release(
            self.connector_scheduler, request.request_id
        ):
            return delay, params
        return False, None

    def _keep(self, request, params: dict[str, Any] | None) -> None:
        """Put a finished request's params on the board with its output token ids: the
        router checks the next prompt against the prompt it sent plus these (a copy: the
        request's list goes with the request)."""
        if self.params_service is not None and params:
            outputs = list(request.output_token_ids)
            self.params_service.board.put(str(request.request_id), params, outputs)
