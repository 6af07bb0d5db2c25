"""Typed run configuration: the schema Hydra composes into, registered in the ConfigStore.

Every YAML file under ``conf/`` starts from one of these dataclasses (``defaults: [base_X,
_self_]``), so a typo or a wrong type fails at compose time. ``validate`` (in
``pdbench.validate.rules``) checks what types cannot: TP against heads, instances against nodes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum, StrEnum
from typing import Any, Optional

from omegaconf import MISSING, OmegaConf

from connector.bench_config import TransferBenchConfig
from connector.layout import parameters_of
from pdbench.config.axes import Level, axis
from pdbench.config.bounds import MANY, PORT, SEED, TOKENS, WEEK_S, bounded
from records.model import ModelShape


class ExecutorKind(Enum):
    """Which submitit executor dispatches the jobs."""

    local = "local"
    slurm = "slurm"
    debug = "debug"


class Flow(Enum):
    """How the router serves one conversation turn (docs/flows.md; jobs/serving/router.py)."""

    agg = "agg"
    recompute = "recompute"
    pull = "pull"
    decode_first = "decode_first"
    # flow.policy's rule per turn, at the load in flight (pdbench/results/policy_rule.py)
    policy = "policy"
    # flow.policy's threshold of its lightest (heaviest) measured load, at every load: the
    # static rules the policy is checked against (+experiment=policy_check)
    static_light = "static_light"
    static_heavy = "static_heavy"


class Placement(Enum):
    """Where decode instances go relative to prefill instances."""

    same_node = "same_node"
    cross_node = "cross_node"


class WorkloadKind(Enum):
    """How conversations are shaped (jobs/workload.py)."""

    multi_turn = "multi_turn"  # independent conversations, each with its own history
    long_doc = "long_doc"  # every conversation asks about one shared long document prefix
    agentic = "agentic"  # tool-call loops: many turns, short outputs, a growing prefix
    trace = "trace"  # a user's traffic replayed: workload.trace (pdbench/traffic/)


class ClientApi(Enum):
    """The API the load generator speaks to the router (jobs/workload.py)."""

    completions = "completions"  # token-id prompts: lengths exact, no tokenizer in the loop
    chat = "chat"  # messages as text, as chat clients send them; the router tokenizes


class HistoryEdit(Enum):
    """How the client edits a conversation's history before a turn, as chat clients do."""

    none = "none"
    strip_reply = "strip_reply"  # the previous reply's first half dropped (reasoning stripped)
    change_message = "change_message"  # two tokens of an earlier message swapped (edited)
    mixed = "mixed"  # either, drawn per edited turn


class Command(Enum):
    """What ``python -m pdbench`` does (``python -m pdbench VERB`` or ``command=VERB``).

    A new verb is a member here plus its handler in ``pdbench.cli.COMMANDS``. The verb
    ``check`` is no command: it validates whatever command the line names, then stops.
    """

    run = "run"  # plan, launch and follow the benchmark (the default)
    status = "status"  # jobs, their states and the Points of a run dir
    transfer_bench = "transfer_bench"  # KV-shaped NIXL transfer bench (no vLLM)
    preflight = "preflight"  # the node checks every job runs first, alone (starts no server)
    serve = "serve"  # start one deployment and serve any client until stopped (no Point)
    stop = "stop"  # end every process of a run dir still alive on this machine


class TrackingBackend(Enum):
    none = "none"
    wandb = "wandb"


# Closed sets whose values go out as they are (vLLM flags, W&B, JSON records): StrEnums, so a
# value is its own text; composition refuses any other with the choices named.


class Dtype(StrEnum):
    """vLLM's ``--dtype`` choices (``auto``: the checkpoint's own)."""

    auto = "auto"
    float32 = "float32"
    float = "float"
    float16 = "float16"
    half = "half"
    bfloat16 = "bfloat16"


class KvBufferDevice(StrEnum):
    """Where vLLM's NIXL connector keeps the KV it moves."""

    cpu = "cpu"
    cuda = "cuda"


class Arrival(StrEnum):
    """How turns are offered (``pdbench.plan.arrivals``): closed-loop waves, or open loop."""

    waves = "waves"  # every conversation's turn t, then t + 1; at most `concurrency` in flight
    poisson = "poisson"  # open loop: exponential gaps at request_rate turns/s
    gamma = "gamma"  # open loop: gamma gaps of the same mean, CV `burstiness`


