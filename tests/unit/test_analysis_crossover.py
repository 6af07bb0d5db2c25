"""Per deployment: the measured crossover, the fits, the predictions and the threshold on
synthetic runs with a known answer (exact ones: the intervals collapse onto the truth)."""

from __future__ import annotations

from dataclasses import asdict

import numpy as np
import pytest

from analysis.load.runs import load_runs, trace_row
from analysis.method.deployment import Context, advise_threshold
from analysis.method.model_cost import known_shapes
from analysis.method.predict import predicted_crossover, transfer_bytes_per_token
from analysis.method.pull_recompute import Measured
from analysis.method.saving_curve import Crossover, Shape
from analysis.method.stats import Status
from analysis.questions.crossover import CrossoverAnswer
from records import read
from records.read import RecordError, SchemaVersionError
from records.trace import TransferTraceRecord
from testbed.synthetic import SyntheticDeployment, write_synthetic_run

pytestmark = pytest.mark.unit


def analyses(root):
    return Context.of(load_runs([root], progress=None)).deployments()


def test_predicted_crossover_finds_the_root():
    c = predicted_crossover(lambda h: 1e-6 * h - 1e-3)  # 1 us saved per token, 1 ms fixed
    assert c.shape is Shape.CROSSING and c.tokens == pytest.approx(1000, rel=1e-9)
    assert predicted_crossover(lambda h: 1e-3 + 0 * h).shape is Shape.PULL_EVERYWHERE
    assert predicted_crossover(lambda h: -1e-3 + 0 * h).shape is Shape.RECOMPUTE_EVERYWHERE


def advice(crossover: Crossover, block: int = 16):
    return advise_threshold(Measured(crossover=crossover), block)


def test_threshold_is_advised_from_decided_verdicts_only():
    decided = Crossover(Shape.CROSSING, Status.DECIDED, 1001.0, 950.0, 1100.0, 100, 4000)
    a = advice(decided)
    assert (a.value, a.low, a.high) == (1008, 960, 1104)
    assert a.text() == "1,008 tokens, 95% CI [960, 1,104] (measured crossover)"
    below = advice(Crossover(Shape.PULL_EVERYWHERE, Status.DECIDED, None, None, 100, 100, 4000))
    assert below.value == 96 and "shortest, rounded down" in below.why
    above = advice(Crossover(Shape.RECOMPUTE_EVERYWHERE, Status.DECIDED, None, 4000, None,
                             100, 4000))  # fmt: skip
    assert above.value is None and above.text().startswith("none: do not pull")
    open_ = Crossover(Shape.CROSSING, Status.INCONCLUSIVE, 1001.0, None, 1100.0, 100, 4000)
    assert advice(open_).value is None
    assert advice(open_).text() == "not determined (the crossover is inconclusive)"
    one = Crossover(Shape.CROSSING, Status.UNDETERMINED, 1001.0, lo=100, hi=4000)
    assert advice(one).text() == "not determined (the crossover has no interval)"


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
    return deps, analyses(root)


def test_synthetic_run_crossovers_match_the_known_answer(exact_run):
    deps, found = exact_run
    by_id = {a.deployment_id: a for a in found}
    assert set(by_id) == {d.deployment_id for d in deps}
    for dep in deps:
        a = by_id[dep.deployment_id]
        exact = dep.exact_crossover()
        # the fits recover the generating model exactly, so their crossover is the root
        assert a.recompute_fit.c1_s_per_token == pytest.approx(dep.c1_s, rel=1e-6)
        assert a.recompute_fit.c2_s_per_token2 == pytest.approx(dep.c2_s, rel=1e-6)
        assert a.transfer_fit.alpha_s == pytest.approx(dep.alpha_s, rel=1e-6)
        assert a.transfer_fit.beta_bytes_per_s == pytest.approx(dep.beta_bytes_per_s, rel=1e-6)
        assert a.transfer_fit.predicts and a.transfer_fit.sizes >= 3
        assert a.by_fit.shape is Shape.CROSSING
        assert a.by_fit.tokens == pytest.approx(exact, rel=1e-4)
        assert a.fit_rms_ms == pytest.approx(0.0, abs=1e-6)
        shown = CrossoverAnswer(a).to_dict()  # what summary.json holds
        assert shown["fit_saving_rms_error_ms"] == a.fit_rms_ms
        assert shown["first_principles_saving_rms_error_ms"] == a.fp_rms_ms
        assert a.fp_rms_ms is not None
        assert a.by_first_principles.shape is Shape.CROSSING
        assert a.transfer_source.startswith("P<-D traces")
        # the measured curve has the generating shape: its root is the truth, no noise
        c = a.measured.crossover
        assert c.decided and c.estimate == pytest.approx(exact, rel=1e-4)
        t = a.threshold_advice
        if exact < c.hi:
            assert c.shape is Shape.CROSSING and c.low <= exact <= c.high
            assert c.high - c.low < 30
            assert a.fit_vs_measured == pytest.approx(0.0, abs=1e-3)
            assert t.value % 16 == 0 and 0 <= t.value - c.tokens < 16
        else:  # tcp: 1,798 tokens, beyond the longest history measured (1,696)
            assert c.shape is Shape.RECOMPUTE_EVERYWHERE and c.low == c.hi
            assert t.value is None and "up to 1,696" in t.why
        assert all(cell.saving.decided or abs(cell.saving.estimate) < 1e-6
                   for cell in a.measured.cells)  # fmt: skip
        assert a.measured.control.diff.estimate == pytest.approx(0.0, abs=1e-9)
        assert not a.measured.control.invalid
    assert any("failed" in n for a in found for n in a.notes)


