"""One answer per quantity: what a crossover search says of each load (its rounds' log and
its last line) is what ``python -m analysis`` says of the same records, number for number
and word for word; the search steers by that reading, not by an estimate of its own.

The records: a deployment measured at two loads (``tests.unit.synthetic_loads``: P
recomputes 2.5x slower at 8 in flight), written as a run dir, as a crossover_load search
leaves it after a few rounds."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from analysis.__main__ import main as analysis_main
from jobs.run.search_points import SearchPoints
from pdbench.config.schema import Flow, SearchConfig
from pdbench.plan import crossover_search as cs
from pdbench.results.store import RunStore
from testbed.synthetic import Synthetic, SyntheticDeployment, write_records
from tests.unit.synthetic_loads import at_load, load_records

pytestmark = pytest.mark.unit

DEP = SyntheticDeployment(c0_s=0.005, c2_s=3e-8, alpha_s=0.04)  # crossover ~881 tokens
LOADS = {2: DEP, 8: at_load(DEP, 2.5)}
LENGTHS = (0, 64, 256, 512, 1024, 2048, 4096)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    root = tmp_path_factory.mktemp("crossover_load")
    items = load_records(LOADS, LENGTHS, repetitions=3, noise=0.08, seed=11, turns=3)
    write_records(root, Synthetic(points=items))
    deployment_id = items[0][0]["deployment"]["deployment_id"]
    return root, deployment_id


def test_the_search_says_what_the_analysis_says_of_the_same_records(recorded):
    root, deployment_id = recorded
    store = RunStore(root)
    plan = cs.search_plan(
        SearchConfig(), 8_000, sorted(LOADS), 2, flows=(Flow.recompute, Flow.pull)
    )
    dep = SimpleNamespace(deployment_id=deployment_id, flow=None)
    search = SearchPoints(dep, [], [], plan, store)
    standing = search.standing(store.iter_points())

    out = root.parent / "analysed"
    assert analysis_main([str(root), "--out", str(out), "-q"]) == 0  # python -m analysis
    summary = json.loads((out / "summary.json").read_text())
    crossovers = summary["questions"]["crossover"]
    answers = {a["concurrency"]: a["measured"] for a in crossovers if "measured" in a}
    assert sorted(answers) == sorted(LOADS) == [e.load for e in standing]
    for estimate in standing:
        said = answers[estimate.load]
        assert estimate.describe() == f"concurrency {estimate.load}: {said['text']}"
        assert (estimate.estimate, estimate.low, estimate.high) == (
            said["tokens"],
            said["low"],
            said["high"],
        )
    # two loads, two answers apart: the search reads each on its own records
    assert standing[1].estimate < 0.7 * standing[0].estimate


def test_an_analysis_that_cannot_read_the_records_leaves_the_search_running(
    recorded, monkeypatch, capsys
):
    """A bug in the analysis must not end a long run: the loads are undetermined (their
    lengths measured again) and the job's log says why."""
    root, deployment_id = recorded

    def broken(*_args):
        raise ZeroDivisionError("planted")

    monkeypatch.setattr("jobs.run.search_judge.readings_of_records", broken)
    plan = cs.search_plan(
        SearchConfig(), 8_000, sorted(LOADS), 2, flows=(Flow.recompute, Flow.pull)
    )
    search = SearchPoints(
        SimpleNamespace(deployment_id=deployment_id, flow=None), [], [], plan, RunStore(root)
    )
    standing = search.standing(RunStore(root).iter_points())
    assert [e.shape for e in standing] == [cs.SearchShape.UNDETERMINED] * 2
    assert all(e.next_lengths and not e.done for e in standing)
    assert (
        "the analysis could not read the records (ZeroDivisionError: planted)"
        in capsys.readouterr().out
    )