class LengthDistribution(StrEnum):
    """How drawn token counts spread around their mean (``pdbench.plan.lengths``)."""

    uniform = "uniform"
    lognormal = "lognormal"


class KvLoadFailurePolicy(StrEnum):
    """What vLLM does with a request whose KV did not load."""

    recompute = "recompute"
    fail = "fail"


class CpuServerStart(StrEnum):
    """How a task starts its CPU servers."""

    fork = "fork"
    exec = "exec"


class TrackingMode(StrEnum):
    """W&B's modes."""

    offline = "offline"
    online = "online"
    disabled = "disabled"


# ``continue`` is a keyword: the members are named in a list.
OnFailure = StrEnum("OnFailure", [("continue", "continue"), ("stop", "stop")])
OnFailure.__doc__ = "What a launch does after a failed Deployment (``launch.on_failure``)."


@dataclass
class ClusterConfig:
    """Where jobs run and what each node offers."""

    # The cluster file's name (conf/cluster/<name>.yaml), shown in the dry run and records.
    name: str = "local"
    # local processes, SLURM jobs, or submitit's in-process debug executor.
    executor: ExecutorKind = ExecutorKind.local
    # Nodes one job may use; the topology's instances are placed on them.
    nodes: int = bounded(1, low=1, high=10_000)
    # GPUs of a node; 0: a CPU cluster (vLLM-CPU, CPU defaults chosen by by_device).
    gpus_per_node: int = bounded(0, low=0, high=64)
    # Memory of one GPU in GiB as nvidia-smi reports it (memory.total MiB / 1024); 0: unknown,
    # the weights-fit check is skipped. The preflight compares it with the nodes' GPUs.
    gpu_memory_gib: float = bounded(0.0, low=0, high=4096)
    # Dense bf16 TFLOPS of one GPU (H100 SXM: 989); 0: unknown, nothing is estimated from it.
    # The prefill wave's expected time (pdbench/plan/prefill_wave.py) sizes the lease premise
    # and the dry run's Points per attempt.
    gpu_tflops: float = bounded(0.0, low=0, high=100_000)
    cpus_per_node: int = bounded(
        0, low=0, high=4096
    )  # 0: the cores of the machine running the driver
    # sbatch --partition; "": the site's default.
    partition: str = ""
    # sbatch --account; "": none.
    account: str = ""
    # sbatch --qos; "": none.
    qos: str = ""
    # A job's time limit (sbatch --time); a job cut by it is requeued (max_requeues).
    time_limit_min: int = bounded(60, low=1, high=43_200)
    # Seconds before the time limit SLURM sends USR2 (sbatch --signal=USR2@N): the job
    # checkpoints, requeues itself and stops its servers; the requeued job measures the
    # Points not recorded ok. 0: 120 s, at most half the limit. Give it the teardown's time.
    signal_delay_s: int = bounded(0, low=0, high=86_400)
    # How many times a job cut by its time limit is requeued (submitit's max_num_timeout,
    # whose own default, 3, stopped long sweeps part-way). 0: one per Point of the job, the
    # most a sweep can need, since an attempt that records no Point is not requeued.
    max_requeues: int = bounded(0, low=0, high=10_000)
    # sbatch/srun --cpus-per-task of the one task per node; 0: cpus_per_node, else (whole
    # nodes: exclusive or GPUs) every core SLURM allocates on the node.
    cpus_per_task: int = bounded(0, low=0, high=4096)
    mem_gb: int = bounded(0, low=0, high=100_000)  # 0: SLURM's default
    # sbatch --constraint (node features); "": none.
    constraint: str = ""
    # sbatch --exclusive: the nodes run nothing else.
    exclusive: bool = False
    # SLURM array jobs running at once (one job per Deployment).
    array_parallelism: int = bounded(4, low=1, high=10_000)
    # sbatch --wckey; "": none (submitit would write --wckey=submitit, which sites that
    # enforce wckeys reject).
    wckey: str = ""
    # Further sbatch fields by name (submitit's slurm_additional_parameters).
    additional_parameters: dict[str, Any] = field(default_factory=dict)
    # Shell lines the batch script runs on the host before the tasks (module load ...).
    setup: list[str] = field(default_factory=list)
    # Environment of every task (and, in containers, passed into the image).
    env: dict[str, str] = field(default_factory=dict)
    python: str = ""  # interpreter on the nodes; "": the driver's sys.executable
    # pyxis/enroot containers (SLURM only): each task runs in this image (an enroot URI like
    # nvcr.io#nvidia/pytorch:25.01-py3, or a squashfs path on the nodes); "": no container.
    container_image: str = ""
    # Bind mounts SRC:DST[:FLAGS] (flags joined by '+', e.g. ro+rprivate): the run dir, the
    # models, the code. pyxis --container-mounts.
    container_mounts: list[str] = field(default_factory=list)
    container_workdir: str = ""  # pyxis --container-workdir; "": the image's
    # The image holds pdbench, vLLM 0.32.0 and NIXL (built from containers/pdbench-gpu.Dockerfile):
    # the tasks run its interpreter (cluster.python, e.g. python3) and its `vllm serve`.
    # false: the image provides only the OS/CUDA and a mount brings the venv (cluster.python
    # its absolute path).
    container_has_pdbench: bool = False
    # pyxis --container-mount-home; false (--no-container-mount-home): the home directory's
    # ~/.local site-packages and caches stay out of the image's Python.
    container_mount_home: bool = False
    # The image holds SLURM's client (scontrol) set up for this cluster, so a job can requeue
    # itself from inside it at its time limit (submitit runs scontrol requeue in the task).
    # false (the default, as in NGC and vLLM images): a run whose jobs need more than one
    # attempt is refused before submission, with a time limit that fits one.
    container_has_slurm: bool = False
    # Further srun options for every task (e.g. --mpi=none, --container-remap-root); the
    # options pdbench sets itself (output, error, cpus-per-task, containers) are refused.
    srun_args: list[str] = field(default_factory=list)


