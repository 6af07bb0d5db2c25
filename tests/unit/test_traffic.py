"""Traces a user brings: each format read on good and malformed input (file, line and field
named), Mooncake conversations reconstructed from shared block ids (branches included),
cutting, scaling, the fit to the model's context, the shape, and the token ids a replay
sends (equal block ids, equal tokens)."""

from __future__ import annotations

import json
import math

import pytest

from jobs.trace_replay import fitted, seeded_tokens, trace_conversations
from pdbench.config.schema import TraceConfig, TraceTiming, WorkloadConfig, WorkloadKind
from pdbench.traffic import examples
from pdbench.traffic.fitting import TraceCut, cut, largest_fitting_scale, longest_context, scaled
from pdbench.traffic.load import detect, load_trace
from pdbench.traffic.replay import plan_replay
from pdbench.traffic.shape import shape_of
from pdbench.traffic.trace import TraceError, TraceFormat, prompt_lengths

pytestmark = pytest.mark.unit

BT = 4  # block tokens of the hand-written Mooncake traces


def write_jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def req(ms, n_in, n_out, ids):
    return {"timestamp": ms, "input_length": n_in, "output_length": n_out, "hash_ids": ids}


# -- Mooncake ---------------------------------------------------------------------------


def test_mooncake_turns_are_found_by_their_block_ids(tmp_path):
    """Conversation A: 10 tokens (ids 0, 1, 2: block 2 partial), then 10 + 2 output + 3 user
    = 15 (ids 0, 1, 3, 4: block 2 filled and got a new id), then 15 + 1 + 4 = 20. B shares
    A's first block only (a system prompt): a conversation of its own."""
    path = write_jsonl(
        tmp_path / "t.jsonl",
        [
            req(1000, 10, 2, [0, 1, 2]),
            req(1500, 7, 1, [0, 9]),  # B
            req(4000, 15, 1, [0, 1, 3, 4]),
            req(9000, 20, 5, [0, 1, 3, 5, 6]),
        ],
    )
    trace = load_trace(path, TraceFormat.mooncake, block_tokens=BT)
    a, b = trace.conversations
    assert [t.user_tokens for t in a.turns] == [10, 3, 4]
    assert [t.output_tokens for t in a.turns] == [2, 1, 5]
    assert [t.at_s for t in a.turns] == [0.0, 3.0, 8.0]
    assert [t.blocks for t in a.turns] == [(0, 1, 2), (3, 4), (5, 6)]  # what each turn adds
    assert prompt_lengths(a) == [10, 15, 20]  # the replay's prompts are the trace's
    assert len(b.turns) == 1 and b.turns[0].blocks == (0, 9) and b.branch_of == ""
    assert trace.notes == [] and trace.timed


def test_mooncake_full_blocks_match_only_a_prompt_grown_by_the_reply(tmp_path):
    """A's full blocks are just the shared one: C (shorter than A and its reply) is not
    A's next turn; D (longer than A and its reply, shorter than C and its) is."""
    path = write_jsonl(
        tmp_path / "t.jsonl",
        [req(0, 6, 4, [0, 1]), req(10, 7, 9, [0, 8]), req(20, 12, 1, [0, 2, 3])],
    )
    a, c = load_trace(path, TraceFormat.mooncake, block_tokens=BT).conversations
    assert [t.blocks for t in a.turns] == [(0, 1), (2, 3)] and c.turns[0].blocks == (0, 8)


def test_mooncake_a_second_request_extending_one_turn_is_a_branch(tmp_path):
    path = write_jsonl(
        tmp_path / "t.jsonl",
        [
            req(0, 8, 2, [0, 1]),
            req(1000, 13, 2, [0, 1, 2, 3]),
            req(2000, 14, 2, [0, 1, 7, 8]),  # extends turn 1 again: a fork
            req(3000, 20, 2, [0, 1, 2, 3, 4]),  # the first branch goes on
        ],
    )
    trace = load_trace(path, TraceFormat.mooncake, block_tokens=BT)
    main, fork = trace.conversations
    assert len(main.turns) == 3 and len(fork.turns) == 1
    assert fork.branch_of == main.key and fork.turns[0].blocks == (0, 1, 7, 8)
    assert fork.turns[0].user_tokens == 14  # its whole prompt: it starts a conversation
    assert any("branch" in n for n in trace.notes)
    assert shape_of(trace).branches == 1


