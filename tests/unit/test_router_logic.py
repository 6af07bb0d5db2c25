import pytest

from jobs.serving.router import (
    P_FIRST_PARAMS,
    ConversationState,
    Router,
    RouterConfig,
    held_share,
    pick,
    prefill_body,
)
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


def test_pull_uses_d_params_from_turn_two_and_falls_back_when_expired():
    r = router(decoder_kv_blocks_ttl_s=60)
    state = ConversationState()
    assert r.choose_route("pull", state, 64, now=0.0)[0] == "recompute"
    state.d_params, state.d_params_at, state.d_tokens = {"remote_block_ids": [[1]]}, 100.0, 70
    path, params, alone = r.choose_route("pull", state, 136, now=110.0)
    assert path == "pull" and params == {"remote_block_ids": [[1]]} and not alone
    # vLLM's P declines a read within 5 s of D's expiry: 60 - 5 - 5 s is the last pull
    assert r.choose_route("pull", state, 136, now=100.0 + 49.0)[0] == "pull"
    path, params, _ = r.choose_route("pull", state, 136, now=100.0 + 51.0)
    assert path == "recompute_expired" and params["do_remote_decode"] is True
    assert r.stats.expired_leases == 1
    short = router(decoder_kv_blocks_ttl_s=5)  # no lease P would still read
    assert short.choose_route("pull", state, 136, now=100.0)[0] == "recompute_expired"


def test_recompute_never_hands_d_params_to_p():
    r = router()
    state = ConversationState(d_params={"x": 1}, d_params_at=0.0, d_tokens=100)
    assert r.choose_route("recompute", state, 120, now=1.0)[1] == dict(P_FIRST_PARAMS)


def test_decode_first_threshold():
    r = router(cache_hit_threshold=0.5, decode_first_fallback="pull")
    state = ConversationState(d_params={"x": 1}, d_params_at=0.0, d_tokens=100)
    assert held_share(state, 150) == pytest.approx(100 / 150)
    assert r.choose_route("decode_first", state, 150, now=1.0) == ("decode_first", None, True)
    assert r.choose_route("decode_first", state, 400, now=1.0)[0] == "pull"
    assert r.choose_route("decode_first", ConversationState(), 10, now=1.0)[0] == "recompute"
