"""What an experiment assumes, checked before anything starts (pure).

A config can be valid for vLLM and still unable to answer its question: the run completes,
its Points carry the values asked for, and only the analysis (or nobody) says later that
nothing was there to measure. Each premise below is refused (``PREMISE_RULES``) where the
answer cannot exist, and warned about (``PREMISE_WARNINGS``) where it will likely come out
inconclusive. ``launch.check_premises=false`` launches such a config anyway (a pipeline test
with one repetition, say); the concurrency rule is no premise but a label, always checked.

- **P can pull**: with ``pull`` (or ``decode_first`` falling back to pull) measured, every
  TTL must leave P a pull window (``pdbench.plan.kv_lease``): vLLM's P declines a read
  within 5 s of D's expiry, so a TTL of 6 s or less never pulls and "pull" measures
  recompute. Where the GPU's speed is known (``cluster.gpu_tflops``), the window must also
  outlast the first prefill wave (``pdbench.plan.prefill_wave``): conversations whose first
  turn P finished early send their next turn while P still prefills the others', and their
  lease runs out in P's queue (``recompute_expired`` under the name pull).
- **P evicts** (a working-set sweep, ``workload.conversations`` of two or more values,
  the ``cache_pressure`` question): P keeps prefix caching, and the largest working set
  (conversations x the blocks of a conversation's longest prompt and its output) exceeds
  P's KV blocks; otherwise P never evicts and pull has nothing to bring back.
- **Concurrency within the conversations**: a conversation's turns go one after another,
  so no more requests are in flight than there are conversations; a higher concurrency is
  never measured, yet the Points would carry it.
- **An interval**: every verdict comes with a 95% interval over the repetitions; one
  repetition gives none (refused), two give one with a t quantile of 12.7 (warned).
"""

from __future__ import annotations

import math

from pdbench.config.problems import ConfigProblem, Problems, Rule
from pdbench.config.schema import Command, Flow, FlowConfig, RunConfig, WorkloadKind
from pdbench.plan.kv_lease import VLLM_DECLINE_MARGIN_S, pull_window_s, shortest_pulling_ttl_s
from pdbench.plan.lengths import longest_history
from pdbench.plan.prefill_wave import prefill_wave
from pdbench.validate import capacity

LEAST_REPETITIONS = 2  # the fewest with an interval at all
ENOUGH_REPETITIONS = 3  # the fewest whose interval is not mostly noise (t = 4.3)
ANYWAY = "launch.check_premises=false to measure it anyway"


def _measures_points(cfg: RunConfig) -> bool:
    """Whether ``cfg`` launches Points (the run command): premises are about Points."""
    return cfg.command is Command.run


def premises_apply(cfg: RunConfig) -> bool:
    """Whether the premise checks run: a run that has not opted out of them."""
    return _measures_points(cfg) and cfg.launch.check_premises


def pulling_flows(cfg: RunConfig) -> list[Flow]:
    """The measured flows in which P pulls history from D."""
    f = cfg.flow
    return [
        flow
        for flow in dict.fromkeys(f.flows)
        if flow is Flow.pull or (flow is Flow.decode_first and f.decode_first_fallback is Flow.pull)
    ]


def ttls_measured(f: FlowConfig) -> tuple[str, list[float]]:
    """(the setting that names them, the TTLs the run's Deployments measure)."""
    return "flow.decoder_kv_blocks_ttl_s", list(f.decoder_kv_blocks_ttl_s)


def check_pull_window(cfg: RunConfig) -> list[ConfigProblem]:
    """Every TTL of a run that measures pulling leaves P a window to pull in."""
    flows = pulling_flows(cfg)
    if not flows or not premises_apply(cfg):
        return []
    field, ttls = ttls_measured(cfg.flow)
    shortest = shortest_pulling_ttl_s()
    refused_elsewhere = 0  # check_flows' lower bound
    out = Problems()
    for ttl in dict.fromkeys(ttls):
        window = pull_window_s(ttl)
        if window > 0 or ttl < refused_elsewhere:
            continue
        names = ", ".join(flow.value for flow in flows)
        out.add(
            field,
            ttl,
            f"P never pulls at this TTL: vLLM's P declines a read within "
            f"{VLLM_DECLINE_MARGIN_S:g} s of D's expiry and the router leaves P min(5 s, TTL/5) "
            f"to queue, so D's blocks are never offered ({window:+.1f} s); the {names} Points "
            "would measure recompute under the name pull",
            f"a TTL of {shortest} s or more, or {ANYWAY}",
        )
    return out


