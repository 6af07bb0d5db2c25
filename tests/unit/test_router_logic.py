import pytest

from jobs.serving.router import Router, RouterConfig
from jobs.serving.routing import P_FIRST_PARAMS, held_share, pick, prefill_body
from jobs.serving.sessions import ConversationState
from pdbench.config.schema import FlowConfig, ServerConfig, WorkloadConfig
from pdbench.spec.launch import router_settings

pytestmark = pytest.mark.unit


def router(**kw) -> Router:
    # the settings' one set of defaults, as the launch spec derives them
    timeout_s, port = WorkloadConfig().request_timeout_s, ServerConfig().router_port
    settings = {"host": "127.0.0.1", **router_settings(FlowConfig(), timeout_s, port)}
    return Router(
        RouterConfig(
            prefill_urls=["p0", "p1"],
            decode_urls=["d0"],
            agg_urls=[],
            kv_params_urls=["http://127.0.0.1:9"],
            **{**settings, **kw},
        )
    )


def test_affinity_is_stable():
    assert all(pick(["a", "b", "c"], "conv-7") == pick(["a", "b", "c"], "conv-7") for _ in range(5))


def test_prefill_body_asks_one_token_without_streaming():
    body = {
        "prompt": [1, 2],
        "max_tokens": 16,
        "min_tokens": 16,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    out = prefill_body(body, dict(P_FIRST_PARAMS))
    assert out["max_tokens"] == 1 and out["stream"] is False
    assert "min_tokens" not in out and "stream_options" not in out
    assert out["kv_transfer_params"]["do_remote_decode"] is True
    assert body["max_tokens"] == 16  # the client's body is not modified


HELD = list(range(100, 170))  # the 70 tokens D holds after turn 1


def prompt(n: int) -> list[int]:
    """A next prompt of ``n`` tokens that extends exactly what D holds."""
    return HELD + list(range(1000, 1000 + n - len(HELD)))


def holding(**kw) -> ConversationState:
    return ConversationState(d_params={"remote_block_ids": [[1]]}, held=list(HELD), **kw)


def test_pull_uses_d_params_from_turn_two_and_falls_back_when_expired():
    r = router(decoder_kv_blocks_ttl_s=60)
    assert r.policy.choose("pull", ConversationState(), prompt(64), now=0.0).path == "recompute"
    state = holding(d_params_at=100.0)
    route = r.policy.choose("pull", state, prompt(136), now=110.0)
    assert route.path == "pull" and route.p_params == {"remote_block_ids": [[1]]}
    assert not route.d_alone and route.offered == 70
    # vLLM's P declines a read within 5 s of D's expiry: 60 - 5 - 5 s is the last pull
    assert r.policy.choose("pull", state, prompt(136), now=100.0 + 49.0).path == "pull"
    route = r.policy.choose("pull", state, prompt(136), now=100.0 + 51.0)
    assert route.path == "recompute_expired" and route.p_params["do_remote_decode"] is True
    assert r.stats.expired_leases == 1
    short = router(decoder_kv_blocks_ttl_s=5)  # no lease P would still read
    assert short.policy.choose("pull", state, prompt(136), now=100.0).path == "recompute_expired"


def test_recompute_never_hands_d_params_to_p():
    r = router()
    state = holding(d_params_at=0.0)
    assert r.policy.choose("recompute", state, prompt(120), now=1.0).p_params == P_FIRST_PARAMS


def test_decode_first_threshold():
    r = router(cache_hit_threshold=0.5, decode_first_fallback="pull")
    state = holding(d_params_at=0.0)
    assert held_share(state, 150) == pytest.approx(70 / 150)
    route = r.policy.choose("decode_first", state, prompt(120), now=1.0)
    assert (route.path, route.p_params, route.d_alone) == ("decode_first", None, True)
    assert r.policy.choose("decode_first", state, prompt(400), now=1.0).path == "pull"
    fresh = ConversationState()
    assert r.policy.choose("decode_first", fresh, prompt(80), now=1.0).path == "recompute"


@pytest.mark.parametrize(
    "where, edit",
    [
        ("in D's prompt tokens", lambda p: [p[0], 7, *p[2:]]),  # an earlier message changed
        ("in D's output tokens", lambda p: p[:60] + p[65:]),  # part of the reply dropped
        ("at D's last token", lambda p: [*p[:69], 9, *p[70:]]),
    ],
)
def test_the_router_refuses_to_pull_onto_a_prompt_that_diverges_inside_ds_tokens(where, edit):
    """P would read D's KV for the first 70 tokens of a prompt whose tokens are no longer
    the ones D computed (vLLM then answers wrong tokens): the router recomputes instead,
    and counts it, in pull and in decode_first."""
    r = router(decoder_kv_blocks_ttl_s=60, cache_hit_threshold=0.1)
    edited = edit(prompt(136))
    for flow in ("pull", "decode_first"):
        route = r.policy.choose(flow, holding(d_params_at=0.0), edited, now=1.0)
        assert route.path == "recompute_diverged", (where, flow)
        assert route.p_params == P_FIRST_PARAMS and route.offered == 0
        assert 0 <= route.diverged_at < 70
    assert r.stats.diverged == 2 and r.stats.expired_leases == 0
    # the same prompt unedited is pulled
    assert r.policy.choose("pull", holding(d_params_at=0.0), prompt(136), now=1.0).path == "pull"


def test_a_prompt_that_ends_within_ds_tokens_is_not_pulled():
    r = router(decoder_kv_blocks_ttl_s=60)
    route = r.policy.choose("pull", holding(d_params_at=0.0), HELD[:50], now=1.0)
    assert route.path == "recompute_diverged" and route.diverged_at == 50
    # exactly D's tokens and nothing new: P would have nothing left to compute
    assert r.policy.choose("pull", holding(d_params_at=0.0), HELD, now=1.0).path != "pull"