def test_mooncake_out_of_order_lines_are_sorted_with_a_note(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", [req(5000, 4, 1, [0]), req(1000, 4, 1, [1])])
    trace = load_trace(path, TraceFormat.mooncake, block_tokens=BT)
    assert [c.turns[0].blocks for c in trace.conversations] == [(1,), (0,)]
    assert trace.notes == ["1 line(s) earlier than the line before: sorted by timestamp"]


@pytest.mark.parametrize(
    "line, where, says",
    [
        ("{not json", "line 2", "is not JSON"),
        ('{"timestamp": 1, "input_length": 4, "output_length": 1}', "line 2", "has no hash_ids"),
        (json.dumps(req(1, 4, 1, "0,1")), "line 2, hash_ids", "not a list of integers"),
        (json.dumps(req(-5, 4, 1, [0])), "line 2, timestamp", "is not ms >= 0"),
        (json.dumps(req(1, 0, 1, [0])), "line 2, input_length", "a request has a prompt"),
        (json.dumps(req(1, 4, 1.5, [0])), "line 2, output_length", "not a token count"),
        ("[1, 2]", "line 2", "is not a JSON object"),
    ],
)
def test_a_malformed_mooncake_line_names_file_line_and_field(tmp_path, line, where, says):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(req(0, 4, 1, [0])) + "\n" + line + "\n")
    with pytest.raises(TraceError) as err:
        load_trace(path, TraceFormat.mooncake, block_tokens=BT)
    assert err.value.where == where and says in err.value.problem
    assert str(err.value).startswith(f"{path}: {where}: ")


