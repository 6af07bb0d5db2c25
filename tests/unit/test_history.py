"""The edits chat clients make to a conversation's history, on ids and on text alike."""

from __future__ import annotations

import pytest

from jobs.history import ASSISTANT, SYSTEM, USER, Message, apply_edit, edit_for, prompt_ids
from pdbench.config.schema import HistoryEdit

pytestmark = pytest.mark.unit


def history(text: bool) -> list[Message]:
    def msg(role, ids):
        return Message(role, ids, " ".join(f"w{i}" for i in ids) if text else None)

    return [msg(SYSTEM, [3, 4, 5, 6]), msg(USER, [7, 8]), msg(ASSISTANT, [9, 10, 11, 12])]


@pytest.mark.parametrize("text", [False, True])
def test_strip_reply_drops_the_first_half_of_the_last_reply(text):
    h = history(text)
    assert apply_edit(h, "strip_reply", seed=0)
    assert h[2].ids == [11, 12] and h[:2] == history(text)[:2]
    if text:
        assert h[2].text == "w11 w12"
    assert prompt_ids(h) == [3, 4, 5, 6, 7, 8, 11, 12]


@pytest.mark.parametrize("text", [False, True])
def test_change_message_swaps_two_different_tokens_of_an_earlier_message(text):
    before = history(text)
    h = history(text)
    assert apply_edit(h, "change_message", seed=0)
    changed = [i for i, (a, b) in enumerate(zip(before, h, strict=True)) if a != b]
    assert len(changed) == 1 and h[changed[0]].role != ASSISTANT
    old, new = before[changed[0]], h[changed[0]]
    assert sorted(new.ids) == sorted(old.ids) and new.ids != old.ids
    if text:
        assert sorted(new.text.split()) == sorted(old.text.split()) and new.text != old.text


def test_nothing_to_edit_is_no_edit():
    assert not apply_edit([Message(USER, [3])], "strip_reply", seed=0)
    assert not apply_edit([Message(USER, [3, 3, 3])], "change_message", seed=0)


def test_which_turn_is_edited_depends_on_seed_conversation_and_turn_only():
    draws = [edit_for(HistoryEdit.strip_reply, 0.5, 7, c, t) for c in range(50) for t in (2, 3)]
    assert set(draws) == {"", "strip_reply"}
    assert draws == [
        edit_for(HistoryEdit.strip_reply, 0.5, 7, c, t) for c in range(50) for t in (2, 3)
    ]
    assert edit_for(HistoryEdit.mixed, 1.0, 7, 0, 1) == ""  # turn 1 has no history
    assert edit_for(HistoryEdit.change_message, 1.0, 7, 0, 2) == "change_message"
    assert edit_for(HistoryEdit.change_message, 0.0, 7, 0, 2) == ""
