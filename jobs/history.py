"""A conversation's history as the client keeps it, and the edits chat clients make to it.

The history is a list of messages, each with its token ids and, for the chat API, its
text. As a completion its prompt is the messages' ids joined; as a chat it is the messages
themselves (the router applies the chat template). Before a turn a client may edit it the
way chat clients do: drop the first part of the previous reply (reasoning stripped before
it is sent back) or change an earlier message (a system prompt or a user message edited).
Which turns are edited is drawn from the workload's seed, the conversation and the turn,
never from the outputs: every flow gets the same edits on the same turns.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from pdbench.config.schema import HistoryEdit

ASSISTANT, USER, SYSTEM = "assistant", "user", "system"


@dataclass
class Message:
    role: str
    ids: list[int]
    text: str | None = None  # what a chat client sends (None: not known, completions)

    def chat(self) -> dict[str, str]:
        return {"role": self.role, "content": self.text or ""}


def prompt_ids(history: list[Message]) -> list[int]:
    """The history as one token-id prompt."""
    return [t for m in history for t in m.ids]


def edit_for(edit: HistoryEdit, share: float, seed: int, conversation: int, turn: int) -> str:
    """The edit made before ``turn`` of ``conversation`` ("" for none): on ``share`` of the
    turns from 2 on, drawn from the seed, the conversation and the turn only."""
    if edit is HistoryEdit.none or turn < 2:
        return ""
    rng = random.Random(f"history-edit:{seed}:{conversation}:{turn}")
    if rng.random() >= share:
        return ""
    if edit is HistoryEdit.mixed:
        return rng.choice((HistoryEdit.strip_reply.value, HistoryEdit.change_message.value))
    return edit.value


def apply_edit(history: list[Message], edit: str, seed: int) -> bool:
    """Edit ``history`` in place (``edit``: a ``HistoryEdit`` value); False when there was
    nothing to edit (no reply yet, no message with two different tokens)."""
    rng = random.Random(f"history-edit-at:{seed}:{len(history)}:{edit}")
    if edit == HistoryEdit.strip_reply.value:
        replies = [m for m in history if m.role == ASSISTANT]
        return bool(replies) and strip_front(replies[-1])
    if edit == HistoryEdit.change_message.value:
        earlier = [m for m in history if m.role != ASSISTANT and swappable(m)]
        return bool(earlier) and swap_two(rng.choice(earlier), rng)
    return False


def strip_front(message: Message) -> bool:
    """Drop the first half of a reply (its ids, and its words when it has text)."""
    if len(message.ids) < 2:
        return False
    message.ids = message.ids[len(message.ids) // 2 :]
    if message.text is not None:
        words = message.text.split(" ")
        message.text = " ".join(words[len(words) // 2 :])
    return True


def swappable(message: Message) -> bool:
    units = message.text.split(" ") if message.text is not None else message.ids
    return len(set(units)) >= 2


def swap_two(message: Message, rng: random.Random) -> bool:
    """Swap two different tokens of a message (two different words when it has text)."""
    if message.text is not None:
        words = message.text.split(" ")
        i, j = _two_different(words, rng)
        words[i], words[j] = words[j], words[i]
        message.text = " ".join(words)
    ids = list(message.ids)
    if len(set(ids)) >= 2:
        i, j = _two_different(ids, rng)
        ids[i], ids[j] = ids[j], ids[i]
        message.ids = ids
    return True


def _two_different(units: list, rng: random.Random) -> tuple[int, int]:
    i = rng.randrange(len(units))
    others = [j for j, u in enumerate(units) if u != units[i]]
    return i, rng.choice(others)
