"""vLLM KV-connector plugin: vLLM 0.32's NixlConnector writing one trace line per transfer.

    --kv-transfer-config '{"kv_connector": "NixlConnector",
                           "kv_connector_module_path": "connector.plugin.tracing",
                           "kv_role": "kv_both",
                           "kv_connector_extra_config": {"pdbench_trace_dir": "/run/traces",
                                                         "pdbench_role": "decode"}}'

The class keeps vLLM's name (vLLM switches NIXL-specific behaviour on it). On the worker
side it replaces the worker's ``nixl_wrapper`` with ``TracingNixlWrapper``, which forwards
every call and, when a transfer completes, appends a line to
``<trace dir>/<role>-<engine>-tp<rank>-<pid>.jsonl`` (fields: ``connector.plugin.transfer_trace``).
Trace dir: ``$PDBENCH_TRACE_DIR``, else ``kv_connector_extra_config.pdbench_trace_dir``;
neither set: no tracing, plain NixlConnector. Role (for the direction ``D<-P``/``P<-D``):
``$PDBENCH_ROLE``, else ``pdbench_role``, else ``kv_role`` (producer/consumer).

pdbench's own plugin, ``connector.plugin.vllm_plugin``, builds on this class: a deployment run
with ``connector.trace=true`` (which sets ``PDBENCH_TRACE_DIR``) traces every transfer.

vLLM imports this module itself, so vLLM is imported at module level here (and only here).
"""

from __future__ import annotations

import logging
import os

from vllm.distributed import nixl_utils
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.connector import (
    NixlConnector as _VllmNixlConnector,
)

from connector.plugin.core_binding import CoreBinding, restore
from connector.plugin.nixl_progress import agent_progress_delay, describe, progress_delay_us
from connector.plugin.transfer_trace import install_tracer, trace_settings

logger = logging.getLogger("vllm.pdbench.connector")  # vLLM configures the "vllm" tree


class NixlConnector(_VllmNixlConnector):
    """vLLM's NixlConnector (pull mode) with per-transfer trace lines."""

    def __init__(self, vllm_config, role, kv_cache_config=None):
        binding = CoreBinding.capture()
        delay_us = progress_delay_us(os.environ, vllm_config.device_config.device_type == "cpu")
        with agent_progress_delay(nixl_utils.NixlWrapper, delay_us) as delay_set:
            super().__init__(vllm_config, role, kv_cache_config)
        if self.connector_worker is not None:
            restored = restore(binding)
            if restored is not None:
                logger.info("pdbench: %s", restored.describe())
            logger.info("pdbench: %s", describe(delay_us if delay_set else None))
        trace_dir, instance_role = trace_settings(vllm_config)
        self.tracer = None
        if trace_dir and self.connector_worker is not None:
            self.tracer = install_tracer(
                self.connector_worker, trace_dir, instance_role, self.engine_id
            )
