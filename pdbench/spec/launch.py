"""The launch spec: everything a run will execute, built once by pure code from the plan.

Per instance: command line, environment, GPUs and cores, ports, node, address, log file.
Per Deployment: its run-dir paths (logs, traces, rendezvous), the router (command,
environment, config file) and what the preflight checks. Per run: the submissions, each
with the sbatch file exactly as SLURM receives it (one array when SLURM gets several
Deployments).

This module is the ONLY builder of these: the dry run prints a ``LaunchSpec``, the job runs
the ``DeploymentSpec`` it is given and writes it, resolved, to ``<run>/launch/<id>.json``,
and the preflight reads the same objects. What the dry run prints is what runs.

Addresses: with the local and debug executors every task runs on this machine, so servers
bind to ``127.0.0.1`` from the start. On SLURM a node's address is known only on the node:
the spec holds ``node_address_placeholder(n)`` (``<nodeN>``) wherever node ``n``'s address
goes, and the job replaces it with ``resolve`` once the node's address is known. GPUs:
a plan's GPU index ``i`` is the ``i``-th device of the task's own ``CUDA_VISIBLE_DEVICES``
(the GPUs SLURM gave the job; ``map_devices`` in the job). Nothing else in a spec changes
between the dry run and the job.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from connector.process_env import RUN_DIR_ENV, TIMING_DIR_ENV
from pdbench.config.schema import (
    ExecutorKind,
    FlowConfig,
    RunConfig,
    TraceTiming,
    WorkloadConfig,
    WorkloadKind,
)
from pdbench.plan.arrivals import GAMMA, OPEN
from pdbench.plan.deployments import (
    SIDE_CHANNEL_STRIDE,
    Deployment,
    Instance,
    Plan,
)
from pdbench.plan.points import ORDER_DESIGN, Point, only
from pdbench.results.jsonable import to_jsonable
from pdbench.spec.sbatch import local_parameters, sbatch_script
from pdbench.spec.serve_command import serve_command, serve_env, served_model_name
from pdbench.spec.server_fork import forkable, forker_command
from pdbench.spec.transfer_probe import TransferProbe, transfer_back_probe, transfer_probe
from pdbench.spec.vllm_install import VllmInstall

LOOPBACK = "127.0.0.1"


def node_address_placeholder(node: int) -> str:
    """What stands for plan node ``node``'s address until the job knows it (SLURM only)."""
    return f"<node{node}>"


@dataclass
class InstanceSpec:
    """One vLLM server as it is started: the plan's Instance plus its launch artifacts."""

    name: str
    role: str  # prefill | decode | mixed
    node: int  # plan node index == task rank
    tp: int
    gpus: list[int]  # CUDA_VISIBLE_DEVICES on its node; [] on CPU
    cpus: list[int]  # cores its whole process tree runs on (CPU builds; ServerProcess pins it)
    host: str  # the address it binds and is reached at
    http_port: int
    side_channel_port: int
    command: list[str]
    env: dict[str, str]  # added to the job's own environment
    log_path: str
    kv_params_port: int = 0  # decode: where its plugin serves KV-transfer params; 0: none
    # forked from its node's server forker (jobs.serving.forker: one import of vLLM per
    # node; server.cpu_start=fork on CPU), not started on its own
    forked: bool = False

    @property
    def kv_params_url(self) -> str:
        return f"http://{self.host}:{self.kv_params_port}" if self.kv_params_port else ""

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.http_port}"

    @property
    def health_url(self) -> str:
        return f"{self.url}/health"


@dataclass
class RouterSpec:
    """The P/D router process; it runs on node 0 beside the load generator."""

    node: int
    host: str
    port: int
    command: list[str]
    env: dict[str, str]
    log_path: str
    config_path: str  # where the job writes ``config`` for ``--config``
    config: dict[str, Any]  # ``jobs.serving.router.RouterConfig`` fields

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def health_url(self) -> str:
        return f"{self.url}/health"