@dataclass
class ModelConfig:
    """The served model's shape; ``path`` empty with ``generate`` builds a tiny random Llama."""

    # The model's name as the servers serve it (--served-model-name) and records name it.
    name: str = MISSING
    # Weights directory or hub id every node reads; "" with generate: the tiny model built here.
    path: str = ""
    # Build a random-weight Llama of this shape (and its tokenizer) under cache_dir; no download.
    generate: bool = False
    # Transformer layers (config.json num_hidden_layers).
    num_layers: int = bounded(MISSING, low=1, high=10_000)
    # Model width (config.json hidden_size).
    hidden_size: int = bounded(MISSING, low=1, high=MANY)
    # Query heads (config.json num_attention_heads).
    num_attention_heads: int = bounded(MISSING, low=1, high=10_000)
    # KV heads (config.json num_key_value_heads): with head_dim, the KV bytes per token.
    num_kv_heads: int = bounded(MISSING, low=1, high=10_000)
    head_dim: int = bounded(0, low=0, high=65_536)  # 0: hidden_size // num_attention_heads
    # MLP width (config.json intermediate_size).
    intermediate_size: int = bounded(MISSING, low=1, high=10 * MANY)
    # Vocabulary size (config.json vocab_size).
    vocab_size: int = bounded(MISSING, low=1, high=10 * MANY)
    # Context length the servers allow (--max-model-len): bounds history plus turn.
    max_model_len: int = bounded(2048, low=1, high=TOKENS)
    # Weights' and activations' dtype (vLLM --dtype).
    dtype: Dtype = Dtype.bfloat16
    tie_word_embeddings: bool = False  # config.json's; true: one embedding matrix, not two
    # Seed of the generated model's random weights.
    seed: int = bounded(0, low=0, high=SEED)

    @property
    def resolved_head_dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    def shape(self) -> ModelShape:
        """These settings as the model's shape (``records.model``: declared there once)."""
        given = {name: getattr(self, name) for name in ModelShape.field_names()}
        given["dtype"] = getattr(self.dtype, "value", self.dtype)
        return ModelShape.from_dict(given)

    def parameter_count(self) -> int:
        """Parameters of this Llama-shaped decoder (``connector.layout``'s arithmetic)."""
        return parameters_of(self, self.resolved_head_dim)


@dataclass
class RoleSpec:
    """How many instances of one role and the tensor-parallel size of each."""

    # Instances of this role (0: none).
    count: int = bounded(1, low=0, high=1000)
    # Tensor-parallel size of each instance (GPUs, or CPU ranks).
    tp: int = bounded(1, low=1, high=1024)


