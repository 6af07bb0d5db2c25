"""The crossover search, answered by a synthetic deployment with a planted crossover.

Truth: ``testbed.synthetic.SyntheticDeployment``'s cost models (recompute ``c0 + c1 n +
c2 n^2``, pull ``alpha + h bytes / beta`` plus the new tokens), tuned so that the crossover
lies at 20, 2,000 or 20,000 tokens. Noise, as in the crossover runs on the 2-core machine
(README, "Presets": the A/A control's SD per repetition is 14-22 ms at ~220 ms of TTFT):
each block's paired saving carries a normal error of 8% of the flows' mean TTFT, and 3% of
blocks a stall of +-3 such SDs more (a request or a Point slowed as a whole).
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from jobs.run.search_points import SearchPoints, observations
from pdbench.config.compose import compose_job
from pdbench.config.schema import Flow, SearchConfig, WorkloadConfig
from pdbench.plan import crossover_search as cs
from pdbench.plan.deployments import make_plan
from pdbench.results.store import RunStore
from records.point import PointResult, PointStatus, TurnRow
from testbed.crossover_sim import MAX_TOKENS, judged, measure, planted, search

pytestmark = pytest.mark.unit

GRID_POINTS = 9 * 15 * 2  # the crossover preset's former grid: 9 lengths x 15 repetitions x 2


@pytest.mark.parametrize(
    ("crossover", "c1_s"), [(20, 3.3e-4), (120, 3.3e-4), (2_000, 2e-5), (20_000, 2e-5)]
)
def test_the_search_finds_a_planted_crossover_inside_its_interval(crossover, c1_s):
    dep = planted(crossover, c1_s)
    covered, points = 0, []
    seeds = range(40)
    for seed in seeds:
        step, n = search(dep, seed)
        (est,) = step.estimates
        points.append(n)
        if est.shape is cs.SearchShape.CROSSING and est.low <= crossover <= est.high:
            covered += 1
    assert covered >= 0.9 * len(seeds), f"{covered}/{len(seeds)} intervals hold {crossover}"
    assert sorted(points)[len(points) // 2] < GRID_POINTS, points


def test_the_search_stops_once_the_interval_is_narrow_enough():
    dep = planted(2_000)
    step, _ = search(dep, seed=1)
    (est,) = step.estimates
    assert step.done and step.why == "every load answered"
    assert est.closed and (est.high - est.low) <= 0.25 * est.estimate


@pytest.mark.parametrize(
    ("alpha_s", "shape"),
    [(0.0, cs.SearchShape.PULL_EVERYWHERE), (50.0, cs.SearchShape.RECOMPUTE_EVERYWHERE)],
)
def test_no_crossover_in_range_is_an_answer_with_its_evidence(alpha_s, shape):
    dep = replace(planted(2_000), alpha_s=alpha_s)
    step, n = search(dep, seed=3)
    (est,) = step.estimates
    assert est.shape is shape and est.done, est
    assert n < GRID_POINTS


def test_a_budget_ends_the_search_and_says_so():
    settings = SearchConfig(budget_min=1.0)
    plan = cs.search_plan(settings, MAX_TOKENS, [1], 2)
    rng, dep = random.Random(0), planted(2_000)
    seen = [measure(dep, b, rng) for b in plan.first_pass()]
    step = cs.next_round(plan, judged(plan, seen), plan.first_pass(), 61.0, 1)
    assert step.done and step.blocks == [] and "budget" in step.why


def test_the_same_observations_give_the_same_round():
    plan = cs.search_plan(SearchConfig(), MAX_TOKENS, [1, 4], 2)
    rng, dep = random.Random(5), planted(2_000)
    seen = [measure(dep, b, rng) for b in plan.first_pass()]
    one = cs.next_round(plan, judged(plan, seen), plan.first_pass(), 0.0, 1)
    two = cs.next_round(
        plan, judged(plan, list(reversed(seen))), reversed(plan.first_pass()), 0.0, 1
    )
    assert one == two and one.blocks
    # each load read and searched on its own: blocks only where its own reading is not done
    assert [e.load for e in one.estimates] == [1, 4] and one.estimates[0] != one.estimates[1]
    assert {b.load for b in one.blocks} == {e.load for e in one.estimates if not e.done}
    # new repetitions never reuse one already measured
    assert not set(one.blocks) & set(plan.first_pass())


def test_first_pass_spans_short_and_long_histories_to_the_model_context():
    plan = cs.search_plan(SearchConfig(), 130_000, [1], 2)
    assert plan.first_lengths[:2] == (0, 16) and plan.first_lengths[-1] == 130_000
    assert len(plan.first_lengths) == 8
    logged = plan.first_lengths[1:]  # after 0 (no history), log-spaced
    ratios = [b / a for a, b in zip(logged, logged[1:], strict=False)]
    assert max(ratios) / min(ratios) < 1.2  # log-spaced


def test_a_run_with_no_lengths_plans_the_search():
    cfg = compose_job(["+experiment=crossover", "model=llama3_8b", "cluster=h100_8gpu"])
    plan = make_plan(cfg)
    (dep,) = plan.deployments
    search_plan = plan.searches[dep.deployment_id]
    assert search_plan.first_lengths[0] <= 32
    assert search_plan.first_lengths[-1] > 100_000  # up to the model's 131,072 context
    first = {p.history_tokens for p in plan.points[dep.deployment_id]}
    assert first == set(search_plan.first_lengths)


def _record(point, saving_ms: float, level_ms: float) -> PointResult:
    ttft = level_ms + (saving_ms / 2 if point.flow is Flow.recompute else -saving_ms / 2)
    row = TurnRow(2, 2, point.history_tokens, point.history_tokens, ttft, ttft, 0, 0, 0, 0)
    return PointResult(
        point_id=point.point_id,
        status=PointStatus.ok,
        error="",
        flow=point.flow.value,
        deployment={"deployment_id": point.deployment_id},
        workload=point.workload_record(),
        repetition=point.repetition,
        order_index=point.order_index,
        by_turn=[TurnRow(1, 2, 0, 0, level_ms, level_ms, 0, 0, 0, 0), row],
        started_at=0.0,
        finished_at=1.0,
    )


def test_the_job_runs_rounds_of_ordinary_points_and_a_rerun_resumes_the_search(tmp_path):
    """SearchPoints over a real RunStore: the first pass, then rounds at new lengths; a
    second SearchPoints on the same dir (a requeued job) measures nothing twice."""
    cfg = compose_job(["+experiment=crossover", "search.first_pass_lengths=4", f"dir={tmp_path}"])
    plan = make_plan(cfg)
    (dep,) = plan.deployments
    first = plan.points[dep.deployment_id]
    store = RunStore(tmp_path)
    truth = planted(300)
    rng = random.Random(0)

    def run(limit: int) -> list[str]:
        order = [p.point_id for p in first]
        source = SearchPoints(dep, first, order, plan.searches[dep.deployment_id], store)
        ids = []
        while len(ids) < limit and (point := source.next_point([])) is not None:
            obs = measure(truth, cs.Block(point.history_tokens, 1, point.repetition), rng)
            store.write_point(_record(point, obs.saving_ms, obs.level_ms), [])
            ids.append(point.point_id)
        return ids

    before = run(limit=len(first) + 6)  # the first pass and part of round 1: a requeue
    after = run(limit=10_000)
    assert not set(before) & set(after)
    measured = {r.workload_view.history_tokens for r in store.iter_points()}
    assert measured > {p.history_tokens for p in first}  # the search added lengths
    log = (tmp_path / "search" / f"{dep.deployment_id}.json").read_text()
    assert '"done": true' in log
    order = [r.order_index for r in store.iter_points()]
    assert len(set(order)) == len(order)  # one run order across the rounds
    seen = observations(store.iter_points(), "pull")
    assert len(seen) == len(store.iter_points()) // 2  # every block paired


def test_nice_lengths_keep_two_significant_digits():
    assert [cs.nice_length(x) for x in (16, 43.4, 123, 1_234, 87_654)] == [
        16,
        43,
        120,
        1_200,
        88_000,
    ]
    assert WorkloadConfig().history_tokens == [0]  # a grid unless a preset empties it


def test_a_search_without_both_flows_is_refused_with_the_fix():
    from pdbench.validate.rules import validate

    cfg = compose_job(["+experiment=crossover", "flow.flows=[pull]"])
    (problem,) = [p for p in validate(cfg) if p.field == "workload.history_tokens"]
    assert "recompute and pull" in problem.message and "flow.flows" in problem.fix
