"""The preflight: per node, before any server starts, check what the plan assumes.

``spec_from_config(cfg, model_path)`` -> ``PreflightSpec`` (pure) -> ``run_preflight(spec,
rank, rendezvous_dir)`` on each node -> ``NodeReport`` (one line per failed check; its
``findings`` are that node's provenance: driver, CUDA, vLLM/NIXL/UCX versions, GPUs, NICs).
Modules: ``spec`` (what to check), ``checks`` (pure checks), ``nvidia_smi`` (parsers),
``probes`` (what a node is asked), ``rendezvous`` (the cross-node protocol), ``runner``.
"""

from jobs.preflight.runner import NodeReport, run_preflight
from jobs.preflight.spec import NodeExpectation, PreflightSpec, spec_from_config

__all__ = ["NodeExpectation", "NodeReport", "PreflightSpec", "run_preflight", "spec_from_config"]