@dataclass
class DeploymentSpec:
    """Every process of one Deployment and the run-dir paths they share."""

    deployment_id: str
    nodes: int
    local: bool  # every task on this machine: addresses are loopback, known now
    run_dir: str
    logs_dir: str
    traces_dir: str  # per-transfer traces (connector.trace=true)
    rendezvous_dir: str  # the job adds <job id>.<restart count>/ below it
    instances: list[InstanceSpec]
    router: RouterSpec
    # What the preflight checks on every node before any server starts (jobs/preflight/job.py,
    # jobs.preflight.spec_from_launch) beyond the instances themselves:
    model_path: str = ""  # the servers' model (a directory or a hub id)
    python: str = ""  # the interpreter the servers and the job run with
    expected_ucx_transports: list[str] = field(default_factory=list)  # transport config's
    gpu_memory_gib: float = 0.0  # cluster.gpu_memory_gib on GPU clusters; 0: not compared
    preflight: bool = True  # launch.preflight: run it as the job's first step
    # The preflight's KV-shaped NIXL read from P's device to D's; None: no KV moves (agg)
    transfer: TransferProbe | None = None
    # ... and P reading D's, as a pull does (GPUs, flows that pull); None: none
    transfer_back: TransferProbe | None = None
    # Per-request timing lines of each instance's connector plugin: <timing_dir>/<instance>/
    timing_dir: str = ""
    # The Points in the order the job measures them (``pdbench.plan.points``) and its seed.
    run_order: list[str] = field(default_factory=list)
    order_seed: int = 0
    # python -m pdbench serve: after the warm-up the job serves this flow to any client until
    # stopped, and measures no Point (jobs/run/serve.py); "": a run.
    serve_flow: str = ""

    def on_node(self, node: int) -> list[InstanceSpec]:
        return [i for i in self.instances if i.node == node]

    def placeholders(self) -> list[str]:
        """Address placeholders still in this spec (none once resolved for every node)."""
        text = repr(self.to_dict())
        return [
            node_address_placeholder(n)
            for n in range(self.nodes)
            if node_address_placeholder(n) in text
        ]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DeploymentSpec:
        fields = dict(data)
        fields["instances"] = [InstanceSpec(**i) for i in data["instances"]]
        fields["router"] = RouterSpec(**data["router"])
        for name in ("transfer", "transfer_back"):
            if data.get(name):
                fields[name] = TransferProbe.from_dict(data[name])
        return cls(**fields)


@dataclass
class Submission:
    """One submitit submission: a job, or (SLURM, several Deployments) one job array."""

    job_name: str
    nodes: int  # nodes per job
    deployment_ids: list[str]  # one job (array element) each, in this order
    sbatch: str = ""  # the sbatch file SLURM receives; "" for the local and debug executors
    # local executor: the lines each task's shell runs before the job (cluster.setup, then
    # cluster.env's exports), which SLURM jobs carry in their sbatch file
    setup: list[str] = field(default_factory=list)


@dataclass
class LaunchSpec:
    """The whole launch of a plan: every Deployment's spec and what gets submitted."""

    run_dir: str
    executor: str
    submitit_folder: str
    deployments: list[DeploymentSpec]  # every Deployment of the plan
    submissions: list[Submission] = field(default_factory=list)  # only those not done

    def deployment(self, deployment_id: str) -> DeploymentSpec:
        return next(d for d in self.deployments if d.deployment_id == deployment_id)


def resolve(spec: DeploymentSpec, addresses: dict[int, str]) -> DeploymentSpec:
    """``spec`` with node ``n``'s placeholder replaced by ``addresses[n]`` everywhere."""
    mapping = {node_address_placeholder(n): address for n, address in addresses.items()}
    return DeploymentSpec.from_dict(_substitute(spec.to_dict(), mapping))


def task_devices(task_visible: str | None) -> list[str]:
    """The devices a task may use (its ``CUDA_VISIBLE_DEVICES``, set by SLURM for the job's
    GPUs); [] when unset: every GPU of the node."""
    return [v.strip() for v in (task_visible or "").split(",") if v.strip()]


