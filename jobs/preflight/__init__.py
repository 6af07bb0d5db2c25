"""The preflight: per node, before any server starts, check what the plan assumes.

``spec_from_config(cfg, model_path)`` -> ``PreflightSpec`` (pure) -> ``run_preflight(spec,
rank, rendezvous_dir)`` on each node -> ``NodeReport`` (one line per failed check; its
``findings`` are that node's provenance: driver, CUDA, vLLM/NIXL/UCX versions, GPUs, NICs).
Modules: ``spec`` (what to check), ``checks`` (pure checks), ``nvidia_smi`` (parsers),
``probes`` (what a node is asked), ``rendezvous`` (the cross-node protocol), ``transfer``
and ``transfer_side`` (one KV-shaped NIXL read from P's device to D's), ``runner``,
``job`` (the deployment job's first step); the report's schema is ``pdbench.results.preflight``.
"""

from jobs.preflight.runner import run_preflight
from jobs.preflight.spec import NodeExpectation, PreflightSpec, spec_from_config
from pdbench.results.preflight import NodeReport

__all__ = ["NodeExpectation", "NodeReport", "PreflightSpec", "run_preflight", "spec_from_config"]
