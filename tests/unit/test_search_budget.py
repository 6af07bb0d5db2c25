"""A GPU run fits what it is given. A crossover search's first pass fits its budget: on a
GPU cluster (cluster.gpu_tflops) pdbench estimates it, the dry run says so, and validation
refuses a budget the first pass alone overruns (the budget is looked at only after it), with
one that fits. A load beyond what vLLM runs at once (server.max_num_seqs) is warned."""

from __future__ import annotations

import pytest

from pdbench.config.compose import compose_job
from pdbench.plan.attempt import first_pass
from pdbench.plan.deployments import make_plan
from pdbench.validate.rules import warnings
from pdbench.validate.search import check_search

pytestmark = pytest.mark.unit

GPU = ["+experiment=crossover", "model=llama3_8b", "cluster=h100_8gpu"]


def test_the_first_pass_on_a_gpu_is_estimated_from_its_lengths():
    cfg = compose_job(GPU + ["search.budget_min=30"])
    (search,) = make_plan(cfg).searches.values()
    est = first_pass(cfg, search)
    assert est.points == 48 and est.longest == search.first_lengths[-1] > 100_000
    assert 5 * 60 < est.seconds < 30 * 60  # long contexts dominate; within this budget
    assert "within search.budget_min=30" in est.describe(30)
    assert check_search(cfg) == []


def test_a_budget_the_first_pass_overruns_is_refused_with_one_that_fits():
    cfg = compose_job(GPU)  # the preset's 6 min: sized for the CPU
    (problem,) = [p for p in check_search(cfg) if p.field == "search.budget_min"]
    assert "is below the first pass alone: 48 Points" in problem.message
    assert "looked at only after them" in problem.message
    budget = int(problem.fix.split("search.budget_min=")[1].split()[0])
    fixed = compose_job(GPU + [f"search.budget_min={budget}"])
    assert [p for p in check_search(fixed) if p.field == "search.budget_min"] == []


def test_a_shorter_range_is_offered_where_one_fits_the_budget():
    cfg = compose_job(GPU + ["search.budget_min=6", "search.first_pass_lengths=4"])
    (problem,) = [p for p in check_search(cfg) if p.field == "search.budget_min"]
    longest = int(problem.fix.split("search.max_history_tokens=")[1].split()[0])
    shorter = compose_job(
        GPU
        + [
            "search.budget_min=6",
            "search.first_pass_lengths=4",
            f"search.max_history_tokens={longest}",
        ]
    )
    assert check_search(shorter) == []


def test_without_a_gpu_estimate_nothing_is_said_or_refused():
    cfg = compose_job(["+experiment=crossover"])  # CPU: no cluster.gpu_tflops
    (search,) = make_plan(cfg).searches.values()
    assert first_pass(cfg, search).seconds is None and first_pass(cfg, search).describe(6) == ""
    assert check_search(cfg) == []


def test_a_load_beyond_what_vllm_runs_at_once_is_warned_with_the_setting():
    """crossover_load's GPU line at concurrency 32 on one P and one D with max_num_seqs 16:
    half of that load waits in vLLM's queue."""
    load = ["+experiment=crossover_load", "model=llama3_8b", "cluster=h100_8gpu"]
    load += ["workload.conversations=32", "workload.concurrency=[1,8,32]"]
    (warning,) = [w for w in warnings(compose_job(load)) if w.field == "server.max_num_seqs"]
    assert "32 requests concurrency 32 puts on one instance" in warning.message
    assert warning.fix.startswith("server.max_num_seqs=32")
    fixed = compose_job([*load, "server.max_num_seqs=32"])
    assert [w for w in warnings(fixed) if w.field == "server.max_num_seqs"] == []