def visible_devices(plan_gpus: list[int], task_visible: str | None) -> str:
    """The ``CUDA_VISIBLE_DEVICES`` of an instance on plan GPUs ``plan_gpus``: plan index ``i``
    is the task's ``i``-th device, so that on a node shared with other jobs an instance never
    lands on their GPUs; without a task list, the plan indices themselves."""
    devices = task_devices(task_visible)
    if not devices:
        return ",".join(str(g) for g in plan_gpus)
    if plan_gpus and max(plan_gpus) >= len(devices):
        raise ValueError(
            f"the plan uses GPUs {plan_gpus} but this task sees CUDA_VISIBLE_DEVICES="
            f"{task_visible} ({len(devices)}): request more GPUs (cluster.gpus_per_node)"
        )
    return ",".join(devices[g] for g in plan_gpus)


def map_devices(spec: DeploymentSpec, node: int, task_visible: str | None) -> DeploymentSpec:
    """``spec`` with node ``node``'s instances' ``CUDA_VISIBLE_DEVICES`` mapped through that
    node's task's own list (``visible_devices``); the job does this on each node."""
    data = spec.to_dict()
    for inst in data["instances"]:
        if inst["node"] == node and inst["gpus"]:
            inst["env"]["CUDA_VISIBLE_DEVICES"] = visible_devices(inst["gpus"], task_visible)
    return DeploymentSpec.from_dict(data)


def _substitute(value: Any, mapping: dict[str, str]) -> Any:
    if isinstance(value, str):
        for placeholder, address in mapping.items():
            value = value.replace(placeholder, address)
        return value
    if isinstance(value, dict):
        return {k: _substitute(v, mapping) for k, v in value.items()}
    if isinstance(value, list):
        return [_substitute(v, mapping) for v in value]
    return value


def deployment_spec(
    dep: Deployment,
    points: list[Point],
    run_dir: str,
    model_path: str,
    python: str,
    local: bool,
    gpu_memory_gib: float = 0.0,
    preflight: bool = True,
    vllm: VllmInstall | None = None,
) -> DeploymentSpec:
    """The launch artifacts of one Deployment (pure)."""
    root = Path(run_dir)
    logs = root / "logs" / dep.deployment_id
    traces = root / "traces" / dep.deployment_id
    timing = root / "timing" / dep.deployment_id

    def host_of(node: int) -> str:
        return LOOPBACK if local else node_address_placeholder(node)

    instances = [
        _instance_spec(
            dep, inst, host_of(inst.node), model_path, python, run_dir, logs, traces, vllm
        )
        for inst in dep.instances
    ]
    for spec in instances:
        if spec.role != "mixed":  # the connector plugin times every request it sees
            spec.env[TIMING_DIR_ENV] = str(timing / spec.name)
    return DeploymentSpec(
        deployment_id=dep.deployment_id,
        nodes=dep.nodes,
        local=local,
        run_dir=run_dir,
        logs_dir=str(logs),
        traces_dir=str(traces),
        rendezvous_dir=str(root / "rendezvous" / dep.deployment_id),
        instances=instances,
        router=_router_spec(dep, points, instances, host_of(0), python, run_dir, logs),
        model_path=model_path,
        python=python,
        expected_ucx_transports=list(dep.transport.expected_ucx_transports),
        gpu_memory_gib=gpu_memory_gib,
        preflight=preflight,
        transfer=transfer_probe(dep),
        transfer_back=transfer_back_probe(dep),
        timing_dir=str(timing),
        run_order=[p.point_id for p in sorted(points, key=lambda p: p.order_index)],
        order_seed=points[0].workload.order_seed if points else 0,
    )


def kv_params_port(inst: Instance) -> int:
    """Where a decode instance's plugin serves its KV-transfer params to the router: the
    last port of the instance's side-channel block (``plan.SIDE_CHANNEL_STRIDE`` ports from
    ``side_channel_port``; NIXL listens on the first, plus the data-parallel rank)."""
    return inst.side_channel_port + SIDE_CHANNEL_STRIDE - 1 if inst.role == "decode" else 0