@dataclass
class TopologyConfig:
    """The instances of a deployment: prefill and decode roles (``count: 0`` for none)."""

    # The topology file's name (conf/topology/<name>.yaml).
    name: str = "1p1d"
    # Prefill instances and the TP of each.
    prefill: RoleSpec = field(default_factory=RoleSpec)
    # Decode instances and the TP of each.
    decode: RoleSpec = field(default_factory=RoleSpec)
    # Aggregated instances (prefill and decode in one server; the agg flow's).
    agg: RoleSpec = field(default_factory=lambda: RoleSpec(count=0, tp=1))
    # Decode instances on the prefill instances' node or on other nodes.
    placement: Placement = Placement.same_node


@dataclass
class TransportConfig:
    """How KV moves between instances: NIXL backend, memory kind and UCX settings."""

    # The transport file's name (conf/transport/<name>.yaml): what the answer calls the fabric.
    name: str = "dram"
    # Where vLLM's NIXL connector keeps the KV it moves (kv_buffer_device).
    kv_buffer_device: KvBufferDevice = KvBufferDevice.cpu
    # NIXL backends of the connector (kv_connector_extra_config backends).
    backends: list[str] = field(default_factory=lambda: ["UCX"])
    # UCX_TLS of every P/D server; "": UCX's own choice.
    ucx_tls: str = ""
    # UCX_NET_DEVICES of every P/D server (e.g. mlx5_0:1); "": UCX's own choice.
    ucx_net_devices: str = ""
    # One NIC per GPU, by the GPU's number on the node (nvidia-smi's index where SLURM does
    # not renumber): each TP rank's NIXL agent is pinned to its own GPU's NIC (its
    # UCX_NET_DEVICES, e.g. ["mlx5_0:1", "mlx5_1:1", ...]); UCX otherwise picks each rank's
    # NIC itself, which may not be the one nearest the GPU. []: UCX's choice (the default).
    nics_by_gpu: list[str] = field(default_factory=list)
    # UCX transports (names or aliases: rc, sm, cuda...) at least one of which must carry
    # the KV: the preflight checks each node has one, Points are flagged when none did.
    # []: no expectation. Only intra-node ones (cuda_ipc, shared memory): KV stays on a node.
    expected_ucx_transports: list[str] = field(default_factory=list)
    expected_gb_s: float = bounded(
        0.0, low=0, high=100_000
    )  # what the link should give; 0: unknown, no flag raised
    # The transfer preflight (one KV-shaped NIXL read before any server starts) fails a run
    # reading under this share of expected_gb_s; 0 (or expected_gb_s 0, as on CPU): no floor.
    preflight_floor_share: float = bounded(0.1, low=0, high=1)
    # Further environment of every P/D server for this transport (UCX_* settings).
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class FlowConfig:
    """Which flows to measure and the connector knobs they need."""

    # Axes (pdbench/config/axes.py): a value or a list; every value is measured.
    flows: list[Flow] = axis(Level.point, [Flow.agg, Flow.recompute, Flow.pull])
    # Below this many tokens D holds for the conversation, P recomputes instead of pulling;
    # each value its own Deployment (a router setting of the servers it starts).
    kv_recompute_threshold: list[int] = axis(Level.deployment, [64], low=0, high=TOKENS)
    # Seconds D keeps a turn's blocks for P to pull (vLLM's lease); each its own Deployment.
    decoder_kv_blocks_ttl_s: list[int] = axis(Level.deployment, [60], low=0, high=WEEK_S)
    # Servers' KV occupancy sampled this often during each Point (kv_timeline; 0: off).
    kv_sample_period_s: float = bounded(0.5, low=0, high=3600)
    # After each Point's load, sample on until the decode instances are back at their
    # starting occupancy, at most TTL + 5 s: the blocks the TTL alone holds, measured (and
    # the next Point starts without them).
    kv_tail: bool = False
    # decode_first: D serves a turn alone when it holds at least this share of the prompt.
    cache_hit_threshold: float = bounded(0.8, low=0, high=1)
    # decode_first: the flow of a turn D does not serve alone (pull or recompute).
    decode_first_fallback: Flow = Flow.pull
    # flow policy: the policy.json (``python -m analysis`` of an earlier run) whose rule the
    # router applies per turn (pdbench/results/policy_rule.py). Its entry must be for this
    # deployment (model, transport, TP pair, topology class, block size); policy_force runs
    # the nearest entry anyway, and the records say so.
    policy: str = ""
    # Run the policy file's nearest entry when none is for this deployment (warned, recorded).
    policy_force: bool = False
    # A request that names no conversation (no X-Session-ID, X-Correlation-ID, ...): the
    # router finds the conversation whose tokens on D its prompt extends (a prefix match),
    # so clients that resend their history get pulls with no header. Operational: pdbench's
    # own client names its conversations. false: such a request stands alone.
    match_prefix: bool = True
    # The flow `python -m pdbench serve` serves (each one-flow group file names its own);
    # null: the first of flows. Operational: nothing measured depends on it.
    serve: Optional[Flow] = None  # noqa: UP045 - OmegaConf 2.3 reads Optional, not "X | None"


