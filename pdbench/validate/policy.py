"""``flow=policy``: the policy file is read, and refused before anything starts when it cannot
run on this deployment (missing, unreadable, another schema, another deployment, no rule).

The one file validation reads besides the model: ``flow.policy``. What it checks is what the
router relies on when it loads the same file (``jobs.serving.router_policy``), so that a launch
that passes here does not fail there.
"""

from __future__ import annotations

from pdbench.config.problems import ConfigProblem, Problems
from pdbench.config.schema import RunConfig
from pdbench.plan.deployments import POLICY_FLOWS, policy_target
from pdbench.results import policy_file
from pdbench.results.policy_rule import rules_of

FIX_PATH = "flow.policy=<run>/analysis/policy.json (python -m analysis <run> writes it)"


def _target(cfg: RunConfig):
    return policy_target(cfg.model, cfg.topology, cfg.transport, cfg.server)


def check_policy(cfg: RunConfig) -> list[ConfigProblem]:
    """The policy flow's file, its entry for this deployment, and P's own threshold."""
    f = cfg.flow
    out = Problems()
    applying = [x for x in f.flows if x in POLICY_FLOWS]
    if not applying:
        if f.policy:
            out.add(
                "flow.policy",
                f.policy,
                "is set but no flow applies it (flow.flows has none of policy, static_light, "
                "static_heavy)",
                "flow=policy (or add policy to flow.flows), or drop flow.policy",
            )
        return out
    if any(t != 0 for t in f.kv_recompute_threshold):
        out.add(
            "flow.kv_recompute_threshold",
            f.kv_recompute_threshold,
            "must be 0 under the policy flows: the router decides per turn, and P would "
            "decline the pulls it hands below its own threshold",
            "flow.kv_recompute_threshold=0 (flow=policy sets it)",
        )
    if not f.policy:
        out.add(
            "flow.policy",
            "''",
            f"is empty: flow {applying[0].value} applies a policy.json's rule",
            FIX_PATH,
        )
        return out
    try:
        policy = policy_file.read(f.policy)
    except ValueError as exc:
        out.add("flow.policy", f.policy, str(exc), FIX_PATH)
        return out
    target = _target(cfg)
    entry, differs = policy_file.entry_for(policy, target)
    if entry is None:
        out.add("flow.policy", f.policy, "; ".join(differs), FIX_PATH)
        return out
    if differs and not f.policy_force:
        out.add(
            "flow.policy",
            f.policy,
            f"was measured on another deployment ({'; '.join(differs)}): its entry "
            f"{entry.label} is for {entry.target.describe()}, this run is "
            f"{target.describe()}",
            "a policy measured on this deployment, or flow.policy_force=true to run it anyway "
            "(the records say so)",
        )
    rules = rules_of(entry)
    for flow in applying:
        problem = rules[flow.value].problem
        if problem:
            out.add(
                "flow.policy",
                f.policy,
                f"flow {flow.value} cannot run entry {entry.label}: {problem}",
                FIX_PATH,
            )
    return out


def warn_policy_forced(cfg: RunConfig) -> list[ConfigProblem]:
    """A forced policy of another deployment: said before the run, kept in its records."""
    f = cfg.flow
    out = Problems()
    if not any(x in POLICY_FLOWS for x in f.flows) or not f.policy or not f.policy_force:
        return out
    try:
        entry, differs = policy_file.entry_for(policy_file.read(f.policy), _target(cfg))
    except ValueError:
        return out
    if entry is not None and differs:
        out.add(
            "flow.policy_force",
            True,
            f"runs {entry.label}'s rule on another deployment ({'; '.join(differs)})",
            "measure this deployment's own policy (+experiment=crossover_load)",
        )
    return out