def _instance_spec(
    dep: Deployment,
    inst: Instance,
    host: str,
    model_path: str,
    python: str,
    run_dir: str,
    logs: Path,
    traces: Path,
    vllm: VllmInstall | None = None,
) -> InstanceSpec:
    port = kv_params_port(inst)
    env = serve_env(dep, inst, host, f"{host}:{port}" if port else "", str(traces))
    env[RUN_DIR_ENV] = run_dir  # marks every process pdbench starts for this run
    command = serve_command(dep, inst, model_path, host, python, vllm)
    return InstanceSpec(
        name=inst.name,
        role=inst.role,
        node=inst.node,
        tp=inst.tp,
        gpus=list(inst.gpus),
        cpus=list(inst.cpus),
        host=host,
        http_port=inst.http_port,
        side_channel_port=inst.side_channel_port,
        command=command,
        env=env,
        log_path=str(logs / f"{inst.name}.log"),
        kv_params_port=port,
        forked=forkable(dep.server.cpu_start, inst.gpus, command),
    )


def forker_log(dep: DeploymentSpec, node: int) -> str:
    """The log of node ``node``'s server forker (``jobs.serving.forker``)."""
    return str(Path(dep.logs_dir) / f"server-forker.node{node}.log")


def router_settings(flow: FlowConfig, request_timeout_s: float, port: int) -> dict[str, Any]:
    """The router's settings (``jobs.serving.router.RouterConfig`` fields other than the URLs
    and the host), each taken from where the typed config defines it."""
    return {
        "port": port,
        "cache_hit_threshold": flow.cache_hit_threshold,
        "decode_first_fallback": flow.decode_first_fallback.value,
        "decoder_kv_blocks_ttl_s": only(
            flow.decoder_kv_blocks_ttl_s, "flow.decoder_kv_blocks_ttl_s"
        ),
        "request_timeout_s": request_timeout_s,
        # flow policy: the router reads the file itself (absolute: its cwd is the job's)
        "policy": os.path.abspath(flow.policy) if flow.policy else "",
        "policy_force": flow.policy_force,
        "match_prefix": flow.match_prefix,
    }


def _router_spec(
    dep: Deployment,
    points: list[Point],
    instances: list[InstanceSpec],
    host: str,
    python: str,
    run_dir: str,
    logs: Path,
) -> RouterSpec:
    """The router and its settings, each from the one place the typed config defines it."""
    port = dep.server.router_port
    config_path = str(logs / "router.json")

    def urls(role: str) -> list[str]:
        return [i.url for i in instances if i.role == role]

    # the router's client timeout covers the longest any Point's requests may take
    timeout_s = max((p.workload.request_timeout_s for p in points), default=0.0)
    config = {
        "prefill_urls": urls("prefill"),
        "decode_urls": urls("decode"),
        "agg_urls": urls("mixed"),
        # decode_urls[i]'s KV-params service (the plugin in that server's engine core)
        "kv_params_urls": [i.kv_params_url for i in instances if i.role == "decode"],
        "host": host,
        "bidirectional": dep.bidirectional,  # D keeps its KV for P: pull, decode_first
        # what a request is checked against before P works on it (404, 400)
        "model": served_model_name(dep),
        "max_model_len": dep.model.max_model_len,
        # what the policy's entry must match (pdbench.results.policy_file.entry_for)
        "policy_target": dep.policy_target() if dep.flow.policy else None,
        # every request the router serves, one line each (jobs.serving.request_log)
        "request_log": str(logs / "router_requests.jsonl"),
        **router_settings(dep.flow, timeout_s, port),
    }
    return RouterSpec(
        node=0,
        host=host,
        port=port,
        command=[python, "-m", "jobs.serving.router", "--config", config_path],
        env={"PYTHONUNBUFFERED": "1", RUN_DIR_ENV: run_dir},
        log_path=str(logs / "router.log"),
        config_path=config_path,
        config=to_jsonable(config),
    )


def job_name(deployment_id: str) -> str:
    """The job name of one Deployment's job (SLURM shows it in ``squeue``)."""
    return f"pdbench-{deployment_id}"


