"""Premises: a run whose experiment cannot answer its question is refused before it starts
(issue 27's inputs), and each preset's header says which premises it rests on."""

from __future__ import annotations

import pytest

from jobs.serving.sessions import ConversationState
from pdbench.cli import compose_job
from pdbench.config.tree import CONF_DIR, header_comment
from pdbench.plan.deployments import POLICY_FLOWS
from pdbench.plan.kv_lease import shortest_pulling_ttl_s
from pdbench.validate.premises import premises_of
from pdbench.validate.rules import validate, warnings
from tests.unit.helpers import planted_policy
from tests.unit.test_router_logic import router

pytestmark = pytest.mark.unit

EXPERIMENTS = sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))


def refusals(*overrides: str) -> list[str]:
    return [str(p) for p in validate(compose_job(list(overrides)))]


def only_refusal(*overrides: str) -> str:
    found = refusals(*overrides)
    assert len(found) == 1, found
    assert ". Fix: " in found[0]
    return found[0]


@pytest.mark.parametrize(
    ("preset", "override", "start"),
    [
        ("decode_cost", "flow.decoder_kv_blocks_ttl_s=[3,20]", "flow.decoder_kv_blocks_ttl_s=3"),
        ("smoke", "flow.decoder_kv_blocks_ttl_s=3", "flow.decoder_kv_blocks_ttl_s=3"),
        ("smoke", "flow.decoder_kv_blocks_ttl_s=6", "flow.decoder_kv_blocks_ttl_s=6"),
    ],
)
def test_a_ttl_p_never_pulls_at_is_refused(preset, override, start):
    line = only_refusal(f"+experiment={preset}", override)
    assert line.startswith(start + ": P never pulls at this TTL")
    assert "Fix: a TTL of 7 s or more" in line


def test_the_shortest_ttl_accepted_is_the_first_the_router_pulls_at():
    shortest = shortest_pulling_ttl_s()
    held = list(range(100, 170))  # the 70 tokens D holds; the next prompt extends them
    state = ConversationState(
        d_params={"remote_block_ids": [[1]]}, d_params_at=100.0, held=list(held)
    )
    prompt = held + list(range(1000, 1066))
    at_once = 100.0 + 1e-3  # the next turn, at once: the widest window there is
    route = router(decoder_kv_blocks_ttl_s=shortest).policy.choose("pull", state, prompt, at_once)
    assert route.path == "pull"
    route = router(decoder_kv_blocks_ttl_s=shortest - 1).policy.choose(
        "pull", state, prompt, at_once
    )
    assert route.path == "recompute_expired"
    assert refusals("+experiment=smoke", f"flow.decoder_kv_blocks_ttl_s={shortest}") == []
    # no pulling flow measured: a short TTL is no premise of anything
    no_pull = "flow.flows=[agg,recompute]"
    assert refusals("+experiment=smoke", "flow.decoder_kv_blocks_ttl_s=3", no_pull) == []


COUNTS = "workload.conversations=[2, 4, 8, 12]"


@pytest.mark.parametrize(
    ("override", "start", "words"),
    [
        ("server.prefill_prefix_caching=false", "server.prefill_prefix_caching", "no history"),
        ("server.prefill_kv_blocks=4096", COUNTS, "fits P's 4096 KV blocks"),
        ("server.prefill_kv_blocks=0", COUNTS, "what server.cpu_kvcache_space_gb=1 holds"),
    ],
)
def test_a_working_set_p_never_evicts_is_refused(override, start, words):
    line = only_refusal("+experiment=cache_pressure", override)
    assert line.startswith(start) and words in line, line


def test_counts_within_p_s_cache_are_refused_with_counts_that_evict():
    found = refusals("+experiment=cache_pressure", "workload.conversations=[1,2]")
    (evicts,) = [f for f in found if f.startswith("workload.conversations=")]
    assert "2 conversations x 24 blocks = 48 blocks, fits P's 128 KV blocks" in evicts
    assert "Fix: conversation counts from 6 on (e.g. [3, 6, 12])" in evicts
    assert refusals("+experiment=cache_pressure", "workload.conversations=[3,6,12]") == []


def test_a_concurrency_no_point_reaches_is_refused_whatever_the_premise_switch():
    for extra in ([], ["launch.check_premises=false"]):
        line = only_refusal("+experiment=smoke", "workload.concurrency=64", *extra)
        assert line.startswith("workload.concurrency=64: exceeds workload.conversations (4)")
    line = only_refusal("+experiment=decode_cost", "workload.concurrency=[1,8]")
    assert line.startswith("workload.concurrency=8: exceeds workload.conversations (6)")


def test_one_repetition_is_refused_and_two_warned():
    line = only_refusal("+experiment=smoke", "workload.repetitions=1")
    assert line.startswith("workload.repetitions=1: gives no interval")
    two = compose_job(["+experiment=smoke", "workload.repetitions=2"])
    assert validate(two) == []
    (warning,) = warnings(two)
    assert str(warning).startswith("workload.repetitions=2: gives intervals with 1 degree")


def test_warnings_are_said_by_check_and_before_a_launch_never_refused(tmp_path):
    """rules.warnings reach the user: check and the dry run print each on stderr, exit 0."""
    from pdbench.cli import Invocation, precheck
    from tests.unit.test_cli import pdbench

    two = ["+experiment=smoke", "workload.repetitions=2"]
    (job,) = precheck(Invocation(overrides=two, flags=[]))
    (line,) = job.warnings
    assert line.startswith("workload.repetitions=2: gives intervals with 1 degree")
    (three,) = precheck(Invocation(overrides=["+experiment=smoke"], flags=[]))
    assert three.warnings == []
    for args in (["check", *two], [*two, f"dir={tmp_path / 'run'}", "launch.dry_run=true"]):
        out = pdbench(*args)
        assert out.returncode == 0, out.stderr
        assert f"pdbench: warning: {line}" in out.stderr.splitlines(), out.stderr


def test_check_premises_false_launches_a_pipeline_test_anyway():
    args = ["+experiment=cache_pressure", "workload.repetitions=1", "server.prefill_kv_blocks=4096"]
    assert len(refusals(*args)) == 2
    assert refusals(*args, "launch.check_premises=false") == []
    ttl = "flow.decoder_kv_blocks_ttl_s=3"
    assert refusals("+experiment=smoke", ttl, "launch.check_premises=false") == []


def premises_paragraph(name: str) -> str:
    lines = header_comment(CONF_DIR / "experiment" / f"{name}.yaml")
    start = next((i for i, line in enumerate(lines) if line.startswith("Premises")), None)
    if start is None:
        return ""
    para = [lines[start]]
    for line in lines[start + 1 :]:
        if not line.strip() or line.startswith(" "):
            break
        para.append(line)
    return " ".join(para)


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_each_preset_states_its_premises_in_its_header_and_meets_them(name, tmp_path):
    cfg = compose_job([f"+experiment={name}"])
    if any(f in POLICY_FLOWS for f in cfg.flow.flows):  # needs the user's policy.json
        path = planted_policy(cfg, tmp_path / "policy.json")
        cfg = compose_job([f"+experiment={name}", f"flow.policy={path}"])
    assert validate(cfg) == [] and warnings(cfg) == []
    stated = premises_paragraph(name)
    expected = premises_of(cfg)
    if not expected:  # transfer_bench measures no Points
        assert stated == ""
        return
    assert stated.startswith("Premises (checked before launch"), stated
    for premise in expected:
        assert premise in stated, (name, premise, stated)
    assert ("P evicts" in stated) == ("P evicts" in expected)
