"""How the router serves one turn: pure decisions on what it knows of the conversation.

``RoutePolicy.choose`` picks the route of a turn from the flow, the conversation's state on
its D (``jobs.serving.sessions``) and the prompt's token ids: D's KV is handed to P (or D
serves alone) only for a prompt that extends exactly the tokens D holds, and only while D's
lease on them outlasts vLLM's margin. Nothing here does I/O; ``jobs.serving.router`` acts
on the answer.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any

from jobs.serving.sessions import ConversationState, diverges_at
from pdbench.plan.deployments import POLICY_FLOWS
from pdbench.plan.kv_lease import pull_window_s
from pdbench.results.policy_rule import PullDecision, PullRule, StaticRule

# flows whose pull-or-recompute a rule of the policy file decides (pdbench.results.policy_rule)
RULE_FLOWS = tuple(f.value for f in POLICY_FLOWS)
# flows that hand P D's params, so D's params of each turn are kept for the next
PULL_FLOWS = ("pull", "decode_first", *RULE_FLOWS)


@dataclass
class RouterStats:
    """What the router decided since the flow was last set (``GET /pdbench/stats``)."""

    paths: dict[str, int] = field(default_factory=dict)
    expired_leases: int = 0
    # turns whose prompt did not begin with exactly D's tokens: recomputed, not pulled
    diverged: int = 0
    missing_params: int = 0  # turns whose D params never came: the next turn recomputes
    failed: int = 0  # the deployment failed the turn (502/503)
    retries: int = 0
    refused: int = 0  # the client's request was wrong (4xx, the router's or an instance's)
    cancelled: int = 0  # the client left before its answer ended (recorded as 499)


@dataclass
class Route:
    """How one turn is served."""

    path: str
    p_params: dict[str, Any] | None  # what P is given (None: P is not asked)
    d_alone: bool = False
    offered: int = 0  # tokens of D's KV P may pull (or D reuses, alone)
    diverged_at: int = -1  # where the prompt parted from D's tokens (-1: it did not)
    decision: PullDecision | None = None  # flow policy: what the rule said, and why


def pick(urls: list[str], conversation: str) -> str:
    """Conversation affinity: a stable hash of the conversation id picks the instance."""
    return urls[zlib.crc32(conversation.encode()) % len(urls)]


def prefill_body(body: dict[str, Any], kv_params: dict[str, Any]) -> dict[str, Any]:
    """P's request: the same prompt, one token, no streaming, KV kept for D."""
    out = {k: v for k, v in body.items() if k not in ("stream", "stream_options", "min_tokens")}
    out.update(stream=False, max_tokens=1, kv_transfer_params=kv_params)
    return out


P_FIRST_PARAMS = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}
D_ALONE_PARAMS = {"do_remote_decode": False, "do_remote_prefill": False}


def held_share(state: ConversationState, prompt_tokens: int) -> float:
    """The share of this prompt whose KV the conversation's D holds."""
    if prompt_tokens <= 0:
        return 0.0
    return min(state.d_tokens, prompt_tokens) / prompt_tokens


class RoutePolicy:
    """The router's settings that decide routes, and the counts of what was decided."""

    def __init__(
        self,
        cache_hit_threshold: float,
        decode_first_fallback: str,
        ttl_s: float,
        rules: dict[str, PullRule | StaticRule] | None = None,
    ):
        self.cache_hit_threshold = cache_hit_threshold
        self.decode_first_fallback = decode_first_fallback
        self.ttl_s = ttl_s
        self.rules = rules or {}  # RULE_FLOWS' rules (policy.json); {}: no policy given
        self.stats = RouterStats()

    def lease_valid(self, state: ConversationState, now: float) -> bool:
        """D still holds the blocks when P reads them: P declines a read close to D's expiry
        (and that request then stalled here), so the lease must leave P a window
        (``pdbench.plan.kv_lease``)."""
        return now - state.d_params_at < pull_window_s(self.ttl_s)

    def choose(
        self, flow: str, state: ConversationState, prompt: list[int], now: float, load: int = 1
    ) -> Route:
        """The route of a turn whose prompt is ``prompt`` (token ids). D's KV is used only
        for a prompt that extends exactly the tokens D holds (``diverges_at``). ``load``:
        the turns in flight at the conversation's P, this one included (flow policy)."""
        if flow == "agg":
            return Route("agg", None)
        diverged = -1
        if state.d_params is not None:
            at = diverges_at(prompt, state.held)
            diverged = -1 if at is None else at
        extends = state.d_params is not None and diverged < 0
        if flow == "decode_first":
            if (
                extends
                and held_share(state, len(prompt)) >= self.cache_hit_threshold
                and self.lease_valid(state, now)
            ):
                return Route("decode_first", None, True, state.d_tokens)
            flow = self.decode_first_fallback
        if (flow == "pull" or flow in RULE_FLOWS) and state.d_params is not None:
            if not extends:
                self.stats.diverged += 1
                return Route("recompute_diverged", dict(P_FIRST_PARAMS), diverged_at=diverged)
            if self.lease_valid(state, now):
                if flow in RULE_FLOWS:
                    return self._by_rule(flow, state, load)
                return Route("pull", dict(state.d_params), offered=state.d_tokens)
            self.stats.expired_leases += 1
            return Route("recompute_expired", dict(P_FIRST_PARAMS))
        return Route("recompute", dict(P_FIRST_PARAMS))

    def _by_rule(self, flow: str, state: ConversationState, load: int) -> Route:
        """A rule flow on a turn that could pull: the policy file's rule decides (its inputs:
        the history D holds and the load in flight at P)."""
        rule = self.rules.get(flow)
        if rule is None:
            raise RuntimeError(f"flow {flow} without a policy (the router was given none)")
        decision = rule.decide(state.d_tokens, load)
        if decision.pull:
            return Route("pull", dict(state.d_params), offered=state.d_tokens, decision=decision)
        return Route("recompute_policy", dict(P_FIRST_PARAMS), decision=decision)