def check_lease_outlasts_a_wave(cfg: RunConfig) -> list[ConfigProblem]:
    """Every TTL of a pulling run leaves P a window longer than the first prefill wave at
    the run's longest history (skipped where ``cluster.gpu_tflops`` is unknown)."""
    flows = pulling_flows(cfg)
    if not flows or not premises_apply(cfg) or cfg.workload.request_rate > 0:
        return []  # spread arrivals (a request rate) make no wave
    wave = prefill_wave(cfg, longest_history(cfg))
    if wave is None:
        return []
    field, ttls = ttls_measured(cfg.flow)
    need = shortest_pulling_ttl_s(wave.seconds)
    out = Problems()
    for ttl in dict.fromkeys(ttls):
        window = pull_window_s(ttl)
        if window <= 0 or window > wave.seconds:
            continue  # an empty window is check_pull_window's
        names = ", ".join(flow.value for flow in flows)
        out.add(
            field,
            ttl,
            f"the router lets P pull for {window:.1f} s after D's answer, but the first wave "
            f"outlasts it ({wave.describe()}, cluster.gpu_tflops={wave.gpu_tflops:g}): the "
            "conversations P served first send their next turn while P still prefills the "
            f"others', their lease runs out in P's queue, and the {names} Points would "
            "measure recompute under the name pull",
            f"a TTL that covers the wave: {need} s or more; or fewer conversations in flight "
            f"(workload.concurrency), or more P instances; or {ANYWAY}",
        )
    return out


def conversation_blocks(cfg: RunConfig) -> int:
    """KV blocks of one conversation at its end: the longest history, every turn's user
    message and output (the working set P must hold to find it in its own cache)."""
    w, s = cfg.workload, cfg.server
    tokens = max(w.history_tokens or [0]) + w.turns * (w.user_tokens + w.output_tokens)
    return math.ceil(tokens / max(1, s.block_size))


def prefill_capacity_blocks(cfg: RunConfig) -> int:
    """P's KV blocks: ``server.prefill_kv_blocks``, else (CPU) what its cache space holds per
    rank; 0 when unknown (GPU memory decides at start)."""
    s, m = cfg.server, cfg.model
    if s.prefill_kv_blocks > 0:
        return s.prefill_kv_blocks
    if cfg.cluster.gpus_per_node > 0 or min(m.num_layers, m.num_kv_heads, s.block_size) <= 0:
        return 0
    if m.num_attention_heads <= 0:
        return 0
    per_block = s.block_size * capacity.kv_bytes_per_token(m, cfg.topology.prefill.tp)
    return s.cpu_kvcache_space_gb * capacity.GIB // per_block


def _sweeps_working_set(cfg: RunConfig) -> bool:
    return len(set(cfg.workload.conversations)) >= 2


def check_p_evicts(cfg: RunConfig) -> list[ConfigProblem]:
    """A working-set sweep (``cache_pressure``): P keeps a prefix cache the largest set
    overflows."""
    if not premises_apply(cfg) or not _sweeps_working_set(cfg) or cfg.topology.prefill.count < 1:
        return []
    s, counts = cfg.server, sorted(set(cfg.workload.conversations))
    if not s.prefill_prefix_caching:
        return [
            ConfigProblem(
                "server.prefill_prefix_caching",
                "false",
                f"P keeps no history of its own, so the working-set sweep "
                f"(workload.conversations={counts}) has nothing to evict: P computes "
                "every prompt in recompute at every working set and pull never recovers "
                "anything P lost (the eviction question needs P's own prefix cache)",
                f"server.prefill_prefix_caching=true, or {ANYWAY}",
            )
        ]
    blocks, held = conversation_blocks(cfg), prefill_capacity_blocks(cfg)
    largest = counts[-1] * blocks
    if not held or largest > held:
        return []
    past = held // blocks + 1
    source = (
        f"server.prefill_kv_blocks={s.prefill_kv_blocks}"
        if s.prefill_kv_blocks
        else f"what server.cpu_kvcache_space_gb={s.cpu_kvcache_space_gb} holds"
    )
    return [
        ConfigProblem(
            "workload.conversations",
            counts,
            f"the largest working set, {counts[-1]} conversations x {blocks} blocks = "
            f"{largest} blocks, fits P's {held} KV blocks ({source}): P never evicts, so every "
            "Point finds its history in P's own cache and pull has nothing to bring back",
            f"conversation counts from {past} on (e.g. [{max(1, past // 2)}, {past}, "
            f"{2 * past}]), or server.prefill_kv_blocks below {largest}, or {ANYWAY}",
        )
    ]


def check_concurrency(cfg: RunConfig) -> list[ConfigProblem]:
    """No Point is labelled with a concurrency its conversations cannot reach."""
    w = cfg.workload
    most = max(w.conversations, default=0)
    if most < 1 or not _measures_points(cfg) or w.kind is WorkloadKind.trace:
        return []  # a replay's conversations are the trace's
    where = (
        f"the largest of workload.conversations ({most})"
        if len(w.conversations) > 1
        else f"workload.conversations ({most})"
    )
    out = Problems()
    for concurrency in dict.fromkeys(w.concurrency):
        if concurrency > most:
            out.add(
                "workload.concurrency",
                concurrency,
                f"exceeds {where}: a conversation's turns go one after another, so at most "
                f"{most} requests are ever in flight, yet the Points would be labelled "
                f"concurrency {concurrency}",
                f"a concurrency of at most {most}, or workload.conversations={concurrency}",
            )
    return out


