"""``workload=trace``: the trace is read, cut and scaled before anything starts, and refused
with the file, the line or conversation and the field when it cannot be replayed here (an
unreadable line, an empty cut, a conversation longer than the model's context at the scale
asked: the largest scale that fits is the fix)."""

from __future__ import annotations

import math

from pdbench.config.problems import ConfigProblem, Problems
from pdbench.config.schema import RunConfig, TraceTiming, WorkloadKind
from pdbench.plan.arrivals import OPEN
from pdbench.plan.deployments import POLICY_FLOWS
from pdbench.plan.kv_lease import pull_window_s
from pdbench.traffic.replay import Replay, plan_replay, token_counter
from pdbench.traffic.shape import shape_of
from pdbench.traffic.trace import TraceError
from pdbench.validate.premises import pulling_flows

REPLAY_MAX_S = 3600.0  # a replay offered over longer than this (one Point) is refused
FIX_PATH = "workload.trace.path=<a trace file> (python -m pdbench.traffic.examples makes one)"


def replay_of(cfg: RunConfig) -> Replay:
    """The replay ``cfg`` asks for (``TraceError`` when its trace cannot be read)."""
    count, counted_by = token_counter(cfg.model.path, cfg.model.generate)
    return plan_replay(cfg.workload.trace, cfg.workload.output_tokens, count, counted_by)


def check_trace(cfg: RunConfig) -> list[ConfigProblem]:
    w, out = cfg.workload, Problems()
    t = w.trace
    if w.kind is not WorkloadKind.trace:
        if t.path:
            out.add(
                "workload.trace.path",
                t.path,
                f"is read only by workload=trace, not {w.kind.value}",
                "workload=trace, or drop workload.trace.path",
            )
        return out
    if not t.path:
        out.add("workload.trace.path", '""', "workload=trace replays a trace file", FIX_PATH)
        return out
    if any(h != 0 for h in w.history_tokens) or len(w.history_tokens) != 1:
        out.add(
            "workload.history_tokens",
            w.history_tokens,
            "a replay takes its histories from the trace",
            "workload.history_tokens=[0]",
        )
    if len(w.conversations) > 1:
        out.add(
            "workload.conversations",
            w.conversations,
            "a replay's conversations are the trace's",
            "one value (workload.trace.max_conversations cuts them)",
        )
    if t.end_s and t.end_s <= t.start_s:
        out.add(
            "workload.trace.end_s",
            t.end_s,
            f"is not after start_s ({t.start_s:g})",
            "an end after the start, or 0: to the end",
        )
        return out
    try:
        replay = replay_of(cfg)
    except TraceError as err:
        out.add(
            "workload.trace.path",
            t.path,
            f"cannot be replayed: {err.where or 'the file'}: {err.problem}",
            err.fix or FIX_PATH,
        )
        return out
    except OSError as err:
        out.add("workload.trace.path", t.path, f"cannot be read ({err})", FIX_PATH)
        return out
    out += _replay_problems(cfg, replay)
    return out


def _replay_problems(cfg: RunConfig, replay: Replay) -> Problems:
    w, t, out = cfg.workload, cfg.workload.trace, Problems()
    if not replay.replayed.conversations:
        out.add(
            "workload.trace",
            _cut_text(cfg),
            f"leaves none of the trace's {replay.recorded.requests} requests",
            "a wider window (start_s, end_s), more max_requests, or a lower min_turns",
        )
        return out
    if t.timing is TraceTiming.recorded and not replay.recorded.timed:
        out.add(
            "workload.trace.timing",
            "recorded",
            f"the {replay.recorded.format.value} trace has no times",
            "workload.trace.timing=arrival (waves at workload.concurrency, or "
            "workload.arrival=poisson with workload.request_rate)",
        )
    longest, limit = replay.longest_context, cfg.model.max_model_len
    if longest > limit:
        fits = replay.largest_scale(limit)
        fix = (
            f"workload.trace.length_scale={fits:g} (the largest that fits), or fewer turns "
            "(workload.trace.max_requests), or a model with a longer context"
            if fits > 0
            else "a model with a longer context: one token per length already does not fit"
        )
        out.add(
            "workload.trace.length_scale",
            t.length_scale,
            f"leaves a conversation of "
            f"{longest:,} tokens (its last prompt and reply), over model.max_model_len "
            f"({limit:,})",
            fix,
        )
    shape = shape_of(replay.replayed)
    if replay.timing is TraceTiming.recorded and shape.duration_s > REPLAY_MAX_S:
        need = replay.speedup * shape.duration_s / REPLAY_MAX_S
        out.add(
            "workload.trace.speedup",
            t.speedup,
            f"replays the trace over "
            f"{shape.duration_s / 60:,.0f} min (at most {REPLAY_MAX_S / 60:.0f} min a Point)",
            f"workload.trace.speedup={math.ceil(need)} or more, or a shorter window "
            "(workload.trace.end_s, max_requests)",
        )
    if replay.timing is TraceTiming.arrival and w.arrival.value in OPEN and w.request_rate > 0:
        offered_s = replay.replayed.requests / w.request_rate
        if offered_s > REPLAY_MAX_S:
            out.add(
                "workload.request_rate",
                w.request_rate,
                f"offers the trace's "
                f"{replay.replayed.requests} turns over {offered_s / 60:,.0f} min (at most "
                f"{REPLAY_MAX_S / 60:.0f} min a Point)",
                f"workload.request_rate={replay.replayed.requests / REPLAY_MAX_S:.3g} or more",
            )
    return out


def _cut_text(cfg: RunConfig) -> str:
    t = cfg.workload.trace
    return (
        f"start_s={t.start_s:g} end_s={t.end_s:g} max_requests={t.max_requests} "
        f"min_turns={t.min_turns} max_conversations={t.max_conversations}"
    )


def warn_pauses_outlast_lease(cfg: RunConfig) -> list[ConfigProblem]:
    """A replay whose typical pause between turns outlasts the pull window: most turns of a
    pulling flow will find D's lease expired and recompute (counted, router.expired_leases)."""
    w, f = cfg.workload, cfg.flow
    if w.kind is not WorkloadKind.trace or not w.trace.path:
        return []
    if not (pulling_flows(cfg) or any(flow in POLICY_FLOWS for flow in f.flows)):
        return []
    try:
        replay = replay_of(cfg)
    except (TraceError, OSError):
        return []  # check_trace says why
    if replay.timing is not TraceTiming.recorded:
        return []
    pause = shape_of(replay.replayed).gap_p50_s
    ttl = max(f.decoder_kv_blocks_ttl_s)
    window = pull_window_s(ttl)
    if math.isnan(pause) or pause <= window:
        return []
    return [
        ConfigProblem(
            "workload.trace.speedup",
            w.trace.speedup,
            f"half the pauses between a conversation's turns are longer than {pause:.1f} s, "
            f"past the {window:.1f} s pull window of flow.decoder_kv_blocks_ttl_s="
            f"{ttl:g}: most turns will find D's lease expired and be "
            "recomputed (what this traffic gets at this TTL; the records count them)",
            f"to measure pulls, a speedup of {math.ceil(w.trace.speedup * pause / window)} or "
            "more, or a longer flow.decoder_kv_blocks_ttl_s",
        )
    ]
