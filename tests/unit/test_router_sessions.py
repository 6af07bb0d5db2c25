"""Conversations as the router keeps them: who a request belongs to, what D holds, and
when a prompt extends it exactly."""

from __future__ import annotations

import asyncio

import pytest

from jobs.serving.router_headers import CONVERSATION_HEADER
from jobs.serving.sessions import (
    PREFIX_KEY_TOKENS,
    PRUNE_EVERY,
    SESSION_HEADER,
    Conversations,
    diverges_at,
    held_tokens,
    session_of,
)

pytestmark = pytest.mark.unit


def test_a_conversation_is_named_by_a_header_or_the_multi_turn_clients_body_field():
    assert session_of({SESSION_HEADER: "c7"}, {}) == "c7"
    assert session_of({CONVERSATION_HEADER: "p:1", SESSION_HEADER: "c7"}, {}) == "p:1"
    assert session_of({}, {"conversation_id": 12}) == "12"
    assert session_of({}, {"messages": []}) == ""  # it stands alone
    assert session_of({"X-Correlation-ID": "aiperf-3"}, {}) == "aiperf-3"  # AIPerf's default
    assert session_of({SESSION_HEADER: "c7", "X-Correlation-ID": "a"}, {}) == "c7"


def test_d_holds_its_prompt_and_output_as_far_as_vllms_count():
    # vLLM counts the tokens D computed: the last output token has no KV yet
    assert held_tokens([1, 2, 3], [7, 8, 9], 5) == [1, 2, 3, 7, 8]
    assert held_tokens([1, 2, 3], [7, 8, 9], 2) == [1, 2]
    assert held_tokens([1, 2, 3], [], 0) == []


def test_divergence_is_where_the_prompt_parts_from_ds_tokens():
    held = [1, 2, 3, 4]
    assert diverges_at([1, 2, 3, 4, 5], held) is None
    assert diverges_at([1, 2, 9, 4, 5], held) == 2
    assert diverges_at([1, 2, 3], held) == 3  # ends within D's tokens
    assert diverges_at([1, 2, 3, 4], held) == 4  # nothing left for P to compute
    assert diverges_at([5], []) is None


def test_requests_that_name_no_conversation_keep_no_state():
    table = Conversations(idle_s=10.0)
    alone = table.get("", now=0.0)
    alone.turns = 3
    assert len(table) == 0 and table.get("", now=0.0).turns == 0
    table.get("a", now=0.0).turns = 2
    assert table.get("a", now=1.0).turns == 2 and len(table) == 1


def test_idle_conversations_are_forgotten_but_not_one_in_flight():
    table = Conversations(idle_s=10.0)
    table.get("idle", now=0.0)
    table.get("busy", now=0.0).settled = asyncio.Event()
    table.get("recent", now=5.0)
    assert table.prune(now=12.0) == 1
    assert len(table) == 2
    # the sweep runs by itself every PRUNE_EVERY requests
    table.get("busy", now=0.0).settled = None
    for _ in range(PRUNE_EVERY):
        table.get("", now=100.0)
    assert len(table) == 0


def held_conversation(table: Conversations, session: str, held: list[int]):
    state = table.get(session, now=0.0)
    state.d_params, state.held = {"remote_block_ids": [[1]]}, list(held)
    table.index(session, state)
    return state


def test_a_request_naming_no_conversation_is_found_by_the_tokens_d_holds():
    table = Conversations(idle_s=10.0)
    system = list(range(100, 100 + PREFIX_KEY_TOKENS))  # a system prompt both share
    held_conversation(table, "a", system + [1, 2, 3])
    held_conversation(table, "b", system + [1, 2, 3, 4, 5])  # a's, longer: the better match
    held_conversation(table, "c", system + [9])
    assert table.recognise(system + [1, 2, 3, 4, 5, 6]) == "b"
    assert table.recognise(system + [1, 2, 3, 7]) == "a"
    assert table.recognise(system + [9, 9]) == "c"
    assert table.recognise(system + [8]) == ""  # extends none
    assert table.recognise(system + [1, 2, 3]) == ""  # nothing new for P to compute
    assert table.recognise(system[:PREFIX_KEY_TOKENS]) == ""  # too short to be indexed
    table.get("b", now=0.0).settled = asyncio.Event()  # its turn in flight: not yet
    assert table.recognise(system + [1, 2, 3, 4, 5, 6]) == "a"


def test_recognition_forgets_what_pruning_forgets_and_follows_what_d_holds_now():
    table = Conversations(idle_s=10.0)
    start = list(range(PREFIX_KEY_TOKENS))
    state = held_conversation(table, "a", start + [1])
    held_conversation(table, "a", [7, *start])  # the history was edited: D holds other tokens
    assert table.recognise(start + [1, 2]) == "" and table.recognise([7, *start, 1]) == "a"
    assert state is table.get("a", now=0.0)
    assert table.prune(now=20.0) == 1
    assert table.recognise([7, *start, 1]) == ""
    held_conversation(table, "", start + [1])  # a request standing alone is never indexed
    assert table.recognise(start + [1, 2]) == ""


def test_a_next_turn_sent_before_the_last_one_settled_waits_for_it():
    """A client that sends turn 2 the moment turn 1's answer ended (GuideLLM) comes before the
    router knows what D holds: it waits for turn 1's event, not a conversation of its own."""
    table = Conversations(idle_s=10.0)
    first = list(range(PREFIX_KEY_TOKENS + 4))
    state = table.get("prefix-a", now=0.0)
    state.settled, state.asking = asyncio.Event(), first
    other = table.get("prefix-b", now=0.0)
    other.settled, other.asking = asyncio.Event(), first[:-1]  # shorter: the weaker match
    assert table.in_flight_before([*first, 50, 51]) is state.settled
    assert table.in_flight_before(first) is other.settled  # extends b's prompt only
    assert table.in_flight_before([99, *first]) is None  # extends none
    state.settled = other.settled = None  # settled: nothing to wait for
    assert table.in_flight_before([*first, 50]) is None