def test_an_empty_or_unknown_file_is_refused(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(TraceError, match="is empty"):
        load_trace(empty)
    prose = tmp_path / "notes.txt"
    prose.write_text("hello\n")
    with pytest.raises(TraceError, match="none of the formats"):
        load_trace(prose)
    with pytest.raises(TraceError, match="is not a file"):
        load_trace(tmp_path / "missing.jsonl")


# -- OpenAI conversation files ------------------------------------------------------------


def openai_file(tmp_path, data) -> str:
    path = tmp_path / "conv.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_openai_turns_are_user_messages_and_replies_size_the_output(tmp_path):
    path = openai_file(
        tmp_path,
        [
            {
                "id": "a",
                "messages": [
                    {"role": "system", "content": "be brief"},
                    {"role": "user", "content": "one two three"},
                    {"role": "assistant", "content": "four five"},
                    {"role": "user", "content": [{"type": "text", "text": "six seven"}]},
                    {"role": "assistant", "content": "eight"},
                    {"role": "user", "content": "nine"},
                ],
            },
            {"id": "b", "messages": [{"role": "user", "content": "x"}]},
        ],
    )
    trace = load_trace(path, default_output=7)
    assert trace.format is TraceFormat.openai and not trace.timed
    a, b = trace.conversations
    assert a.system_text == "be brief" and a.system_tokens == 2
    assert [t.user_text for t in a.turns] == ["one two three", "six seven", "nine"]
    assert [t.user_tokens for t in a.turns] == [3, 2, 1]
    assert [t.output_tokens for t in a.turns] == [2, 1, 7]  # the last: no reply, the default
    assert prompt_lengths(a) == [5, 9, 11]  # system, each turn's message and reply
    assert b.turns[0].output_tokens == 7
    assert trace.notes == [
        "2 conversation(s) end with a user message and no reply: its reply is 7 tokens "
        "(workload.output_tokens)"
    ]


def test_openai_an_object_of_message_lists_reads_too(tmp_path):
    path = openai_file(tmp_path, {"x": [{"role": "user", "content": "hi there"}]})
    (conv,) = load_trace(path, TraceFormat.openai).conversations
    assert conv.key == "x" and conv.turns[0].user_tokens == 2


@pytest.mark.parametrize(
    "messages, where, says",
    [
        ([{"role": "tool", "content": "x"}], "conversation 0 (c), message 0, role", "'tool'"),
        (
            [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
            "conversation 0 (c), message 1, role",
            "two user messages in a row",
        ),
        (
            [{"role": "assistant", "content": "a"}],
            "conversation 0 (c), message 0, role",
            "no user message before it",
        ),
        ([{"role": "user", "content": 3}], "conversation 0 (c), message 0, content", "not text"),
        ([], "conversation 0 (c)", "not a non-empty list"),
    ],
)
def test_a_malformed_openai_conversation_names_where(tmp_path, messages, where, says):
    path = openai_file(tmp_path, [{"id": "c", "messages": messages}])
    with pytest.raises(TraceError) as err:
        load_trace(path, TraceFormat.openai)
    assert err.value.where == where and says in err.value.problem


def test_openai_bad_json_names_its_line_and_duplicate_ids_are_refused(tmp_path):
    path = tmp_path / "conv.json"
    path.write_text('[\n{"id": "a",\n "messages": [}\n]')
    with pytest.raises(TraceError, match="line 3, column"):
        load_trace(path, TraceFormat.openai)
    one = {"id": "a", "messages": [{"role": "user", "content": "x"}]}
    with pytest.raises(TraceError, match="used twice"):
        load_trace(openai_file(tmp_path, [one, one]))


# -- recorded sessions --------------------------------------------------------------------


def log_line(session, at, prompt, out, status=200, diverged=-1, **extra):
    row = {
        "request_id": "r",
        "session": session,
        "at": at,
        "prompt_tokens": prompt,
        "output_tokens": out,
        "status": status,
        "diverged_at": diverged,
    }
    row.update(extra)
    return row


def test_a_recorded_session_replays_its_conversations_lengths_and_gaps(tmp_path):
    path = write_jsonl(
        tmp_path / "router_requests.jsonl",
        [
            log_line("s1", 100.0, 50, 10),
            log_line("", 100.5, 30, 4),  # named no conversation: one of its own
            log_line("s1", 103.0, 80, 10),  # 50 + 10 held, 20 new
            log_line("s1", 104.0, 5, 0, status=400),  # refused: not replayed
            log_line("s1", 110.0, 120, 8, diverged=12),  # the client edited its history
            log_line("w:0", 99.0, 40, 4, request_id="pdb-warmup-pull-h0-1-t1-ab"),  # ours
        ],
    )
    trace = load_trace(path)
    assert trace.format is TraceFormat.pdbench
    s1, alone = trace.conversations
    assert [t.user_tokens for t in s1.turns] == [50, 20, 30]
    assert [t.at_s for t in s1.turns] == [0.0, 3.0, 10.0]
    assert [t.diverged for t in s1.turns] == [False, False, True]
    assert alone.turns[0].user_tokens == 30 and len(alone.turns) == 1
    assert trace.notes == [
        "1 warm-up request(s) of pdbench's own: left out",
        "1 request(s) not answered 200: left out",
    ]


def test_a_log_without_output_tokens_uses_the_default_and_says_so(tmp_path):
    row = log_line("s", 1.0, 10, 0)
    del row["output_tokens"]
    trace = load_trace(write_jsonl(tmp_path / "r.jsonl", [row]), default_output=9)
    assert trace.conversations[0].turns[0].output_tokens == 9
    assert "without output_tokens" in trace.notes[0]
    with pytest.raises(TraceError, match=r"line 1, prompt_tokens: 'x' is not a number"):
        load_trace(write_jsonl(tmp_path / "bad.jsonl", [log_line("s", 1, "x", 1)]))


# -- the generated examples ---------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["mooncake", "openai", "pdbench"])
def test_every_example_is_detected_and_read(tmp_path, fmt):
    path = tmp_path / f"example.{fmt}"
    examples.main([fmt, str(path), "--conversations", "12", "--seed", "3"])
    assert detect(path) is TraceFormat(fmt)
    trace = load_trace(path)
    assert trace.requests >= 12 and trace.conversations
    assert max(len(c.turns) for c in trace.conversations) > 1


def test_the_mooncake_example_has_long_shared_prefix_conversations(tmp_path):
    path = examples.write_example(
        TraceFormat.mooncake, tmp_path / "m.jsonl", examples.ExampleShape(conversations=40), 0
    )
    trace = load_trace(path)
    shape = shape_of(trace)
    assert shape.prompt_max > 10_000 and shape.history_share > 0.5
    assert shape.branches >= 1 and 20 < shape.gap_p50_s < 200  # pauses like people's
    # every conversation that is not a branch starts with the shared system prompt's blocks
    assert all(c.turns[0].blocks[:2] == (0, 1) for c in trace.conversations)


# -- cutting, scaling, fitting --------------------------------------------------------------


def three_conversations(tmp_path):
    rows = [
        req(0, 8, 2, [0, 1]),
        req(10_000, 13, 2, [0, 1, 2, 3]),
        req(20_000, 20, 2, [0, 1, 2, 3, 4]),
        req(1_000, 5, 1, [10, 11]),
        req(30_000, 400, 100, [20]),
    ]
    return load_trace(write_jsonl(tmp_path / "t.jsonl", rows), block_tokens=BT)


def test_a_window_starts_a_conversation_at_its_first_turn_inside_it(tmp_path):
    trace = three_conversations(tmp_path)
    kept = cut(trace, TraceCut(start_s=5.0, end_s=25.0))
    (conv,) = kept.conversations
    assert [t.user_tokens for t in conv.turns] == [13, 5]  # its recorded prompt, then new
    assert [t.at_s for t in conv.turns] == [0.0, 10.0]  # the clock starts at the window
    assert cut(trace, TraceCut(max_requests=2)).requests == 2
    assert [len(c.turns) for c in cut(trace, TraceCut(min_turns=2)).conversations] == [3]
    assert cut(trace, TraceCut(max_conversations=1)).requests == 3


def test_scaling_keeps_every_length_at_least_one_token_and_speeds_time_up(tmp_path):
    trace = three_conversations(tmp_path)
    small = scaled(trace, 0.25, speedup=10)
    first = small.conversations[0]
    assert [t.user_tokens for t in first.turns] == [2, 1, 1]  # 8, 3, 5 x 0.25 (>= 1)
    assert [t.output_tokens for t in first.turns] == [1, 1, 1]
    assert [t.at_s for t in first.turns] == [0.0, 1.0, 2.0]
    assert small.block_tokens == 1
    assert trace.conversations[0].turns[0].user_tokens == 8  # the trace read stays as it was


def test_the_largest_fitting_scale_fits_and_a_hair_more_does_not(tmp_path):
    trace = three_conversations(tmp_path)
    assert longest_context(trace) == 500
    best = largest_fitting_scale(trace, 128)
    assert 0 < best < 1
    assert longest_context(scaled(trace, best)) <= 128
    assert longest_context(scaled(trace, best * 1.01)) > 128
    assert largest_fitting_scale(trace, 10_000) == 1.0
    assert largest_fitting_scale(trace, 1) == 0.0


def test_shape_counts_history_share_and_pauses(tmp_path):
    shape = shape_of(three_conversations(tmp_path))
    assert (shape.requests, shape.conversations, shape.turns_max) == (5, 3, 3)
    assert shape.gap_p50_s == 10.0 and shape.duration_s == 30.0
    # prompts 8, 13, 20, 5, 400: history 0 + 10 + 15 (of conversation 1) over 446
    assert math.isclose(shape.history_share, 25 / 446)


# -- what a replay sends ---------------------------------------------------------------------


def replay_workload(path: str, **trace) -> WorkloadConfig:
    return WorkloadConfig(
        kind=WorkloadKind.trace, seed=5, trace=TraceConfig(path=path, block_tokens=BT, **trace)
    )


def test_equal_block_ids_are_equal_tokens_and_seeds_make_repetitions_differ(tmp_path):
    path = write_jsonl(
        tmp_path / "t.jsonl",
        [req(0, 8, 2, [0, 1]), req(100, 8, 2, [0, 2]), req(2000, 13, 3, [0, 1, 3, 4])],
    )
    wl = replay_workload(path)
    replay = plan_replay(wl.trace, 16)
    a, b = trace_conversations(wl, replay, 512, "")
    assert a.user_turns[0][:BT] == b.user_turns[0][:BT]  # block 0: a shared system prompt
    assert a.user_turns[0][BT:] != b.user_turns[0][BT:]
    assert [len(u) for u in a.user_turns] == [8, 3]  # 13 - 8 - 2 new tokens
    assert a.output_lens == [2, 3] and a.offered_s == [0.0, 2.0]
    assert all(3 <= t < 512 for u in a.user_turns for t in u)  # no special tokens
    wl.seed = 6
    again = trace_conversations(wl, replay, 512, "")
    assert again[0].user_turns[0] != a.user_turns[0]


def test_the_workloads_arrivals_leave_turns_untimed(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", [req(0, 8, 2, [0, 1])])
    wl = replay_workload(path, timing=TraceTiming.arrival, speedup=4.0)
    replay = plan_replay(wl.trace, 16)
    assert replay.timing is TraceTiming.arrival and replay.speedup == 1.0
    assert trace_conversations(wl, replay, 512, "")[0].offered_s is None


def test_a_diverged_recorded_turn_is_replayed_as_an_edit(tmp_path):
    path = write_jsonl(
        tmp_path / "r.jsonl", [log_line("s", 0.0, 10, 4), log_line("s", 1.0, 20, 4, diverged=3)]
    )
    wl = replay_workload(path)
    (spec,) = trace_conversations(wl, plan_replay(wl.trace, 16), 512, "")
    assert spec.edits == {2: "strip_reply"}


def test_text_without_a_tokenizer_becomes_seeded_tokens_of_its_length():
    assert fitted([5, 6, 7], 2, "k", 512) == [5, 6]
    padded = fitted([5], 4, "k", 512)
    assert padded[0] == 5 and padded[1:] == seeded_tokens("k", 3, 512)
