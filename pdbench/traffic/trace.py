"""What every trace format is read into: conversations of turns, each with its lengths.

A turn is what a client sent once: the prompt's length as recorded (the history and the new
user message), how many tokens it asked for back, and when it was offered. The replay (the
load generator) keeps the conversation's history as the servers answer, so a turn's prompt
is the last prompt, the model's reply and ``user_tokens`` new tokens: the router sees each
turn extend the last one, as it does a chat client's.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from pdbench.config.schema import TraceFormat


@dataclass(frozen=True)
class TraceTurn:
    """One request of a conversation as the trace has it."""

    user_tokens: int  # new tokens after the history (>= 1)
    output_tokens: int  # tokens the reply has (>= 1)
    at_s: float | None = None  # offered, s from the trace's first request (None: untimed)
    input_tokens: int = 0  # the prompt's length as recorded (history included)
    blocks: tuple[int, ...] = ()  # mooncake: hash ids of the prompt's blocks
    user_text: str | None = None  # openai: the user message as written
    source: str = ""  # where it was read: "line 12", "conversation 3, message 5"
    # the recorded prompt did not begin with the last prompt and its reply (a client that
    # edited its history): replayed as an edit of the history before this turn
    diverged: bool = False


@dataclass
class TraceConversation:
    """One conversation: its turns in order."""

    key: str  # the trace's own name of it (openai id, session id, first line)
    turns: list[TraceTurn]
    system_text: str | None = None  # openai: a leading system message
    system_tokens: int = 0  # its length
    branch_of: str = ""  # mooncake: the conversation whose prompt this one's first extends


@dataclass
class Trace:
    """A trace read into conversations, with what reading it had to decide."""

    format: TraceFormat
    path: str
    conversations: list[TraceConversation]
    block_tokens: int = 0  # mooncake: tokens a hash id stands for
    notes: list[str] = field(default_factory=list)  # what was sorted, skipped, assumed

    @property
    def timed(self) -> bool:
        """Whether every turn has an offered time (a replay can follow the trace's clock)."""
        return all(t.at_s is not None for c in self.conversations for t in c.turns)

    @property
    def requests(self) -> int:
        return sum(len(c.turns) for c in self.conversations)

    def with_conversations(self, conversations: list[TraceConversation]) -> Trace:
        return replace(self, conversations=conversations, notes=list(self.notes))


class TraceError(ValueError):
    """A trace that cannot be read: the file, where in it, the field, and what to do."""

    def __init__(self, path: str, where: str, problem: str, fix: str = ""):
        self.path, self.where, self.problem, self.fix = path, where, problem, fix
        text = f"{path}{': ' + where if where else ''}: {problem}"
        super().__init__(f"{text}. Fix: {fix}" if fix else text)


def prompt_lengths(conversation: TraceConversation) -> list[int]:
    """Each turn's prompt length in a replay: the system message, every earlier turn's
    user message and reply, and its own user message."""
    out, held = [], conversation.system_tokens
    for turn in conversation.turns:
        out.append(held + turn.user_tokens)
        held += turn.user_tokens + turn.output_tokens
    return out


def context_needed(conversation: TraceConversation) -> int:
    """Tokens the longest turn of ``conversation`` needs: its prompt and its reply."""
    if not conversation.turns:
        return 0
    return prompt_lengths(conversation)[-1] + conversation.turns[-1].output_tokens