def test_transfer_fit_takes_bench_reads_when_no_pull_was_traced(tmp_path):
    dep = SyntheticDeployment()
    root = write_synthetic_run(tmp_path / "r", [dep], traces=False)
    (a,) = analyses(root)
    assert a.transfer_source.startswith("transfer bench") and "op READ" in a.transfer_source
    assert "layout HND" in a.transfer_source  # the layout with most records, HND on ties
    # without traces or bench there is no transfer fit (the Points' NIXL totals mix the
    # hand-off with the pulls): the fits make no prediction, and say why
    root = write_synthetic_run(tmp_path / "s", [dep], traces=False, bench=False)
    (a,) = analyses(root)
    assert a.transfer_fit is None and a.by_fit.shape is Shape.NO_DATA
    assert "no transfer fit" in a.by_fit.describe()


def test_transfer_fit_with_two_pulled_sizes_makes_no_prediction(tmp_path):
    root = write_synthetic_run(tmp_path / "r", histories=(256, 1024), turns=2, bench=False)
    (a,) = analyses(root)
    t = a.transfer_fit
    assert t is not None and t.sizes == 2 and not t.predicts
    assert t.why_not() == "2 transfer sizes (needs 3 or more)"
    assert any("2 transfer sizes" in n for n in a.notes)
    assert a.by_fit.shape is Shape.NO_DATA


def test_one_flow_only_gives_no_measured_crossover(tmp_path):
    root = write_synthetic_run(tmp_path / "r", flows=("recompute",), bench=False)
    (a,) = analyses(root)
    c = a.measured.crossover
    assert c.shape is Shape.NO_DATA and "pull and the recompute" in c.reason
    assert a.transfer_fit is None and a.by_fit.shape is Shape.NO_DATA
    assert a.recompute_fit is not None
    assert a.threshold_advice.value is None


def test_a_trace_line_is_read_back_as_its_writer_wrote_it_and_nothing_else():
    # what connector/plugin/transfer_trace.py writes (records.trace.TransferTraceRecord)
    line = asdict(TransferTraceRecord(request_id="r1", op="READ", direction="P<-D", tokens=64,
                                      blocks=4, bytes=65536, descriptors=8, post_time=10.0,
                                      transfer_s=0.002))  # fmt: skip
    n = trace_row(read.trace_line(line))
    assert (n["direction"], n["op"], n["bytes"], n["transfer_s"]) == ("P<-D", "READ", 65536, 0.002)
    assert n["gb_s"] == pytest.approx(65536 / 0.002 / 1e9)
    telemetry_off = trace_row(read.trace_line({**line, "bytes": -1}))
    assert np.isnan(telemetry_off["bytes"]) and telemetry_off["tokens"] == 64
    with pytest.raises(RecordError, match="missing required field"):  # nor another spelling
        read.trace_line({"req_id": "x", "dir": "D<-P", "nbytes": 10, "xfer_ms": 5})
    with pytest.raises(SchemaVersionError, match="schema_version 2; this pdbench reads up to 1"):
        read.trace_line({**line, "schema_version": 2}, "traces/x.jsonl")


def test_a_cell_that_disagrees_with_the_pooled_crossover_is_named():
    """The curve pools every length: a length inside the crossover's interval whose own cell
    says recompute is clearly faster is said, with that cell's interval."""
    from analysis.method.pull_recompute import Cell
    from analysis.method.stats import Verdict

    def cell(x: float, est: float, low: float, high: float) -> Cell:
        status = Status.DECIDED if low > 0 or high < 0 else Status.INCONCLUSIVE
        v = Verdict(est, low, high, 1.0, 4.0, 5, 10, status)
        return Cell("multi_turn", int(x), 2, x, 100.0, 100.0 - est, v)

    c = Crossover(Shape.CROSSING, Status.DECIDED, 800.0, 600.0, 1000.0, 100.0, 2000.0, 5, 50)
    agree = [cell(200, -20, -30, -10), cell(900, 1, -5, 7), cell(1800, 30, 20, 40)]
    assert Measured(cells=agree, crossover=c).disagreement_text() == ""
    m = Measured(cells=[*agree, cell(950, -12, -20, -4)], crossover=c)
    assert [x.x for x in m.disagreements()] == [950]
    text = m.disagreement_text()
    assert "950 tokens: recompute faster by its own cell, -12.0 ms [-20.0, -4.0]" in text
    assert "inside the crossover's interval" in text