class TraceFormat(StrEnum):
    """The trace formats pdbench reads (``pdbench.traffic.load`` reads them)."""

    auto = "auto"  # detected from the file's content
    mooncake = "mooncake"  # JSONL: timestamp (ms), input_length, output_length, hash_ids
    openai = "openai"  # JSON: [{"id", "messages": [{"role", "content"}, ...]}, ...]
    pdbench = "pdbench"  # a router's request log (logs/<deployment>/router_requests.jsonl)


class TraceTiming(StrEnum):
    """When a replayed trace's turns go out."""

    auto = "auto"  # recorded when the trace has times, else the workload's arrival settings
    recorded = "recorded"  # open loop at the trace's times / speedup (a turn also waits for
    # its conversation's previous one to be answered)
    arrival = "arrival"  # the workload's own: waves at a concurrency, or poisson/gamma


@dataclass
class TraceConfig:
    """A trace to replay (workload=trace; docs/traffic.md): read, cut to a
    window, scaled to the machine, offered as recorded or by the workload's arrivals."""

    path: str = ""  # the trace file (relative paths: from where pdbench is started)
    format: TraceFormat = TraceFormat.auto  # mooncake | openai | pdbench; auto: detected
    block_tokens: int = bounded(512, low=1, high=TOKENS)  # mooncake: tokens a hash id stands for
    # every length times this (at least 1 token): 1/64 turns a 6,758-token prompt into 106
    length_scale: float = bounded(1.0, low=0, high=1, above=True)
    speedup: float = bounded(1.0, low=0, high=MANY, above=True)  # recorded times / this
    # When turns go out: recorded times, the workload's arrivals, or auto (recorded if the trace has
    # times).
    timing: TraceTiming = TraceTiming.auto
    start_s: float = bounded(0.0, low=0, high=100 * WEEK_S)  # the window, on the trace's clock
    end_s: float = bounded(0.0, low=0, high=100 * WEEK_S)  # 0: to the end
    max_requests: int = bounded(0, low=0, high=1000 * MANY)  # 0: all; else the first N
    min_turns: int = bounded(1, low=1, high=10_000)  # conversations with fewer are left out
    max_conversations: int = bounded(0, low=0, high=1000 * MANY)  # 0: all; else the first N
    # set at launch to the file's sha256 (pdbench/cli.py): Points of an edited trace are new
    # Points, never the old file's resumed
    sha256: str = ""


