"""The crossover per offered load (a swept ``workload.concurrency``), never pooled, and the
saving curve on the lengths a search picks (many, log-spaced, few repetitions each)."""

from __future__ import annotations

import numpy as np
import pytest

from analysis.load.runs import records_to_run_data
from analysis.method.deployment import Context
from analysis.method.pairs import paired, request_frame
from analysis.method.saving_curve import GRID, Shape, band_grid
from analysis.method.stats import Status
from analysis.questions import control, crossover
from analysis.questions.question import Note
from testbed.synthetic import Noise, SyntheticDeployment
from tests.unit.synthetic_loads import at_load, load_records, load_run

pytestmark = pytest.mark.unit

DEP = SyntheticDeployment(c0_s=0.005, c2_s=3e-8, alpha_s=0.04)  # crossover ~881 tokens
LOADS = {1: DEP, 8: at_load(DEP, 2.5)}  # P recomputes 2.5x slower at 8 in flight: ~390
LENGTHS = (128, 256, 512, 768, 1024, 1536, 2048)


@pytest.fixture(scope="module")
def two_loads():
    ctx = Context.of(load_run(LOADS, LENGTHS, repetitions=4, noise=0.05, seed=3))
    (a,) = ctx.deployments()
    return ctx, a


def test_each_load_has_its_own_crossover_inside_its_interval(two_loads):
    _, a = two_loads
    assert a.per_load and [x.concurrency for x in a.loads] == [1, 8]
    truths = [LOADS[x.concurrency].exact_crossover() for x in a.loads]
    assert truths[1] < 0.6 * truths[0]
    for load, truth in zip(a.loads, truths, strict=True):
        c = load.measured.crossover
        assert c.decided and c.shape is Shape.CROSSING and c.low <= truth <= c.high
        assert load.threshold_advice.value % 16 == 0
        assert load.threshold_advice.value >= c.estimate
    low, high = (x.measured.crossover for x in a.loads)
    assert high.high < low.low  # two answers, apart: nothing pooled
    # the deployment's own verdict pools nothing: it points to the loads
    assert a.measured.crossover.shape is Shape.NO_DATA and "per load" in a.measured.crossover.reason
    assert a.threshold_advice.value is None and a.threshold_advice.status is Status.UNDETERMINED


def test_a_load_alone_gives_the_same_answer_as_in_the_sweep(two_loads):
    _, a = two_loads
    ctx = Context.of(load_run({8: LOADS[8]}, LENGTHS, repetitions=4, noise=0.05, seed=3))
    (alone,) = ctx.deployments()
    assert not alone.per_load and [x.concurrency for x in alone.loads] == [8]
    swept = a.loads[1].measured.crossover
    assert alone.measured.crossover.estimate == pytest.approx(swept.estimate, rel=1e-9)
    assert (alone.measured.crossover.low, alone.measured.crossover.high) == (swept.low, swept.high)


def test_one_answer_line_per_load_naming_it(two_loads):
    ctx, a = two_loads
    answers = crossover.answer(ctx)
    per_load = [x for x in answers if isinstance(x, crossover.CrossoverAnswer)]
    assert [x.load.concurrency for x in per_load] == [1, 8]
    for x in per_load:
        line = x.lines()[0]
        c = x.load.measured.crossover
        head = f"{a.label}: at concurrency {x.load.concurrency}: pull beats recompute above "
        assert line.startswith(head + f"{c.estimate:,.0f} tokens of history, 95% CI [")
        assert f"kv_recompute_threshold: {x.load.threshold_advice.value:,} tokens" in line
        d = x.to_dict()
        assert d["concurrency"] == x.load.concurrency and d["per_load"]
        assert d["measured"]["tokens"] == c.estimate
        assert x.tables()["crossover"][0]["concurrency"] == x.load.concurrency
    (note,) = [x for x in answers if isinstance(x, Note)]
    assert "at concurrency" in note.text
    # the A/A control per load too
    checks = control.answer(ctx)
    assert [c.label for c in checks] == [f"{a.label} · concurrency {n}" for n in (1, 8)]
    assert all(not c.invalid for c in checks)


def test_one_load_reads_as_before():
    ctx = Context.of(load_run({4: DEP}, LENGTHS, repetitions=3, noise=0.05))
    (x,) = [y for y in crossover.answer(ctx) if isinstance(y, crossover.CrossoverAnswer)]
    assert x.at == "" and x.lines()[0].startswith(f"{x.a.label}: pull beats recompute above")
    assert x.m is x.a.measured and x.advice is x.a.threshold_advice
    (c,) = control.answer(ctx)
    assert c.label == x.a.label


SEARCHED = (16, 40, 100, 250, 600, 1500, 4000, 700, 800, 900, 1000, 1100)


