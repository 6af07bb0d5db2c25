"""Crossover: interpolation, prediction and recommendation on data with a known answer."""

from __future__ import annotations

import numpy as np
import pytest

from analysis.crossover import (
    CROSSING,
    NO_DATA,
    PULL_EVERYWHERE,
    RECOMPUTE_EVERYWHERE,
    Crossover,
    analyze,
    measured_crossover,
    predicted_crossover,
    recommend_threshold,
    transfer_bytes_per_token,
)
from analysis.load import load_runs, normalize_trace
from analysis.model_cost import known_shapes
from analysis.synthetic import SyntheticDeployment, write_synthetic_run

pytestmark = pytest.mark.unit


def test_measured_crossover_interpolates_the_last_sign_change():
    c = measured_crossover(np.array([1000, 2000, 4000, 8000]), np.array([-30, -10, 10, 50]))
    assert c.status == CROSSING and c.tokens == pytest.approx(3000)
    assert (c.lo, c.hi, c.sign_changes) == (1000, 8000, 1)
    # unsorted input and repeated lengths (several turns) are averaged per length
    c = measured_crossover(np.array([4000, 1000, 4000, 2000]), np.array([0, -5, 20, -10]))
    assert c.tokens == pytest.approx(3000)
    # noisy: the last change counts, and the description says it is noisy
    c = measured_crossover(np.array([1, 2, 3, 4]), np.array([-1, 1, -1, 1]))
    assert c.tokens == pytest.approx(3.5) and c.sign_changes == 3 and "noisy" in c.describe()


def test_measured_crossover_outside_the_range():
    c = measured_crossover(np.array([1000, 2000]), np.array([5, 9]))
    assert c.status == PULL_EVERYWHERE and c.tokens is None
    assert "pull faster from 1,000" in c.describe()
    c = measured_crossover(np.array([1000, 2000]), np.array([-5, 0]))
    assert c.status == RECOMPUTE_EVERYWHERE and "up to 2,000" in c.describe()
    c = measured_crossover(np.array([]), np.array([]))
    assert c.status == NO_DATA and "n/a" in c.describe()


def test_predicted_crossover_finds_the_root():
    c = predicted_crossover(lambda h: 1e-6 * h - 1e-3)  # 1 us saved per token, 1 ms fixed
    assert c.status == CROSSING and c.tokens == pytest.approx(1000, rel=1e-9)
    assert predicted_crossover(lambda h: 1e-3 + 0 * h).status == PULL_EVERYWHERE
    assert predicted_crossover(lambda h: -1e-3 + 0 * h).status == RECOMPUTE_EVERYWHERE


def test_recommend_threshold_rounds_to_blocks_and_explains():
    none = Crossover(None, NO_DATA)
    meas = Crossover(1001.0, CROSSING, 100, 4000)
    assert recommend_threshold(meas, none, none, 16) == (1008, "measured crossover")
    below = Crossover(None, PULL_EVERYWHERE, 100, 4000)
    thr, why = recommend_threshold(below, Crossover(40.0, CROSSING), none, 16)
    assert thr == 48 and "below" in why
    assert recommend_threshold(below, none, none, 16)[0] == 96  # shortest, rounded down
    above = Crossover(None, RECOMPUTE_EVERYWHERE, 100, 4000)
    assert recommend_threshold(above, none, none, 16)[0] is None
    assert recommend_threshold(above, Crossover(5000.0, CROSSING), none, 16)[0] == 5008
    assert recommend_threshold(none, none, Crossover(77.0, CROSSING), 32)[0] == 96
    assert recommend_threshold(none, none, none, 16) == (
        None,
        "no pull/recompute measurements and no prediction",
    )


def test_transfer_bytes_per_token_is_one_d_rank():
    s = known_shapes()["llama3_8b"]
    assert transfer_bytes_per_token(s, 1) == 131072
    assert transfer_bytes_per_token(s, 4) == 131072 / 4
    assert transfer_bytes_per_token(s, 16) == 131072 / 8  # a replicated head per rank


@pytest.fixture(scope="module")
def exact_run(tmp_path_factory):
    deps = [
        SyntheticDeployment(),
        SyntheticDeployment(transport="tcp", alpha_s=0.03, beta_bytes_per_s=0.2e9),
        SyntheticDeployment(d_tp=2, alpha_s=0.02),
    ]
    root = write_synthetic_run(
        tmp_path_factory.mktemp("run") / "r",
        deps,
        histories=(0, 128, 256, 384, 512, 768, 1024, 1536),
        failed_point=True,
    )
    return deps, analyze(load_runs([root], progress=None))


