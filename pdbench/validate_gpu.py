"""Validation rules for GPU clusters and KV transports: what would break a first real run.

Each rule is a pure function ``RunConfig -> list[ConfigProblem]`` registered in
``pdbench.validate.RULES`` and reported with every other problem (field, value, what is
wrong, the fix). They read nothing but the config, except ``check_model_reachable``, which
looks at paths on this machine when the executor serves from here.
"""

from __future__ import annotations

from pdbench.config import RunConfig
from pdbench.config_problems import ConfigProblem, Problems
from pdbench.ucx_transports import (
    AM_PEER_FAILURE_TRANSPORTS,
    expand,
    lacks_connectable_am,
    parse_tls,
)

ISSUE_NO_AM = "NIXL #1413"


def check_ucx_transports(cfg: RunConfig) -> list[ConfigProblem]:
    """``UCX_TLS`` lets NIXL connect, and allows the transport the config expects."""
    t = cfg.transport
    out = Problems()
    if t.ucx_tls.strip() and lacks_connectable_am(t.ucx_tls):
        out.add(
            "transport.ucx_tls",
            t.ucx_tls,
            "names no transport that carries UCX active messages with peer-failure handling "
            f"({', '.join(sorted(AM_PEER_FAILURE_TRANSPORTS))}): NIXL's UCX endpoints cannot "
            f"connect nor send notifications (UCX: 'no active messages transport', {ISSUE_NO_AM})",
            f"add tcp (e.g. {t.ucx_tls},tcp), or an InfiniBand transport (rc), or ucx_tls ''",
        )
    selection = parse_tls(t.ucx_tls)
    expected = expand(t.expected_ucx_transports)
    if expected and not any(selection.allows(name) for name in expected):
        out.add(
            "transport.expected_ucx_transports",
            t.expected_ucx_transports,
            f"are all excluded by transport.ucx_tls={t.ucx_tls}: the KV could never move the "
            "way this transport config expects",
            "add one of them to ucx_tls, or pick the transport config that matches ucx_tls",
        )
    return out


GPU_RULES = (check_ucx_transports,)