def build_launch(
    cfg: RunConfig,
    plan: Plan,
    model_path: str,
    pending: list[str] | None = None,
    vllm: VllmInstall | None = None,
) -> LaunchSpec:
    """The launch of ``plan``: a spec per Deployment, and submissions for those in
    ``pending`` (Deployment ids with a Point not yet recorded ok; None: all). ``vllm``: the
    vLLM the servers run (``vllm_install.servers_vllm``; None: start them as a module)."""
    local = cfg.cluster.executor is not ExecutorKind.slurm
    python = cfg.cluster.python or sys.executable
    folder = str(Path(cfg.dir) / "submitit")
    gpu_memory_gib = cfg.cluster.gpu_memory_gib if cfg.cluster.gpus_per_node > 0 else 0.0
    specs = [
        deployment_spec(
            d,
            plan.points[d.deployment_id],
            cfg.dir,
            model_path,
            python,
            local,
            gpu_memory_gib,
            cfg.launch.preflight,
            vllm,
        )
        for d in plan.deployments
    ]
    todo = [d for d in plan.deployments if pending is None or d.deployment_id in pending]
    submissions = []
    if todo and not local:
        # SLURM: every Deployment of a plan spans the same nodes, so they go out as one job
        # array, at most cluster.array_parallelism running at once.
        name = job_name(todo[0].deployment_id) if len(todo) == 1 else f"pdbench-{cfg.name}"
        sbatch = sbatch_script(
            cfg.cluster,
            todo[0].nodes,
            name,
            folder,
            array_size=len(todo),
        )
        submissions.append(Submission(name, todo[0].nodes, [d.deployment_id for d in todo], sbatch))
    else:
        # Local jobs share this machine's cores and ports: one after another.
        submissions = [
            Submission(
                job_name(d.deployment_id),
                d.nodes,
                [d.deployment_id],
                setup=local_setup(cfg, d.nodes, job_name(d.deployment_id)),
            )
            for d in todo
        ]
    return LaunchSpec(
        run_dir=cfg.dir,
        executor=cfg.cluster.executor.value,
        submitit_folder=folder,
        deployments=specs,
        submissions=submissions,
    )


def local_setup(cfg: RunConfig, nodes: int, name: str) -> list[str]:
    """What submitit's local executor runs in each task's shell first (cluster.setup, then
    cluster.env's exports); [] for the debug executor, which runs the job in this process."""
    if cfg.cluster.executor is not ExecutorKind.local:
        return []
    return list(local_parameters(cfg.cluster, nodes, name).get("setup", []))


def describe(spec: LaunchSpec, plan: Plan) -> str:
    """The dry run's text: every process of every Deployment, its Points, the submissions."""
    lines = [f"run dir: {spec.run_dir}", f"executor: {spec.executor}", ""]
    for dep in spec.deployments:
        lines += describe_deployment(dep)
        lines.append(f"  run order ({ORDER_DESIGN}, order_seed={dep.order_seed}):")
        points = {p.point_id: p for p in plan.points[dep.deployment_id]}
        for index, point_id in enumerate(dep.run_order):
            point = points[point_id]
            wl = point.workload
            lines.append(
                f"  {index:>3} point {point_id}: flow={point.flow.value} "
                f"history={point.history_tokens} repetition={point.repetition} "
                f"{_offered(wl)}"
            )
        search = plan.searches.get(dep.deployment_id)
        if search is not None:
            lines.append(f"  then: {search.describe()}")
            lines.append(
                "  (the rest of the run order is chosen as it goes: search/<deployment>.json)"
            )
        lines.append("")
    if not spec.submissions:
        lines.append("nothing to submit: every Point is recorded ok")
    for i, sub in enumerate(spec.submissions, 1):
        jobs = len(sub.deployment_ids)
        what = (
            f"an array of {jobs} jobs of {sub.nodes} node(s)"
            if jobs > 1
            else f"one job of {sub.nodes} node(s)"
        )
        lines.append(f"submission {i} of {len(spec.submissions)}: {sub.job_name}, {what}")
        lines.append(f"  deployments: {', '.join(sub.deployment_ids)}")
        if sub.sbatch:
            lines.append("  sbatch script:")
            lines += ["    " + line for line in sub.sbatch.splitlines()]
        if sub.setup:
            lines.append("  setup (each task's shell runs it before the job):")
            lines += ["    " + line for line in sub.setup]
    return "\n".join(lines) + "\n"


