"""The presets' questions on synthetic runs with a known answer: which kv_recompute_threshold,
which flow per workload, same node or cross node, and flagged Points in the answer."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from analysis.answer import answer_lines
from analysis.crossover import analyze
from analysis.flows import parse_paths
from analysis.load import load_runs
from analysis.pipeline import run_analysis
from analysis.questions import answer_questions, shorten
from analysis.synthetic import SyntheticDeployment, write_synthetic_run

pytestmark = pytest.mark.unit

USER, OUT = 64, 16  # write_synthetic_run's defaults: turn t's history = h + (t - 1) * 80
STALL = (
    "2 prefill request(s) of this point had their KV lease expire before D read it (vLLM: "
    "'Releasing expired KV blocks ... retrieved by 0'): D stalled, and their TTFT measures "
    "the stall, not the transfer"
)


def quiet(run_dirs):
    return load_runs(run_dirs, progress=None)


def flag_point(root: Path, match: str, flags: list[str]) -> str:
    """Add ``flags`` to the one Point whose file name contains ``match``; returns its id."""
    (path,) = [p for p in (root / "points").glob("*.json") if match in p.name]
    record = json.loads(path.read_text())
    record["flags"] = flags
    path.write_text(json.dumps(record))
    return record["point_id"]


# ---- threshold_sweep ------------------------------------------------------------------------

THRESHOLDS = (0, 512, 2048, 4096)
HISTORIES = (256, 1024, 2048)  # turn 2 sees 336, 1104 and 2128 tokens of history


def test_synthetic_costs_behind_the_threshold_answer():
    """Pull beats recompute above ~760 tokens here: recompute at 336, pull at 1104 and 2128.
    So 512 is the only threshold that picks the faster route at every length: 0 pulls at 336,
    2048 recomputes at 1104, 4096 recomputes at 1104 and 2128."""
    dep = SyntheticDeployment()
    assert dep.exact_crossover() == pytest.approx(760, abs=1)
    assert dep.recompute_s(336 + USER) < dep.pull_s(336, USER)
    assert dep.pull_s(1104, USER) < dep.recompute_s(1104 + USER)


@pytest.fixture(scope="module")
def threshold_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("thr") / "run"
    dram = [SyntheticDeployment(threshold=t) for t in THRESHOLDS]
    # a second family: a slow link where pulling never pays, so the largest threshold wins
    tcp = [
        SyntheticDeployment(transport="tcp", threshold=t, alpha_s=0.03, beta_bytes_per_s=0.05e9)
        for t in (0, 4096)
    ]
    write_synthetic_run(root, dram + tcp, histories=HISTORIES, turns=2, flows=("pull",),
                        bench=False)  # fmt: skip
    flagged = flag_point(root, "dram-t2048-pull-h1024", [STALL])
    return root, flagged


def test_threshold_answer_finds_the_known_best(threshold_run):
    root, flagged = threshold_run
    data = quiet([root])
    q = answer_questions(data, analyze(data))
    assert len(q.threshold) == 2 and not q.flows and not q.placement
    dram, tcp = sorted(q.threshold, key=lambda a: "tcp" in a.family)
    assert dram.flow == "pull" and "thr" not in dram.family and "same_node" in dram.family
    assert dram.best == 512 and dram.tied == [] and dram.histories == list(HISTORIES)
    assert dram.scores[512] == pytest.approx(1.0)
    assert all(dram.scores[t] > 1.0 for t in (0, 2048, 4096))
    # each cell is the cost model's turn-2 TTFT: pull when the history reaches the threshold
    dep = SyntheticDeployment()
    for t in THRESHOLDS:
        for h in HISTORIES:
            hist = h + USER + OUT
            pulls = hist >= t
            want = dep.pull_s(hist, USER) if pulls else dep.recompute_s(hist + USER)
            cell = dram.cell(t, h)
            assert cell["ttft_ms"] == pytest.approx(want * 1e3)
            assert cell["pulled_share"] == (1.0 if pulls else 0.0)
            assert cell["flagged"] == (cell["point_id"] == flagged)
    assert tcp.best == 4096 and tcp.scores[0] > 1.0

    line = dram.line()
    assert line.startswith(f"{dram.family}, flow pull: best kv_recompute_threshold: 512 (")
    assert "at history 256, recomputed" in line and "at history 1,024, pulled" in line
    assert "2048 " in line.split("\n")[1]  # the others, with how much slower
    assert "2 requests per cell: noisy" in line


def test_threshold_answer_in_the_printed_answer_and_report(threshold_run, tmp_path):
    root, flagged = threshold_run
    out = run_analysis([root], tmp_path / "out")
    lines = out.summary["answer"]
    assert lines[0] == "18 of 18 Points ok across 6 deployment(s)."  # (4 + 2) x 3 lengths
    assert lines[1].startswith("1 Point(s) flagged") and "D stalled" in lines[1]
    assert "thr 2048 · pull · multi_turn h1,024" in lines[1]
    best = [line for line in lines if "best kv_recompute_threshold: 512" in line]
    assert len(best) == 1
    # no pull/recompute pairs: the crossover shrinks to one line
    assert sum("crossover" in line for line in lines) == 1
    assert "not measured on 6 deployment(s)" in lines[-1]
    summary = out.summary["questions"]["threshold"]
    assert {s["best_kv_recompute_threshold"] for s in summary} == {512, 4096}
    assert out.summary["points"]["flagged"] == 1
    assert out.summary["questions"]["flagged_points"][0]["point_id"] == flagged
    assert out.plots[0].name == "ttft_vs_threshold.png"
    html = out.report.read_text()
    head = html[: html.index("<h2>")]
    assert "Which kv_recompute_threshold?" in head and "best kv_recompute_threshold: 512" in head
    assert "Pull or recompute?" not in head  # not measured here: not asked
    assert 'class="flags"' in head
    assert "<h2>Which kv_recompute_threshold?</h2>" in html and "(recomputed)" in html


# ---- flows ----------------------------------------------------------------------------------

FLOWS = ("agg", "recompute", "pull", "decode_first")


@pytest.fixture(scope="module")
def flows_run(tmp_path_factory):
    """One deployment, four flows, two workload kinds in one run dir. decode_first goes to D
    when D holds >= 60% of the prompt: multi_turn (history 0) turn 2 holds 80/144 (pull), turn
    3 160/224 (decode_first); long_doc (history 2048) always."""
    root = tmp_path_factory.mktemp("flows") / "run"
    dep = SyntheticDeployment(cache_hit_threshold=0.6, threshold=32)
    write_synthetic_run(root, [dep], histories=(0,), turns=3, flows=FLOWS, bench=False)
    write_synthetic_run(root, [dep], histories=(2048,), turns=3, flows=FLOWS, kind="long_doc",
                        bench=False)  # fmt: skip
    return root, dep


def expected_ttft_ms(dep: SyntheticDeployment, flow: str, history: int) -> float:
    """Median of the turns >= 2 (two conversations each) by the cost model."""
    values = []
    for turn in (2, 3):
        h = history + (turn - 1) * (USER + OUT)
        n = h + USER
        if flow == "agg":
            s = dep.recompute_s(n) - dep.handoff_s
        elif flow == "recompute":
            s = dep.recompute_s(n)
        elif flow == "decode_first" and h / n >= dep.cache_hit_threshold:
            s = dep.pull_s(h, USER) - dep.router_saving_s
        else:
            s = dep.pull_s(h, USER)
        values += [s * 1e3] * 2
    return statistics.median(values)


def test_flows_answer_per_workload_kind(flows_run):
    root, dep = flows_run
    data = quiet([root])
    q = answer_questions(data, analyze(data))
    assert not q.threshold and not q.placement
    by_kind = {a.kind: a for a in q.flows}
    assert set(by_kind) == {"multi_turn", "long_doc"}
    for kind, history in (("multi_turn", 0), ("long_doc", 2048)):
        a = by_kind[kind]
        assert a.histories == [history]
        for flow in FLOWS:
            assert a.ttft(flow)[0] == pytest.approx(expected_ttft_ms(dep, flow, history))
        assert a.table["n"].tolist() == [4, 4, 4, 4]
    # short history: nothing worth pulling, the single instance wins; long: decode_first
    mt, ld = by_kind["multi_turn"], by_kind["long_doc"]
    assert mt.best == "agg" and mt.best_pd == "recompute"
    assert ld.best == "decode_first"
    assert mt.routes == {"pull": 2, "decode_first": 2}
    assert ld.routes == {"decode_first": 4}

    line = ld.line()
    df, agg, rec = (expected_ttft_ms(dep, f, 2048) for f in ("decode_first", "agg", "recompute"))
    assert f"fastest flow: decode_first, TTFT p50 {df:,.0f} ms (turns >= 2)" in line
    assert f"{df - agg:,.0f} ms ({(df - agg) / agg:+.0%}) vs agg ({agg:,.0f} ms)" in line
    assert f"{df - rec:,.0f} ms ({(df - rec) / rec:+.0%}) vs recompute ({rec:,.0f} ms)" in line
    assert "decode_first routes (turns >= 2): decode_first 4/4 (100%)" in line
    assert "decode_first 2/4 (50%), pull 2/4 (50%)" in mt.line()


def test_flows_answer_in_the_report_with_its_bar_plot(flows_run, tmp_path):
    root, _ = flows_run
    out = run_analysis([root], tmp_path / "out")
    names = [p.name for p in out.plots]
    assert names[0] == "flows_by_workload.png"
    text = "\n".join(out.summary["answer"])
    assert "long_doc (history 2,048): fastest flow: decode_first" in text
    assert "multi_turn (history 0): fastest flow: agg" in text
    flows = out.summary["questions"]["flows"]
    assert {f["kind"]: f["fastest_flow"] for f in flows} == {
        "multi_turn": "agg",
        "long_doc": "decode_first",
    }
    html = out.report.read_text()
    assert "Which flow?" in html[: html.index("<h2>")] and "<h2>Which flow?</h2>" in html


def test_kinds_sharing_a_history_are_not_paired_across(tmp_path):
    """The flows preset runs every kind at history 0: pairs match within a kind only."""
    root = tmp_path / "run"
    dep = SyntheticDeployment()
    for kind in ("multi_turn", "agentic"):
        write_synthetic_run(root, [dep], histories=(0,), turns=2, flows=("recompute", "pull"),
                            kind=kind, bench=False, traces=False)  # fmt: skip
    data = quiet([root])
    (a,) = analyze(data)
    assert len(a.pairs) == 2  # turn 2 of each kind, not 2 x 2


# ---- placement ------------------------------------------------------------------------------


def test_placement_answer_per_placement(tmp_path):
    same = SyntheticDeployment()
    cross = SyntheticDeployment(placement="cross_node", alpha_s=0.02, beta_bytes_per_s=0.25e9)
    root = write_synthetic_run(tmp_path / "run", [cross, same], histories=(256, 1024, 2048),
                               flows=("recompute", "pull"), bench=False)  # fmt: skip
    data = quiet([root])
    analyses = analyze(data)
    assert {a.label.split(" · ")[3] for a in analyses} == {"same_node", "cross_node"}
    q = answer_questions(data, analyses)
    (p,) = q.placement
    assert not q.threshold and not q.flows
    assert [r.placement for r in p.rows] == ["same_node", "cross_node"]
    assert "node" not in p.family and p.history == 2048 and p.flows == ["recompute", "pull"]
    for r, dep in zip(p.rows, (same, cross), strict=True):
        pts = data.points[data.points["deployment_id"] == dep.deployment_id]
        want = pts["transfer_bytes"].sum() / pts["transfer_seconds"].sum() / 1e9
        assert r.gb_s == pytest.approx(want)
        a = next(a for a in analyses if a.deployment_id == dep.deployment_id)
        assert r.crossover == a.measured.describe()
    assert p.rows[0].gb_s > p.rows[1].gb_s  # the slower link
    line = p.line()
    assert "same_node vs cross_node" in line and "GB/s" in line and "crossover" in line
    out = run_analysis([root], tmp_path / "out")
    assert "placement.png" in [x.name for x in out.plots]
    assert "Same node or cross node?" in out.report.read_text()


# ---- flags and small pieces -----------------------------------------------------------------


def test_flagged_points_are_listed_shortened_and_capped(tmp_path):
    root = write_synthetic_run(tmp_path / "run", histories=(0, 256), turns=2,
                               flows=("recompute", "pull"), bench=False)  # fmt: skip
    flag_point(root, "pull-h0", [STALL, "decode0: KV read over tcp, expected cma"])
    data = quiet([root])
    lines = answer_lines(data, analyze(data))
    (block,) = [line for line in lines if "flagged" in line]
    head, item = block.split("\n")
    assert head.startswith("1 Point(s) flagged")
    assert "· pull · multi_turn h0: 2 prefill request(s)" in item
    assert "D stalled" in item and "vLLM:" not in item  # the long parenthesis dropped
    assert " | decode0: KV read over tcp" in item

    assert shorten("a  b\n c") == "a b c"
    assert shorten("x" * 200, 20) == "x" * 19 + "…"
    assert parse_paths("decode_first:2, pull:1") == {"decode_first": 2, "pull": 1}
    assert parse_paths("") == {}


def test_placement_with_its_own_transport_and_sweeps_that_do_not_compare(tmp_path):
    """On GPUs the placement picks the fabric (NVLink vs RDMA): a transport that changes with
    it stays one comparison. Thresholds that come with a different TP pairing do not."""
    root = write_synthetic_run(
        tmp_path / "run",
        [
            SyntheticDeployment(transport="nvlink"),
            SyntheticDeployment(transport="rdma", placement="cross_node", alpha_s=0.02),
            SyntheticDeployment(transport="nvlink", d_tp=2, threshold=512),
        ],
        histories=(256, 1024),
        flows=("recompute", "pull"),
        bench=False,
    )
    data = quiet([root])
    q = answer_questions(data, analyze(data))
    (p,) = q.placement
    assert p.names() == ["same_node (nvlink)", "cross_node (rdma)"]
    assert "nvlink" not in p.family and "rdma" not in p.family
    assert p.line().startswith(f"{p.family}: same_node (nvlink) vs cross_node (rdma)")
    assert not q.threshold
    (note,) = q.notes
    assert note.startswith("threshold takes 2 values, but the deployments also differ in")
    assert "topology.decode.tp" in note and note.endswith("not compared")
    assert note in answer_lines(data, analyze(data), q)
