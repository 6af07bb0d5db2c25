"""The policy the router applies (``flow`` policy, static_light, static_heavy): the entry of
``RouterConfig.policy`` for this deployment, read once when the router starts.

``pdbench.validate.policy`` refused a launch whose policy cannot run here before anything
started; the router checks the same again (a config file written by hand, a file changed
since), so that it never serves a flow without its rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pdbench.results import policy_file
from pdbench.results.policy_file import PolicyTarget
from pdbench.results.policy_rule import (
    STATIC_HEAVY,
    STATIC_LIGHT,
    PullRule,
    StaticRule,
    rules_of,
)


@dataclass
class LoadedPolicy:
    """The policy entry the router applies, as its stats report it."""

    path: str
    rules: dict[str, PullRule | StaticRule]  # by the flow that applies it (rules_of)
    differs: list[str]  # what differs from this deployment ([]: measured on one like it)

    def describe(self) -> dict[str, Any]:
        entry = self.rules["policy"].entry
        return {
            "path": self.path,
            "deployment_id": entry.deployment_id,
            "label": entry.label,
            "rule": self.rules["policy"].kind,
            "static_light": self.rules[STATIC_LIGHT].threshold,
            "static_heavy": self.rules[STATIC_HEAVY].threshold,
            "forced": bool(self.differs),
            "differs": self.differs,
        }


def load_policy(path: str, target: dict[str, Any] | None, force: bool) -> LoadedPolicy | None:
    """The entry of the policy file ``path`` for a deployment like ``target``
    (``PolicyTarget``'s fields), or None without a policy (``path`` ""); ValueError when it
    cannot run here (unreadable, another deployment unless ``force``, no rule)."""
    if not path:
        return None
    policy = policy_file.read(path)
    wanted = PolicyTarget(**(target or {}))
    entry, differs = policy_file.entry_for(policy, wanted)
    if entry is None or (differs and not force):
        raise ValueError(f"{path}: no entry for {wanted.describe()}: {'; '.join(differs)}")
    rules = rules_of(entry)
    if rules["policy"].problem:
        raise ValueError(f"{path}: entry {entry.label}: {rules['policy'].problem}")
    return LoadedPolicy(path, rules, differs)