def _offered(wl: WorkloadConfig) -> str:
    """A Point's traffic and how it is offered, as the dry run says it."""
    load = f"concurrency={only(wl.concurrency, 'workload.concurrency')}"
    if wl.arrival.value in OPEN:  # an open loop: the rate offered, not a concurrency
        burst = f" burstiness={wl.burstiness:g}" if wl.arrival.value == GAMMA else ""
        load = f"arrival={wl.arrival.value} request_rate={wl.request_rate:g}/s{burst}"
    if wl.kind is WorkloadKind.trace:
        timing, times = wl.trace.timing, f"at its times / {wl.trace.speedup:g}"
        if timing is TraceTiming.recorded:
            load = times
        elif timing is TraceTiming.auto:
            load = f"{times} (untimed: {load})"
        return f"trace={Path(wl.trace.path).name} {load}"
    return f"conversations={only(wl.conversations, 'workload.conversations')} {load}"


def describe_deployment(dep: DeploymentSpec) -> list[str]:
    """One Deployment's processes as the dry run prints them (the job's resolved spec renders
    the same way, which is how the e2e test compares the two)."""
    lines = [
        f"deployment {dep.deployment_id}: {dep.nodes} node(s)",
        f"  dirs: logs {dep.logs_dir}, traces {dep.traces_dir}, timing {dep.timing_dir}, "
        f"rendezvous "
        f"{dep.rendezvous_dir}/<job id>.<restart count>",
    ]
    lines.append("  " + describe_preflight(dep))
    if dep.serve_flow:
        lines.append(
            f"  serve: after the warm-up, flow {dep.serve_flow} for any client until stopped; "
            "no Point is measured"
        )
    for node in range(dep.nodes):
        lines.append(f"  node {node}:")
        forked = [inst for inst in dep.on_node(node) if inst.forked]
        if forked:
            lines.append(
                f"    server forker: {shlex.join(forker_command(forked[0].command))}, log "
                f"{forker_log(dep, node)}: imports the module once, forks "
                f"{', '.join(i.name for i in forked)} (server.cpu_start=fork)"
            )
        for inst in dep.on_node(node):
            where = f"gpus={inst.gpus}" + (f", cpus={inst.cpus}" if inst.cpus else "")
            how = ", forked" if inst.forked else ""
            lines.append(f"    {inst.name} ({inst.role}, tp={inst.tp}, {where}{how}):")
            lines += _process_lines(inst.env, inst.command, inst.log_path)
        if node == dep.router.node:
            router = dep.router
            lines.append(f"    router ({router.host}:{router.port}):")
            lines += _process_lines(router.env, router.command, router.log_path)
            lines.append(f"      config {json.dumps(router.config, sort_keys=True)}")
    return lines


def describe_preflight(dep: DeploymentSpec) -> str:
    """The preflight line of the dry run: what every node is checked for first."""
    if not dep.preflight:
        return "preflight: off (launch.preflight=false)"
    expected = ",".join(dep.expected_ucx_transports) or "any"
    memory = f"{dep.gpu_memory_gib:g} GiB" if dep.gpu_memory_gib else "not compared"
    transfer = dep.transfer.describe() if dep.transfer else "no transfer preflight (no P/D)"
    if dep.transfer_back:
        transfer += "; then the other way: " + dep.transfer_back.describe().split(": ", 1)[1]
    return (
        f"preflight (every node, before any server): imports with {dep.python}, model "
        f"{dep.model_path}, UCX transports expected: {expected}, GPU memory: {memory}, "
        f"node address, ports free, shared run dir; {transfer}"
    )


def _process_lines(env: dict[str, str], command: list[str], log_path: str) -> list[str]:
    return [
        "      env " + " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()),
        "      " + shlex.join(command),
        f"      log {log_path}",
    ]