def test_lengths_a_search_picks_give_a_sensible_curve_and_cells():
    noise = Noise(request=0.1, wave=0.1, point=0.05)
    ctx = Context.of(load_run({1: DEP}, SEARCHED, repetitions=3, noise=noise, seed=11))
    (a,) = ctx.deployments()
    m, truth = a.measured, DEP.exact_crossover()
    assert sorted({cell.history for cell in m.cells}) == sorted(SEARCHED)
    assert all(np.isfinite(cell.saving.low) and cell.saving.repetitions == 3 for cell in m.cells)
    curve = m.curve
    assert curve.x_min == pytest.approx(16 + 80) and curve.x_max == pytest.approx(4000 + 80)
    assert np.all(curve.low <= curve.fit) and np.all(curve.fit <= curve.high)
    assert np.all(np.isfinite(curve.low)) and not curve.undetermined
    c = m.crossover
    assert c.decided and c.shape is Shape.CROSSING and c.low <= truth <= c.high
    assert c.high - c.low < 0.5 * truth  # the lengths near it narrow it
    spent = a.loads[0].spent
    assert spent.shape is Shape.CROSSING and spent.crossover.low <= truth <= spent.crossover.high


def test_a_range_of_decades_resolves_a_crossover_near_its_short_end():
    even = band_grid(80.0, 1616.0)  # the preset's range: even steps, as before
    assert np.array_equal(even, np.linspace(80.0, 1616.0, GRID))
    wide = band_grid(96.0, 16_080.0)  # 16 .. 16,000 tokens: even steps of 67 tokens
    assert set(np.linspace(96.0, 16_080.0, GRID)) <= set(wide)
    assert np.all(np.diff(wide) > 0) and np.diff(wide)[0] < 3.0
    dep = SyntheticDeployment(c0_s=0.005, c2_s=3e-8, alpha_s=0.004)  # crossover ~167 tokens
    lengths = (16, 40, 100, 130, 170, 220, 250, 600, 1500, 4000, 16000)
    noise = Noise(request=0.1, wave=0.1, point=0.05)
    ctx = Context.of(load_run({1: dep}, lengths, repetitions=3, noise=noise, seed=3))
    (a,) = ctx.deployments()
    c, truth = a.measured.crossover, dep.exact_crossover()
    assert c.decided and c.low <= truth <= c.high
    assert c.high - c.low < 2 * (16_080 - 96) / (GRID - 1)  # finer than two even steps


def test_loads_measured_at_different_lengths_stay_apart():
    """A search picks lengths per load: a length measured at one load only keeps its plain
    kind, and the loads are still told apart by their concurrency."""
    first, second = (128, 512, 1024, 2048), (128, 256, 384, 768, 1536)
    items = load_records({1: LOADS[1]}, first, repetitions=3, noise=0.05)
    items += load_records({8: LOADS[8]}, second, repetitions=3, noise=0.05)
    (a,) = Context.of(records_to_run_data(items)).deployments()
    assert [x.concurrency for x in a.loads] == [1, 8]
    for load, lengths in zip(a.loads, (first, second), strict=True):
        assert {c.history for c in load.measured.cells} == set(lengths)
        truth = LOADS[load.concurrency].exact_crossover()
        c = load.measured.crossover
        assert c.decided and c.low <= truth <= c.high
    kinds = {c.kind for c in a.measured.cells}
    assert kinds == {"multi_turn", "multi_turn 2 conv x1", "multi_turn 2 conv x8"}


def test_jobs_sharing_a_run_dir_with_another_api_pair_within_their_api():
    """A ``-m`` sweep over ``workload.api`` shares servers and a run dir: its Points have the
    same deployment, kind, length, repetition, conversation and turn ids. Each API's
    requests pair with their own twins (chat's template makes other prompts), never averaged
    with the other API's."""
    chat_dep = SyntheticDeployment(c0_s=0.02, c2_s=3e-8, alpha_s=0.004)  # chat costs more

    def api(name):
        def edit(point, requests):  # noqa: ARG001
            point["point_id"] += f"-{name}"
            point["workload"] = {**point["workload"], "api": name}

        return edit

    items = load_records({1: DEP}, LENGTHS, repetitions=2, edit=api("completions"))
    items += load_records({1: chat_dep}, LENGTHS, repetitions=2, edit=api("chat"))
    data = records_to_run_data(items)
    req = request_frame(data)
    assert set(req["kind"]) == {"multi_turn api=chat", "multi_turn api=completions"}
    pairs = paired(req, "pull", "recompute")
    per_api = len(req[req["flow"] == "pull"]) // 2
    assert len(pairs) == 2 * per_api  # every request paired with its twin of the same API
    by_kind = pairs.groupby("kind")["d_ms"].mean()
    assert by_kind["multi_turn api=chat"] != by_kind["multi_turn api=completions"]
    (a,) = Context.of(data).deployments()
    assert {c.kind for c in a.measured.cells} == set(req["kind"])