@dataclass
class WorkloadConfig:
    """Multi-turn conversations: N conversations x T turns of U user and O output tokens."""

    # How conversations are shaped: multi_turn, long_doc, agentic, or a trace replayed.
    kind: WorkloadKind = WorkloadKind.multi_turn
    # Point axes (servers stay up): a value or a list, every value measured.
    conversations: list[int] = axis(Level.point, [4], low=1, high=MANY)  # the working set
    # Turns per conversation.
    turns: int = bounded(4, low=1, high=10_000)
    # > turns: each conversation has a number of turns drawn uniformly in [turns, turns_max]
    turns_max: int = bounded(0, low=0, high=10_000)
    # Tokens of each user message (U).
    user_tokens: int = bounded(64, low=1, high=TOKENS)
    # Tokens of each answer (O, max_tokens with ignore_eos).
    output_tokens: int = bounded(16, low=1, high=TOKENS)
    user_tokens_jitter: float = bounded(
        0.0, low=0, high=10
    )  # user message lengths spread around U (0: all U), seeded
    output_tokens_jitter: float = bounded(
        0.0, low=0, high=10
    )  # output lengths spread around O (0: all O), seeded
    # How lengths spread: "uniform" in mean * (1 +- jitter), or "lognormal" (sigma = jitter,
    # same mean, a long tail clipped at mean * (1 + 3 * jitter)).
    length_distribution: LengthDistribution = LengthDistribution.uniform
    history_tokens: list[int] = axis(Level.point, [0], low=0, high=TOKENS)  # the prefix
    # Below 1: each conversation's prefix length is lognormal with mean history_tokens and
    # median history_median_ratio x mean (vLLM benchmarks/multi_turn's parameters), at most
    # history_tokens_max (0: 3 x the mean); 1: every prefix is history_tokens long.
    history_median_ratio: float = bounded(1.0, low=0, high=1, above=True)
    # The lognormal prefixes' cap (0: 3 x the mean).
    history_tokens_max: int = bounded(0, low=0, high=TOKENS)
    common_prefix_tokens: int = bounded(
        0, low=0, high=TOKENS
    )  # tokens every conversation starts with (a system prompt)
    # completions: token-id prompts (exact lengths); chat: messages as text, as chat clients send.
    api: ClientApi = ClientApi.completions
    # Edits of the history before a turn (>= 2), on history_edit_share of the turns (seeded:
    # the same turns in every flow); the router must then recompute, never pull.
    history_edit: HistoryEdit = HistoryEdit.none
    # Share of turns (>= 2) whose history is edited (history_edit).
    history_edit_share: float = bounded(0.5, low=0, high=1)
    concurrency: list[int] = axis(Level.point, [4], low=1, high=MANY)  # the load
    # waves: request_rate (> 0) spaces each wave's starts, 0 as fast as concurrency allows;
    # poisson, gamma: an open loop offering request_rate turns/s (same sequence every flow)
    arrival: Arrival = Arrival.waves
    request_rate: float = bounded(0.0, low=0, high=MANY)  # requests/s
    burstiness: float = bounded(
        1.0, low=0, high=10, above=True
    )  # gamma arrivals: the gaps' coefficient of variation (1: Poisson)
    # a request's whole answer; below a second nothing a server does finishes
    request_timeout_s: float = bounded(120.0, low=1, high=WEEK_S)
    # Seed of the conversations' token ids and lengths (repetition r derives its own).
    seed: int = bounded(0, low=0, high=SEED)
    # Independent repetitions of every (flow, history length): Points of their own, with fresh
    # conversations (token ids from ``pdbench.plan.points.repetition_seed(seed, r)``) and their
    # own cache salt. Repetition r has the same token ids in every flow (requests pair across
    # flows by conversation and turn). 1 gives no interval (refused), 2 a wide one (warned).
    repetitions: int = bounded(3, low=1, high=10_000)
    # Seed of each Deployment's run order: randomized complete blocks, one block per (history
    # length, repetition) holding every flow in a shuffled order (pdbench/plan/points.py).
    order_seed: int = bounded(0, low=0, high=SEED)
    trace: TraceConfig = field(default_factory=TraceConfig)  # kind=trace: what to replay