def check_pull_has_a_next_turn(cfg: RunConfig) -> list[ConfigProblem]:
    """A pull needs a turn 2: the first turn of a conversation has nothing on D to pull."""
    w = cfg.workload
    flows = pulling_flows(cfg)
    if not flows or not premises_apply(cfg) or w.kind is WorkloadKind.trace:
        return []
    if w.turns < 1 or max(w.turns, w.turns_max) >= 2:
        return []  # < 1: check_counts says so
    names = ", ".join(f.value for f in flows)
    return [
        ConfigProblem(
            "workload.turns",
            w.turns,
            f"gives every conversation one turn: nothing is ever on D for {names} to pull, so "
            "pull and recompute do the same work and no crossover or saving can be measured",
            f"workload.turns=2 or more, or {ANYWAY}",
        )
    ]


def check_repetitions(cfg: RunConfig) -> list[ConfigProblem]:
    """An interval needs two repetitions at least."""
    n = cfg.workload.repetitions
    if n < 1 or n >= LEAST_REPETITIONS or not premises_apply(cfg):
        return []  # < 1: check_counts says so
    return [
        ConfigProblem(
            "workload.repetitions",
            n,
            "gives no interval: every verdict is a 95% interval over independent repetitions, "
            "and with one the analysis can only say 'undetermined'",
            f"workload.repetitions={ENOUGH_REPETITIONS} or more, or {ANYWAY} (a pipeline test)",
        )
    ]


def warn_repetitions(cfg: RunConfig) -> list[ConfigProblem]:
    n = cfg.workload.repetitions
    if not LEAST_REPETITIONS <= n < ENOUGH_REPETITIONS or not premises_apply(cfg):
        return []
    return [
        ConfigProblem(
            "workload.repetitions",
            n,
            "gives intervals with 1 degree of freedom (t quantile 12.7): most verdicts will "
            "come out inconclusive",
            f"workload.repetitions={ENOUGH_REPETITIONS} or more",
        )
    ]


def warn_load_over_max_num_seqs(cfg: RunConfig) -> list[ConfigProblem]:
    """A load that puts more requests on one instance than vLLM runs at once
    (``server.max_num_seqs``): the excess waits in vLLM's queue, so that load measures the
    queue, not the batch it names."""
    if cfg.command is not Command.run or not cfg.workload.concurrency:
        return []
    top = max(cfg.workload.concurrency)
    roles = [r for r in (cfg.topology.prefill, cfg.topology.decode) if r.count > 0]
    per_instance = max((math.ceil(top / r.count) for r in roles), default=top)
    seqs = cfg.server.max_num_seqs
    if per_instance <= seqs:
        return []
    return [
        ConfigProblem(
            "server.max_num_seqs",
            seqs,
            f"is below the {per_instance} requests concurrency {top} puts on one instance: "
            "the rest wait in vLLM's queue, and that load measures the queue",
            f"server.max_num_seqs={per_instance} (or more instances, or a lower concurrency)",
        )
    ]


def warn_working_set_fits_nowhere(cfg: RunConfig) -> list[ConfigProblem]:
    """A working-set sweep whose smallest set already overflows P, or whose P size is not
    known here."""
    if not premises_apply(cfg) or not _sweeps_working_set(cfg):
        return []
    if not cfg.server.prefill_prefix_caching or cfg.topology.prefill.count < 1:
        return []
    counts = sorted(set(cfg.workload.conversations))
    blocks, held = conversation_blocks(cfg), prefill_capacity_blocks(cfg)
    if not held:
        return [
            ConfigProblem(
                "server.prefill_kv_blocks",
                0,
                "P's KV cache is what GPU memory holds, unknown here: whether the working "
                f"sets ({counts} conversations x {blocks} blocks) overflow it cannot be checked",
                "server.prefill_kv_blocks=N, fewer than the largest working set's blocks",
            )
        ]
    if counts[0] * blocks <= held:
        return []
    return [
        ConfigProblem(
            "workload.conversations",
            counts,
            f"even the smallest working set ({counts[0]} x {blocks} = {counts[0] * blocks} "
            f"blocks) overflows P's {held} blocks: no Point shows the flows while P's own "
            "cache holds the history, the reference the recovery is read against",
            f"add a count of at most {max(1, held // blocks)}",
        )
    ]


def premises_of(cfg: RunConfig) -> list[str]:
    """The premises that apply to ``cfg``, as each preset's header names them."""
    if not _measures_points(cfg):
        return []
    names = ["P pulls"] if pulling_flows(cfg) else []
    names += ["P evicts"] if _sweeps_working_set(cfg) else []
    return [*names, "repetitions", "concurrency"]


PREMISE_RULES: tuple[Rule, ...] = (
    check_concurrency,
    check_pull_has_a_next_turn,
    check_pull_window,
    check_lease_outlasts_a_wave,
    check_p_evicts,
    check_repetitions,
)
PREMISE_WARNINGS: tuple[Rule, ...] = (
    warn_repetitions,
    warn_working_set_fits_nowhere,
    warn_load_over_max_num_seqs,
)