def test_synthetic_run_crossovers_match_the_known_answer(exact_run):
    deps, analyses = exact_run
    by_id = {a.deployment_id: a for a in analyses}
    assert set(by_id) == {d.deployment_id for d in deps}
    for dep in deps:
        a = by_id[dep.deployment_id]
        exact = dep.exact_crossover()
        # the fits recover the generating model exactly, so their crossover is the root
        assert a.recompute_fit.c1_s_per_token == pytest.approx(dep.c1_s, rel=1e-6)
        assert a.recompute_fit.c2_s_per_token2 == pytest.approx(dep.c2_s, rel=1e-6)
        assert a.transfer_fit.alpha_s == pytest.approx(dep.alpha_s, rel=1e-6)
        assert a.transfer_fit.beta_bytes_per_s == pytest.approx(dep.beta_bytes_per_s, rel=1e-6)
        assert a.by_fit.status == CROSSING
        assert a.by_fit.tokens == pytest.approx(exact, rel=1e-4)
        assert a.fit_rms_ms == pytest.approx(0.0, abs=1e-6)
        assert a.by_first_principles.status == CROSSING
        assert a.transfer_source.startswith("traces")
        if exact < a.measured.hi:  # linear interpolation of a smooth curve: close, not exact
            assert a.measured.status == CROSSING
            assert a.measured.tokens == pytest.approx(exact, rel=0.03)
            assert a.fit_vs_measured == pytest.approx(0.0, abs=0.03)
            assert a.recommended_threshold % 16 == 0
            assert 0 <= a.recommended_threshold - a.measured.tokens < 16
        else:
            assert a.measured.status == RECOMPUTE_EVERYWHERE
            assert a.recommended_threshold >= exact
            assert "above the measured range" in a.recommendation
    assert any("failed" in n for a in analyses for n in a.notes)


def test_transfer_source_falls_back_to_bench_then_point_totals(tmp_path):
    dep = SyntheticDeployment()
    root = write_synthetic_run(tmp_path / "r", [dep], traces=False)
    (a,) = analyze(load_runs([root], progress=None))
    assert a.transfer_source.startswith("transfer bench") and "READ" in a.transfer_source
    assert "layout HND" in a.transfer_source  # the layout with most records, HND on ties
    root = write_synthetic_run(tmp_path / "s", [dep], traces=False, bench=False)
    (a,) = analyze(load_runs([root], progress=None))
    assert a.transfer_source.startswith("NIXL totals")
    assert a.transfer_fit.alpha_s == pytest.approx(dep.alpha_s, rel=1e-3)


def test_one_flow_only_gives_no_measured_crossover(tmp_path):
    root = write_synthetic_run(tmp_path / "r", flows=("recompute",), bench=False)
    (a,) = analyze(load_runs([root], progress=None))
    assert a.measured.status == NO_DATA and "pull and the recompute" in a.measured.reason
    assert a.transfer_fit is None and a.by_fit.status == NO_DATA
    assert a.recompute_fit is not None
    assert a.recommended_threshold is None


def test_trace_lines_are_normalized_from_several_spellings():
    # what connector/transfer_trace.py writes
    line = {"request_id": "r1", "op": "READ", "direction": "P<-D", "tokens": 64, "blocks": 4,
            "bytes": 65536, "descriptors": 8, "post_time": 10.0, "transfer_s": 0.002,
            "status": "ok"}  # fmt: skip
    n = normalize_trace(line)
    assert (n["direction"], n["op"], n["bytes"], n["transfer_s"]) == ("P<-D", "READ", 65536, 0.002)
    assert n["gb_s"] == pytest.approx(65536 / 0.002 / 1e9)
    n = normalize_trace({"req_id": "x", "dir": "D<-P", "nbytes": 10, "xfer_ms": 5})
    assert n["transfer_s"] == pytest.approx(0.005) and n["op"] == "READ"
    n = normalize_trace({"size": 10, "start": 1.0, "end": 1.25, "kind": "write"})
    assert n["transfer_s"] == pytest.approx(0.25) and n["direction"] == "write"
    n = normalize_trace({"bytes": -1, "tokens": 32, "transfer_s": 0.1})  # telemetry off
    assert np.isnan(n["bytes"]) and n["tokens"] == 32
    assert normalize_trace({"bytes": 10}) is None  # no time
    assert normalize_trace({"bytes": -1, "transfer_s": 0.1}) is None  # no size at all