@dataclass
class ServerConfig:
    """vLLM server flags shared by every instance of a deployment."""

    # KV-cache block size in tokens (vLLM --block-size); KV moves in whole blocks.
    block_size: int = bounded(32, low=1, high=4096)
    # P's prefix cache (vLLM --enable-prefix-caching); off: P computes what it does not pull.
    prefill_prefix_caching: bool = False
    # D's prefix cache: D keeps finished turns' blocks to serve the next turn's pull.
    decode_prefix_caching: bool = True
    # Requests a server batches at once (vLLM --max-num-seqs); more wait in its queue.
    max_num_seqs: int = bounded(16, low=1, high=MANY)
    # Share of a GPU's memory vLLM may use (--gpu-memory-utilization); weights plus KV must fit.
    gpu_memory_utilization: float = bounded(0.85, low=0, high=1, above=True)
    # vLLM-CPU's KV cache per instance in GiB (VLLM_CPU_KVCACHE_SPACE).
    cpu_kvcache_space_gb: int = bounded(1, low=0, high=100_000)
    # Cores (OMP threads) of each TP rank on CPU builds: an instance of TP n is pinned to
    # n x this many cores, one set per rank (VLLM_CPU_OMP_THREADS_BIND "a|b").
    cpu_threads_per_instance: int = bounded(1, low=1, high=4096)
    # Let ranks share cores when the plan needs more than a node has (local executor):
    # an instance's ranks share its own cores first (docs/flows.md, "Heterogeneous TP on CPU").
    cpu_share_cores: bool = False
    # KV-cache blocks of each prefill / decode instance (vLLM --num-gpu-blocks-override);
    # 0: what memory holds. A small prefill cache makes P evict (cache_pressure); a small
    # one everywhere makes NIXL's handshake register fewer blocks.
    prefill_kv_blocks: int = bounded(0, low=0, high=1000 * MANY)
    # See prefill_kv_blocks (decode instances).
    decode_kv_blocks: int = bounded(0, low=0, high=1000 * MANY)
    # The three below are chosen per cluster kind in conf/config.yaml (``by_device``): vLLM's
    # own values on GPU clusters, the CPU presets' on CPU ones. Set them to override.
    # CUDA graphs on (vLLM's default); true only where there are none (vLLM-CPU).
    enforce_eager: bool = False
    # Seconds a server may take to answer /health: 70B from a shared filesystem reads
    # ~140 GB per instance, then compiles and captures CUDA graphs.
    startup_timeout_s: float = bounded(1800.0, low=10, high=WEEK_S)  # no vLLM starts faster
    # HTTP port of instance i: base_port + i.
    base_port: int = bounded(8100, low=1, high=PORT)
    # NIXL side-channel port of instance i (VLLM_NIXL_SIDE_CHANNEL_PORT): base + 64 x i.
    side_channel_base_port: int = bounded(5600, low=1, high=PORT)
    # VLLM_PORT of instance i: vllm_base_port + 16 * i, where vLLM's own ports start (torch
    # distributed init of TP ranks...). Unset, each server takes a free port and releases it
    # before binding: two TP > 1 servers starting at once on one node can pick the same.
    vllm_base_port: int = bounded(19000, low=1, high=PORT)
    # The router's port: where clients (pdbench's and yours, under serve) send requests.
    router_port: int = bounded(8000, low=1, high=PORT)
    # What vLLM does when a KV pull fails (e.g. the peer's lease on the blocks ran out):
    # "fail" the request (vLLM's default, an HTTP 500: what GPU clusters use, so that a broken
    # transport cannot pass for a slow one) or "recompute" the missing blocks (the request
    # succeeds; the Point counts and flags the failure; the CPU presets' choice).
    kv_load_failure_policy: KvLoadFailurePolicy = KvLoadFailurePolicy.fail
    # Further vllm serve flags for every instance (flags pdbench sets itself are refused).
    extra_args: list[str] = field(default_factory=list)
    # Further environment of every P/D server (PDBENCH_* knobs, VLLM_* settings).
    env: dict[str, str] = field(default_factory=dict)
    # How a task starts its CPU servers: "fork" them from one process that imported vLLM
    # once (~10 of a server's ~15 CPU-seconds of start; same command, environment, tokens),
    # or "exec" each on its own. GPU servers are always started on their own.
    cpu_start: CpuServerStart = CpuServerStart.fork


@dataclass
class ConnectorConfig:
    """Options of pdbench's own connector pieces."""

    # Trace every NIXL transfer (bytes, seconds, descriptors) into traces/<deployment>/.
    trace: bool = False


@dataclass
class TrackingConfig:
    # none, or wandb: each Point's summary logged to Weights & Biases.
    backend: TrackingBackend = TrackingBackend.none
    # W&B project.
    project: str = "pdbench"
    # W&B entity (team or user); "": the account's default.
    entity: str = ""
    # W&B mode: offline (the default: files under the run dir, wandb sync later), online, disabled.
    mode: TrackingMode = TrackingMode.offline


@dataclass
class LaunchConfig:
    # Print the plan, commands, environments and sbatch scripts; submit and write nothing.
    dry_run: bool = False
    # The transfer bench skips the cases the dir recorded ok (a run always skips its ok Points).
    resume: bool = True
    # When a Deployment fails (its job failed or a Point of it is not ok: servers that did
    # not start or died, failed requests): "continue" with the next Deployment, or "stop"
    # (later Deployments are not started; on SLURM the array's other jobs are cancelled).
    # Their Points stay pending: rerun the same command to resume.
    on_failure: OnFailure = OnFailure["continue"]
    # A launch into a dir whose launches measured something else (pdbench/results/identity.py: not
    # timeouts, ports or paths) is refused; true adds its Deployments and Points anyway.
    allow_mixed: bool = False
    # Each job's first step: one preflight per node before any server starts (DESIGN.md, "On
    # a real cluster"); a failed check fails the Deployment with one line. false: skip it.
    preflight: bool = True
    # Refuse a run whose experiment cannot answer its question (pdbench/validate/premises.py:
    # a TTL P never pulls at, a working set P never evicts, one repetition). false: launch it
    # anyway (a pipeline test); the analysis then says what it cannot decide.
    check_premises: bool = True
    # SLURM: submit and return without following the jobs; `python -m pdbench status
    # dir=...` follows them (a -m sweep submits every job first, then follows them together).
    detach: bool = False


