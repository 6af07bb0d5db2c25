"""What a reader sees reads as numbers: no ``nan``, no ``inf``, no 10-digit bound, in the
answer cards, the details and the HTML report of the smoke, crossover, crossover_load,
decode_cost and cache_pressure presets' analyses (synthetic records shaped as each)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from analysis.load.runs import RunData, records_to_run_data
from analysis.method.deployment import Context
from analysis.output import report
from analysis.output.answer import card_lines, summary_dict
from analysis.output.tables import Tables
from analysis.questions.registry import answer_all
from testbed.synthetic import SyntheticDeployment, synthetic_records
from tests.unit.synthetic_loads import at_load, load_run
from tests.unit.test_analysis_pd_cost import point, requests, turn_rows

pytestmark = pytest.mark.unit

UNREADABLE = re.compile(r"\bnan\b|\binf\b|\d{1,3}(?:,\d{3}){3,}|\d{10,}", re.IGNORECASE)
HTML_TAGS = re.compile(r"<[^>]+>|data:image/png;base64,[A-Za-z0-9+/=]+")


def what_a_reader_sees(data: RunData) -> tuple[list[str], str, str]:
    """(the terminal's cards, the details, the report's text) of an analysis of ``data``."""
    ctx = Context.of(data)
    answered = answer_all(ctx)
    labels = [d.label for d in ctx.deployments()]
    summary = summary_dict(data, answered, [], labels)
    html = report.render(ctx, answered, [], summary, Tables.of(ctx, answered))
    return card_lines(summary["cards"]), "\n".join(summary["answer"]), HTML_TAGS.sub(" ", html)


def bill_run(release_seen: bool) -> RunData:
    """decode_cost's shape: pull vs recompute at two loads, D's bill in every Point; D seen
    idle again after the load or (sampling stopped with the load) never."""
    rng = np.random.default_rng(0)
    items = []
    for conc in (1, 4):
        for rep in range(3):
            for flow in ("pull", "recompute"):
                pull = flow == "pull"
                bill = {
                    "blocks": 256,
                    "ttl_s": 20,
                    "tail_s": 20.5 if release_seen else -1.0,
                    "release_s": 20.2 + rng.normal(0, 0.05) if release_seen else -1.0,
                    "usage_peak": (0.3 if pull else 0.25) + rng.normal(0, 0.01),
                    "never_pulled_block_s": 10.0,
                }
                p = point(f"{flow}-c{conc}-r{rep}", "ttl20", flow, rep, 4, conc, bill=bill)
                path = "pull" if pull else "recompute"
                reqs = requests(flow, 4, 70.0 if pull else 100.0, 10.0, path, rng)
                items.append((p, reqs))
    return records_to_run_data(items)


def eviction_run() -> RunData:
    rng = np.random.default_rng(1)
    server = {"prefill_prefix_caching": True, "prefill_kv_blocks": 128}
    items = []
    for convs, evicted in ((2, False), (8, True), (12, True)):
        for rep in range(5):
            for flow in ("pull", "recompute"):
                pull = flow == "pull"
                rows = turn_rows(160, 0, 64)
                if evicted:
                    rows = turn_rows(0, 160, 64) if pull else turn_rows(0, 0, 224)
                ttft = 70.0 if evicted and pull else (110.0 if evicted else 80.0)
                p = point(f"{flow}-c{convs}-r{rep}", "tiny", flow, rep, convs, 4, server)
                p["by_turn"] = rows
                path = "pull" if pull else "recompute"
                items.append((p, requests(flow, convs, ttft, 10.0, path, rng, prompt=500)))
    return records_to_run_data(items)


def smoke_run() -> RunData:
    """The demo's shape: three flows, four repetitions, a few short histories (too short to
    place a crossover: its interval is open)."""
    records = synthetic_records(
        [SyntheticDeployment()],
        histories=(0, 80, 160),
        flows=("agg", "recompute", "pull"),
        repetitions=4,
        noise=0.3,
    )
    return records_to_run_data(records.points)


PRESETS = {
    "smoke": smoke_run,
    "crossover": lambda: records_to_run_data(
        synthetic_records([SyntheticDeployment()], noise=0.05).points
    ),
    "crossover_load": lambda: load_run(
        {1: SyntheticDeployment(), 4: at_load(SyntheticDeployment(), 3.0)},
        histories=(0, 64, 256, 1024, 4096),
        noise=0.05,
    ),
    "decode_cost": lambda: bill_run(release_seen=True),
    "decode_cost, D never seen idle again": lambda: bill_run(release_seen=False),
    "cache_pressure": eviction_run,
}


@pytest.mark.parametrize("preset", list(PRESETS))
def test_the_answers_have_no_nan_inf_or_unreadable_bounds(preset):
    cards, details, html = what_a_reader_sees(PRESETS[preset]())
    for where, text in (("cards", "\n".join(cards)), ("details", details), ("report", html)):
        bad = sorted({m.group(0) for m in UNREADABLE.finditer(text)})
        assert not bad, f"{preset}: the {where} show {bad}:\n{text[:3000]}"


@pytest.mark.parametrize("preset", list(PRESETS))
def test_the_answer_cards_are_few_lines_each_a_sentence(preset):
    cards, _, _ = what_a_reader_sees(PRESETS[preset]())
    assert 2 <= len(cards) <= 10, cards
    assert all(len(line) <= 320 for line in cards), cards


def test_a_hold_time_never_seen_is_said_in_words():
    cards, details, _ = what_a_reader_sees(bill_run(release_seen=False))
    assert "a time not measured (D was not seen idle again" in details
    decode = next(line for line in cards if line.startswith("What does pull cost"))
    assert "run TTL" in decode and " for " not in decode.split("of its KV")[-1]


def test_the_crossover_card_gives_the_threshold_to_set():
    cards, _, _ = what_a_reader_sees(PRESETS["crossover"]())
    line = next(c for c in cards if c.startswith("Pull or recompute? → "))
    assert re.search(r"pull beats recompute above [\d,]+ tokens of history, 95% CI \[", line)
    assert re.search(
        r"set kv_recompute_threshold to [\d,]+ tokens, 95% CI \[[\d,]+, [\d,]+\]", line
    )
