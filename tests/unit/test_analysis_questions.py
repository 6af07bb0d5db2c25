"""The questions on synthetic runs with a known answer: which kv_recompute_threshold, which
flow per workload, same node or cross node, which TP pairing, the A/A control, the TTFT
split and flagged Points; each with its 95% interval, in the console answer and the report.

Exact runs (no noise, three identical repetitions) decide every nonzero difference with an
interval of zero width; noisy ones show the inconclusive answers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analysis.kit.fmt import shorten
from analysis.load.runs import load_runs, records_to_run_data
from analysis.method.deployment import Context
from analysis.method.pull_recompute import flow_levels, level
from analysis.output.answer import answer_lines
from analysis.pipeline import run_analysis
from analysis.questions.flows import parse_paths
from analysis.questions.registry import answer_all, by_name
from testbed.synthetic import (
    Noise,
    SyntheticDeployment,
    synthetic_records,
    write_records,
    write_synthetic_run,
)

pytestmark = pytest.mark.unit

USER, OUT = 64, 16  # write_synthetic_run's defaults: turn t's history = h + (t - 1) * 80
STALL = (
    "2 prefill request(s) of this point had their KV lease expire before D read it (vLLM: "
    "'Releasing expired KV blocks ... retrieved by 0'): D stalled, and their TTFT measures "
    "the stall, not the transfer"
)


def answered(run_dirs):
    ctx = Context.of(load_runs(run_dirs, progress=None))
    return ctx, by_name(answer_all(ctx))


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
    write_synthetic_run(
        root, dram + tcp, histories=HISTORIES, turns=2, flows=("pull",), bench=False
    )
    flagged = flag_point(root, "dram-t2048-pull-h1024-r1", [STALL])
    return root, flagged


def test_threshold_answer_finds_the_known_best(threshold_run):
    root, flagged = threshold_run
    _, q = answered([root])
    answers = q["threshold"].answers
    assert len(answers) == 2 and not q["flows"].asked and not q["placement"].asked
    dram, tcp = sorted(answers, key=lambda a: "tcp" in a.family)
    assert dram.flow == "pull" and "thr" not in dram.family and "same_node" in dram.family
    assert dram.best == 512 and dram.decided and dram.tied == []
    assert dram.histories == list(HISTORIES)
    assert dram.scores[512] == pytest.approx(1.0)
    assert all(dram.scores[t] > 1.0 for t in (0, 2048, 4096))
    # each cell is the cost model's turn-2 TTFT: pull when the history reaches the threshold
    dep = SyntheticDeployment()
    for t in THRESHOLDS:
        for h in HISTORIES:
            hist = h + USER + OUT
            pulls = hist >= t
            want = dep.pull_s(hist, USER) if pulls else dep.recompute_s(hist + USER)
            (cell,) = dram.table[(dram.table["threshold"] == t) & (dram.table["h"] == h)].to_dict(
                "records"
            )
            assert cell["ttft_ms"] == pytest.approx(want * 1e3)
            assert cell["low"] == pytest.approx(want * 1e3)  # no noise: no width
            assert cell["pulled_share"] == (1.0 if pulls else 0.0)
            assert cell["flagged"] == (t == 2048 and h == 1024)
    # the others vs the best: paired relative differences, all decided
    assert set(dram.versus) == {0, 2048, 4096}
    assert all(v.decided and v.estimate > 0 and v.unit == "%" for v in dram.versus.values())
    assert tcp.best == 4096 and tcp.scores[0] > 1.0

    (line,) = dram.lines()
    assert line.startswith(f"{dram.family}, flow pull: best kv_recompute_threshold: 512 (")
    assert "at 256, recomputed" in line and "at 1,024, pulled" in line
    assert "2048 +" in line.split("\n")[1]  # the others, with how much slower and a CI


def test_threshold_answer_in_the_printed_answer_and_report(threshold_run, tmp_path):
    root, flagged = threshold_run
    out = run_analysis([root], tmp_path / "out")
    lines = out.summary["answer"]
    # (4 + 2) deployments x 3 lengths x 3 repetitions
    assert lines[0] == "54 of 54 Points ok across 6 deployment(s), 3 repetition(s) per cell."
    assert lines[1].startswith("1 Point(s) flagged") and "D stalled" in lines[1]
    assert "thr 2048 · pull · multi_turn h1,024 r1" in lines[1]
    best = [line for line in lines if "best kv_recompute_threshold: 512" in line]
    assert len(best) == 1
    # no pull/recompute pairs: the crossover shrinks to one line
    assert sum("crossover" in line for line in lines) == 1
    assert any("not measured on 6 deployment(s)" in line for line in lines)
    (note,) = out.summary["questions"]["crossover"]  # one shared note
    assert note["note"].startswith("pull-vs-recompute crossover not measured on 6 deployment(s)")
    assert len(note["not_measured"]) == 6 and note["reasons"]
    summary = out.summary["questions"]["threshold"]
    assert {s["best_kv_recompute_threshold"] for s in summary} == {512, 4096}
    assert all(s["decided"] for s in summary)
    assert out.summary["points"]["flagged"] == 1
    assert out.summary["questions"]["flagged"][0]["points"][0]["point_id"] == flagged
    assert out.plots[0].name == "ttft_vs_threshold.png"
    html = out.report.read_text()
    head = html[: html.index("<h2")]
    assert "Which kv_recompute_threshold?" in head and "best kv_recompute_threshold: 512" in head
    assert "Pull or recompute?" not in head  # not measured here: not asked
    assert 'class="flags"' in head
    assert ">Which kv_recompute_threshold?</h2>" in html and "(recomputed)" in html


def test_threshold_cells_are_the_interval_of_the_repetitions_means():
    """A cell's 95% CI is the t interval over the repetitions, each averaged over its turns
    >= 2 (``pull_recompute.level``), not an average of the per-turn intervals' bounds: with
    two later turns of different spreads the two differ."""
    deps = {t: SyntheticDeployment(threshold=t) for t in (0, 4096)}
    syn = synthetic_records(
        list(deps.values()),
        histories=(256, 1024),
        turns=3,
        flows=("pull",),
        noise=Noise(request=0.2, wave=0.4),
        seed=7,
        traces=False,
    )
    ctx = Context.of(records_to_run_data(syn.points))
    (a,) = [x for x in by_name(answer_all(ctx))["threshold"].answers if x.flow == "pull"]
    assert len(a.table) == 4
    later = ctx.requests[ctx.requests["turn"] >= 2]
    bounds_averaged = []
    for row in a.table.to_dict("records"):
        dep = deps[row["threshold"]].deployment_id
        rows = later[(later["deployment_id"] == dep) & (later["h"] == row["h"])]
        want = level(rows)
        assert row["ttft_ms"] == pytest.approx(want.estimate)
        assert (row["low"], row["high"]) == pytest.approx((want.low, want.high))
        assert row["repetitions"] == want.repetitions == 3 and row["n"] == len(rows)
        per_turn = flow_levels(rows, dep)
        bounds_averaged.append((per_turn["low"].mean(), per_turn["high"].mean()))
    # what the cells were before: not an interval, and not this one
    assert any(
        abs(lo - row["low"]) > 1.0
        for (lo, _), row in zip(bounds_averaged, a.table.to_dict("records"), strict=True)
    )


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
    write_synthetic_run(
        root, [dep], histories=(2048,), turns=3, flows=FLOWS, kind="long_doc", bench=False
    )
    return root, dep


def expected_ttft_ms(dep: SyntheticDeployment, flow: str, history: int) -> float:
    """Mean of the turns >= 2 (two conversations each) by the cost model."""
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
        values.append(s * 1e3)
    return sum(values) / len(values)


def test_flows_answer_per_workload_kind(flows_run):
    root, dep = flows_run
    _, q = answered([root])
    assert not q["threshold"].asked and not q["placement"].asked
    by_kind = {a.kind: a for a in q["flows"].answers}
    assert set(by_kind) == {"multi_turn", "long_doc"}
    for kind, history in (("multi_turn", 0), ("long_doc", 2048)):
        a = by_kind[kind]
        assert a.histories == [history]
        for flow in FLOWS:
            assert a.levels[flow].estimate == pytest.approx(expected_ttft_ms(dep, flow, history))
            assert a.levels[flow].requests == 12  # 2 turns x 2 conversations x 3 repetitions
            assert a.levels[flow].repetitions == 3
    # short history: nothing worth pulling, the single instance wins; long: decode_first
    mt, ld = by_kind["multi_turn"], by_kind["long_doc"]
    assert mt.best == "agg" and mt.decided
    assert ld.best == "decode_first" and ld.decided
    assert mt.routes == {"pull": 6, "decode_first": 6}
    assert ld.routes == {"decode_first": 12}
    (line,) = ld.lines()
    df, rec = (expected_ttft_ms(dep, f, 2048) for f in ("decode_first", "recompute"))
    assert f"fastest flow: decode_first; decode_first mean TTFT {df:,.0f} ms [" in line
    assert f"recompute +{rec - df:,.0f} ms [" in line and " vs decode_first" in line
    assert "decode_first routes (turns >= 2): decode_first 12/12 (100%)" in line
    assert "decode_first 6/12 (50%), pull 6/12 (50%)" in mt.lines()[0]


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
    assert "Which flow?" in html[: html.index("<h2")] and ">Which flow?</h2>" in html


def test_noisy_flows_that_cannot_be_told_apart_are_not_determined(tmp_path):
    """decode_first saves 2 ms of routing over pull: far below realistic noise."""
    root = write_synthetic_run(tmp_path / "run", histories=(1024, 2048), turns=2,
                               flows=("recompute", "pull", "decode_first"), bench=False,
                               noise=Noise.realistic(), seed=3)  # fmt: skip
    _, q = answered([root])
    (a,) = q["flows"].answers
    assert not a.decided and a.tied
    (line,) = a.lines()
    assert "fastest flow: not determined between" in line
    assert "inconclusive: the 95% interval spans 0" in line


def test_kinds_sharing_a_history_are_not_paired_across(tmp_path):
    """The flows preset runs every kind at history 0: pairs match within a kind only."""
    root = tmp_path / "run"
    dep = SyntheticDeployment()
    for kind in ("multi_turn", "agentic"):
        write_synthetic_run(root, [dep], histories=(0,), turns=2, flows=("recompute", "pull"),
                            kind=kind, bench=False, traces=False)  # fmt: skip
    ctx, _ = answered([root])
    (a,) = ctx.deployments()
    # turn 2 of each kind, 2 conversations x 3 repetitions: 12 pairs, not 24
    assert len(a.measured.pairs) == 12


# ---- placement and TP pairing ---------------------------------------------------------------


def test_placement_answer_per_placement(tmp_path):
    same = SyntheticDeployment()
    cross = SyntheticDeployment(placement="cross_node", alpha_s=0.02, beta_bytes_per_s=0.25e9)
    root = write_synthetic_run(tmp_path / "run", [cross, same], histories=(256, 1024, 2048),
                               flows=("recompute", "pull"), bench=False)  # fmt: skip
    ctx, q = answered([root])
    (p,) = q["placement"].answers
    assert not q["threshold"].asked and not q["flows"].asked
    assert [m.name for m in p.members] == ["same_node", "cross_node"]
    assert "node" not in p.family and p.history == 2048
    for m, dep in zip(p.members, (same, cross), strict=True):
        pts = ctx.data.points[ctx.data.points["deployment_id"] == dep.deployment_id]
        want = (pts["transfer_bytes"] / pts["transfer_seconds"] / 1e9).mean()
        assert m.gb_s.estimate == pytest.approx(want)
        assert m.analysis.deployment_id == dep.deployment_id
    assert p.members[0].gb_s.estimate > p.members[1].gb_s.estimate  # the slower link
    pull_vs = p.members[1].versus_first["pull"]
    assert pull_vs.decided and pull_vs.estimate > 0  # cross node pulls slower
    (line,) = p.lines()
    assert "same_node vs cross_node" in line and "GB/s" in line and "crossover" in line
    assert "vs same_node" in line
    out = run_analysis([root], tmp_path / "out")
    assert "placement.png" in [x.name for x in out.plots]
    assert "Same node or cross node?" in out.report.read_text()


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
    ctx, q = answered([root])
    placement = [a for a in q["placement"].answers if hasattr(a, "members")]
    (p,) = placement
    assert [m.name for m in p.members] == ["same_node (nvlink)", "cross_node (rdma)"]
    assert "nvlink" not in p.family and "rdma" not in p.family
    assert p.lines()[0].startswith(f"{p.family}: same_node (nvlink) vs cross_node (rdma)")
    placements = p.to_dict()["placements"]
    assert [x["placement"] for x in placements] == ["same_node", "cross_node"]
    (note,) = q["threshold"].answers
    assert note.text.startswith("threshold takes 2 values, but the deployments also differ in")
    assert "topology.decode.tp" in note.text and note.text.endswith("not compared")
    assert note.text in answer_lines(ctx.data, answer_all(ctx))


def test_tp_pairing_answer(tmp_path):
    deps = [SyntheticDeployment(), SyntheticDeployment(d_tp=2, alpha_s=0.03)]
    root = write_synthetic_run(tmp_path / "run", deps, histories=(256, 1024, 2048),
                               flows=("recompute", "pull"), bench=False)  # fmt: skip
    _, q = answered([root])
    (a,) = q["tp_pairing"].answers
    assert [m.name for m in a.members] == ["1->1", "1->2"]
    assert a.flow == "pull" and a.history == 2048
    v = a.members[1].versus_first["pull"]
    assert v.decided and v.estimate > 0  # alpha 30 ms instead of 15: 1->2 pulls slower
    assert a.verdict() == "TP 1->1 fastest (pull; 1->2 slower)"
    (line,) = a.lines()
    assert "TP pairing: TP 1->1 fastest" in line and "crossover" in line


# ---- the A/A control, the TTFT split, flags -------------------------------------------------


def test_a_control_that_differs_marks_the_run_invalid(tmp_path):
    """Turn 1 of pull measured 40% slower than the same work in recompute: not a fair run."""
    syn = synthetic_records(histories=(256, 1024, 2048), turns=2, flows=("recompute", "pull"),
                            noise=Noise(request=0.05), repetitions=3)  # fmt: skip
    for point, reqs in syn.points:
        for r in reqs:
            if point["flow"] == "pull" and r["turn"] == 1:
                r["ttft_ms"] *= 1.4
    root = tmp_path / "run"
    write_records(root, syn)
    out = run_analysis([root], tmp_path / "out")
    assert out.summary["valid"] is False
    assert out.summary["answer"][1].startswith("INVALID RUN: the A/A control")
    (control,) = out.summary["questions"]["control"]
    assert control["invalid"] and control["pull_minus_recompute"]["verdict"] == "decided"
    assert control["pull_minus_recompute"]["low"] > 0
    assert "INVALID RUN" in out.report.read_text()


def test_a_fair_run_passes_its_control(tmp_path):
    root = write_synthetic_run(tmp_path / "run", histories=(256, 1024), turns=2,
                               flows=("recompute", "pull"), noise=0.05, bench=False)  # fmt: skip
    ctx, q = answered([root])
    (c,) = q["control"].answers
    assert not c.invalid and "passes" in c.lines()[0]
    assert "pull - recompute" in c.lines()[0] and "[" in c.lines()[0]


def test_ttft_split_per_flow_and_turn_with_its_residual(tmp_path):
    root = write_synthetic_run(tmp_path / "run", histories=(512, 2048), turns=2,
                               flows=("recompute", "pull"), noise=0.1, bench=False)  # fmt: skip
    ctx, q = answered([root])
    (a,) = q["ttft_split"].answers
    t = a.table
    assert set(t["flow"]) == {"recompute", "pull"} and set(t["turn"]) == {1, 2}
    assert set(t["source"]) == {"per_request"}
    parts = ["router_ms", "p_queue_ms", "p_compute_ms", "p_pull_ms", "handoff_ms",
             "d_first_step_ms", "residual_ms"]  # fmt: skip
    total = t[parts].fillna(0).sum(axis=1)
    assert (abs(total - t["ttft_ms"]) < 1e-6 * t["ttft_ms"]).all()  # the parts add up
    pull = t[(t["flow"] == "pull") & (t["turn"] == 2)].iloc[-1]
    assert pull["p_pull_ms"] > 0
    (line,) = a.lines()
    assert "TTFT split (ms): pull turn 2 at 2,128 tokens" in line and "residual" in line
    assert "recompute turn 2 at 2,128 tokens" in line and "per_request" in line


def test_flagged_points_are_listed_shortened_and_capped(tmp_path):
    root = write_synthetic_run(tmp_path / "run", histories=(0, 256), turns=2,
                               flows=("recompute", "pull"), bench=False)  # fmt: skip
    flag_point(root, "pull-h0-r0", [STALL, "decode0: KV read over tcp, expected cma"])
    ctx, _ = answered([root])
    lines = answer_lines(ctx.data, answer_all(ctx))
    (block,) = [line for line in lines if "flagged" in line]
    head, item = block.split("\n")
    assert head.startswith("1 Point(s) flagged")
    assert "· pull · multi_turn h0 r0: 2 prefill request(s)" in item
    assert "D stalled" in item and "vLLM:" not in item  # the long parenthesis dropped
    assert " | decode0: KV read over tcp" in item

    assert shorten("a  b\n c") == "a b c"
    assert shorten("x" * 200, 20) == "x" * 19 + "…"
    assert parse_paths("decode_first:2, pull:1") == {"decode_first": 2, "pull": 1}
    assert parse_paths("") == {}


def test_turns_recomputed_because_the_history_was_edited_are_counted_in_the_answer(tmp_path):
    """A pull turn whose prompt no longer began with D's tokens was recomputed by the router
    (``recompute_diverged``): the answer says how many, per flow, and summary.json keeps it."""
    root = write_synthetic_run(tmp_path / "run", histories=(0,), turns=3, flows=FLOWS, bench=False)
    for path in (root / "points").glob("*.json"):
        point = json.loads(path.read_text())
        if point["flow"] != "pull":
            continue
        for row in point["by_turn"]:
            if row["turn"] == 2:  # one of the two conversations edited its history
                row["paths"] = {"pull": 1, "recompute_diverged": 1}
        path.write_text(json.dumps(point))
    _, q = answered([root])
    (a,) = q["flows"].answers
    assert a.diverged == {"pull": (3, 12)}  # turn 2 of 3 repetitions, of 2 turns x 2 x 3
    assert "pull: 3 of 12 turns (turns >= 2) recomputed, not pulled" in a.lines()[0]
    assert a.to_dict()["recompute_diverged"] == {"pull": {"turns": 3, "of": 12}}
    assert a.expired == {} and a.to_dict()["recompute_expired"] == {}


def test_turns_recomputed_because_ds_lease_ran_out_are_counted_in_the_answer(tmp_path):
    """A pull turn whose D lease had run out was recomputed by the router
    (``recompute_expired``): the answer counts them per flow and never calls them pulled."""
    root = write_synthetic_run(tmp_path / "run", histories=(0,), turns=3, flows=FLOWS, bench=False)
    for path in (root / "points").glob("*.json"):
        point = json.loads(path.read_text())
        if point["flow"] != "pull":
            continue
        for row in point["by_turn"]:
            if row["turn"] == 3:  # the wave before outlived the lease of one conversation
                row["paths"] = {"pull": 1, "recompute_expired": 1}
        path.write_text(json.dumps(point))
    _, q = answered([root])
    (a,) = q["flows"].answers
    assert a.expired == {"pull": (3, 12)} and a.diverged == {}
    assert "pull: 3 of 12 turns (turns >= 2) recomputed, not pulled: D's lease" in a.lines()[0]
    assert a.to_dict()["recompute_expired"] == {"pull": {"turns": 3, "of": 12}}