@dataclass
class SearchConfig:
    """The crossover search (``pdbench.plan.crossover_search``): with no history lengths given
    (``workload.history_tokens: []``) a run measures a log-spaced first pass over the usable
    range, then more lengths and repetitions where they narrow the crossover's 95% interval,
    until it is narrow enough or the budget is spent. Operational: Point ids do not depend
    on it (a Point at a length and repetition is the same Point, searched or gridded)."""

    # log-spaced lengths from min to max history tokens, workload.repetitions each; from 0:
    # no history (the shortest turn 2 there is), then log-spaced from 16 tokens
    first_pass_lengths: int = bounded(8, low=2, high=1000)
    # The first pass's shortest history (0: start with no history).
    min_history_tokens: int = bounded(0, low=0, high=TOKENS)
    max_history_tokens: int = bounded(
        0, low=0, high=TOKENS
    )  # 0: the longest the model's context leaves for the history
    round_repetitions: int = bounded(
        2, low=1, high=1000
    )  # added per chosen length in each later round
    target_relative_width: float = bounded(
        0.25, low=0, high=1, above=True
    )  # stop once the interval is this share of the estimate
    budget_min: float = bounded(
        8.0, low=0, high=100_000, above=True
    )  # measuring time (Points' own durations, all loads), minutes
    max_points: int = bounded(
        600, low=1, high=MANY
    )  # at most this many Points per Deployment, first pass included


@dataclass
class SloConfig:
    """What a turn must meet to count toward goodput (DistServe's: the share of turns, and
    turns per second, meeting both). Operational: the analysis applies them to the records
    (``analysis/questions/policy_check.py``), nothing measured depends on them. 0: no bound."""

    ttft_ms: float = bounded(0.0, low=0, high=10 * MANY)  # time to first token, client side
    tpot_ms: float = bounded(
        0.0, low=0, high=10 * MANY
    )  # time per output token after the first (vllm bench serve's TPOT)


@dataclass
class RunConfig:
    """One composed run: everything ``python -m pdbench`` needs."""

    # The run's name: the default run dir is results/<name>-<time>; presets set their own.
    name: str = "run"
    # Where records, logs and the manifest go; rerun with the same dir to resume.
    dir: str = MISSING
    # The generated tiny models and other build products, shared between runs.
    cache_dir: str = MISSING
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    topology: TopologyConfig = field(default_factory=TopologyConfig)
    transport: TransportConfig = field(default_factory=TransportConfig)
    flow: FlowConfig = field(default_factory=FlowConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    connector: ConnectorConfig = field(default_factory=ConnectorConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    launch: LaunchConfig = field(default_factory=LaunchConfig)
    bench: TransferBenchConfig = field(default_factory=TransferBenchConfig)
    search: SearchConfig = field(default_factory=SearchConfig)
    slo: SloConfig = field(default_factory=SloConfig)
    # What python -m pdbench does (also given as its first word: serve, status, ...).
    command: Command = Command.run


GROUP_SCHEMAS: dict[str, type] = {
    "cluster": ClusterConfig,
    "model": ModelConfig,
    "topology": TopologyConfig,
    "transport": TransportConfig,
    "flow": FlowConfig,
    "workload": WorkloadConfig,
    "tracking": TrackingConfig,
}


def by_device(gpus_per_node: int, on_gpus: Any, on_cpus: Any) -> Any:
    """The value for a GPU cluster (``gpus_per_node > 0``) or a CPU one.

    conf/config.yaml uses it as ``${pdbench.by_device:${cluster.gpus_per_node},GPU,CPU}`` for
    defaults that must differ (``server.kv_load_failure_policy``, ``enforce_eager``,
    ``startup_timeout_s``); ``--cfg job --resolve`` and the manifest show the value it chose.
    """
    return on_gpus if int(gpus_per_node) > 0 else on_cpus


def register_configs() -> None:
    """Put the schemas in Hydra's ConfigStore (``base_run`` and ``<group>/base_<group>``) and
    the ``pdbench.*`` resolvers the YAML files use."""
    from hydra.core.config_store import ConfigStore  # lazy: hydra only where configs are composed

    OmegaConf.register_new_resolver("pdbench.by_device", by_device, replace=True)
    store = ConfigStore.instance()
    store.store(name="base_run", node=RunConfig)
    for group, schema in GROUP_SCHEMAS.items():
        store.store(group=group, name=f"base_{group}", node=schema)
