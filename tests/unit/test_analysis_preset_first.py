"""The preset's own question comes first, and a crossover the design cannot measure is a note."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from analysis.questions.crossover import design_measures_no_crossover
from analysis.questions.registry import QUESTIONS, ordered, preset_questions
from records.manifest import Manifest

pytestmark = pytest.mark.unit


def ctx_of(*names: str):
    manifests = {f"/runs/{n}": Manifest(name=n, config={"name": n}) for n in names}
    return SimpleNamespace(data=SimpleNamespace(manifests=manifests))


@pytest.mark.parametrize(
    ("preset", "question"),
    [("cache_pressure", "eviction"), ("decode_cost", "decode_cost"), ("crossover", "crossover")],
)
def test_the_preset_s_question_is_answered_right_after_the_flags(preset, question):
    names = [q.name for q in ordered(preset_questions(ctx_of(preset)))]
    assert names[:2] == ["flagged", question]
    assert sorted(names) == sorted(q.name for q in QUESTIONS)  # none lost, none twice


def test_an_unknown_or_missing_preset_keeps_the_usual_order():
    assert ordered(preset_questions(ctx_of("my_own", "shaped"))) == QUESTIONS


def cells(*pairs):
    return SimpleNamespace(cells=[SimpleNamespace(kind=k, x=x) for k, x in pairs])


def test_working_sets_pooled_into_one_curve_are_no_crossover():
    m = cells(("multi_turn 2 conv", 592), ("multi_turn 8 conv", 592), ("multi_turn 8 conv", 672))
    assert "2 working sets (2 conv, 8 conv)" in design_measures_no_crossover([m])
    # a length a search measured at one load only keeps the plain kind: the same working set
    one_set = cells(("multi_turn", 34), ("multi_turn 4 conv x1", 16), ("multi_turn 4 conv x1", 150))
    assert design_measures_no_crossover([one_set]) == ""


def test_one_length_is_no_crossover_but_several_turns_or_loads_apart_are():
    assert "one history length" in design_measures_no_crossover([cells(("k", 512))])
    assert design_measures_no_crossover([cells(("k", 592), ("k", 672))]) == ""
    # loads judged one by one: each at its own kind
    assert (
        design_measures_no_crossover([cells(("a x1", 16), ("a x1", 90)), cells(("a x4", 16))]) == ""
    )
