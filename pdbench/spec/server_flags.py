"""The vLLM flags pdbench sets itself, so ``server.extra_args`` cannot set them a second time.

The set is read off ``serve_command``'s own output (for a P/D and a mixed instance, a GPU
and a CPU one), so it follows whatever the command line builder emits. vLLM parses its
flags with argparse: ``--x`` and ``--no-x`` set one value, ``--x_y`` is ``--x-y``, a unique
prefix (``--tensor-parallel``) abbreviates a flag, and a few flags have a second name.
"""

from __future__ import annotations

from dataclasses import replace

from pdbench.config.schema import RunConfig
from pdbench.plan.deployments import Deployment, Instance
from pdbench.spec.serve_command import serve_command

# Second names of managed flags in vLLM 0.32's parser (vllm.entrypoints.launchers.cli_args).
VLLM_ALIASES = {
    "-tp": "--tensor-parallel-size",
    "--device-memory-utilization": "--gpu-memory-utilization",
}
# Where each managed flag's value comes from, for the fix a message gives.
FLAG_SOURCES = {
    "--model": "model.path",
    "--served-model-name": "model.name",
    "--host": "the node address pdbench picks",
    "--port": "server.base_port",
    "--tensor-parallel-size": "the topology's tp (topology.prefill.tp, ...)",
    "--dtype": "model.dtype",
    "--max-model-len": "model.max_model_len",
    "--block-size": "server.block_size",
    "--max-num-seqs": "server.max_num_seqs",
    "--seed": "model.seed",
    "--enable-prefix-caching": "server.prefill_prefix_caching / server.decode_prefix_caching",
    "--enforce-eager": "server.enforce_eager",
    "--gpu-memory-utilization": "server.gpu_memory_utilization",
    "--kv-transfer-config": "transport and flow settings (transport.*, flow.*)",
    "--num-gpu-blocks-override": "server.prefill_kv_blocks / server.decode_kv_blocks",
}
MIN_ABBREVIATION = 5  # "--max" and longer: argparse accepts any unique prefix


def _negated(flag: str) -> str:
    return f"--{flag[5:]}" if flag.startswith("--no-") else f"--no-{flag[2:]}"


def managed_flags(cfg: RunConfig) -> frozenset[str]:
    """Every ``--flag`` ``serve_command`` emits for ``cfg`` (and its ``--no-`` twin)."""
    probe = Deployment(
        deployment_id="probe",
        nodes=1,
        instances=[],
        kv_recompute_threshold=cfg.flow.kv_recompute_threshold[0],
        decoder_kv_blocks_ttl_s=cfg.flow.decoder_kv_blocks_ttl_s[0],
        bidirectional=True,
        model=cfg.model,
        topology=cfg.topology,
        transport=cfg.transport,
        server=replace(
            cfg.server, extra_args=[], enforce_eager=True, prefill_kv_blocks=1, decode_kv_blocks=1
        ),
        flow=cfg.flow,
        connector=cfg.connector,
    )
    flags: set[str] = set()
    for role, gpus in (("prefill", (0,)), ("mixed", ())):
        instance = Instance(f"{role}0", role, 0, 0, 1, gpus, (0,), 1, 1)
        for token in serve_command(probe, instance, "MODEL", "HOST", "PYTHON"):
            if token.startswith("--"):
                flags.add(token.split("=", 1)[0])
    return frozenset(flags | {_negated(f) for f in flags})


def canonical(flag: str, managed: frozenset[str]) -> str | None:
    """The managed flag a user's flag sets, or ``None`` when it sets none of them."""
    name = flag.split("=", 1)[0]
    if name.startswith("--"):
        name = "--" + name[2:].replace("_", "-")
    name = VLLM_ALIASES.get(name, name)
    if name in managed:
        return name
    if name.startswith("--") and len(name) >= MIN_ABBREVIATION:
        matches = sorted(f for f in managed if f.startswith(name))
        if matches:
            return matches[0]
    return None


def clashes(extra_args: list[str], managed: frozenset[str]) -> list[tuple[str, str]]:
    """(user's flag, managed flag it repeats) for each flag of ``extra_args`` pdbench sets."""
    out = []
    for arg in extra_args:
        if arg.startswith("-") and (hit := canonical(arg, managed)):
            out.append((arg.split("=", 1)[0], hit))
    return out


def source_of(flag: str) -> str:
    """The pdbench setting that gives ``flag`` its value."""
    base = f"--{flag[5:]}" if flag.startswith("--no-") else flag
    return FLAG_SOURCES.get(base, "pdbench's config (launch.dry_run=true shows the command)")
