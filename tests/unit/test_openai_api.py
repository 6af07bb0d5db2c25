"""The OpenAI API clients speak, onto the token-id completions P and D run: what is
refused, what is tokenized, what P and D are sent, and D's stream back as chat."""

from __future__ import annotations

import json

import pytest

from jobs.serving import openai_api
from jobs.serving.openai_api import CHAT, COMPLETIONS, ChatStream

pytestmark = pytest.mark.unit

MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]


def test_what_the_router_cannot_translate_is_refused_with_the_reason():
    ok = {"messages": MESSAGES}
    assert openai_api.unsupported(ok, CHAT) is None
    assert "n > 1" in openai_api.unsupported({**ok, "n": 2}, CHAT)
    assert "tool" in openai_api.unsupported({**ok, "tools": [{"type": "function"}]}, CHAT)
    assert openai_api.unsupported({**ok, "tools": [{}], "tool_choice": "none"}, CHAT) is None
    assert "logprobs" in openai_api.unsupported({**ok, "logprobs": True}, CHAT)
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
    assert "other than text" in openai_api.unsupported({"messages": image}, CHAT)
    assert "messages" in openai_api.unsupported({"messages": []}, CHAT)
    assert openai_api.unsupported({"prompt": "hello"}, COMPLETIONS) is None
    assert openai_api.unsupported({"prompt": [3, 4]}, COMPLETIONS) is None
    assert "one text" in openai_api.unsupported({"prompt": ["a", "b"]}, COMPLETIONS)


def test_chat_and_text_prompts_are_tokenized_by_the_server_token_ids_are_not():
    assert openai_api.needs_tokens({"messages": MESSAGES}, CHAT)
    assert openai_api.needs_tokens({"prompt": "hello"}, COMPLETIONS)
    assert not openai_api.needs_tokens({"prompt": [3, 4]}, COMPLETIONS)
    body = {"model": "m", "messages": MESSAGES, "chat_template_kwargs": {"x": 1}, "seed": 3}
    assert openai_api.tokenize_request(body, CHAT) == {
        "model": "m",
        "messages": MESSAGES,
        "chat_template_kwargs": {"x": 1},
    }
    text = openai_api.tokenize_request({"model": "m", "prompt": "hello"}, COMPLETIONS)
    assert text == {"model": "m", "prompt": "hello", "add_special_tokens": True}


def test_a_chat_request_becomes_the_same_sampling_on_its_prompt_ids():
    body = {
        "model": "m",
        "messages": MESSAGES,
        "max_completion_tokens": 12,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "conversation_id": "c1",
        "chat_template_kwargs": {},
        "return_token_ids": True,
    }
    out = openai_api.completion_request(body, CHAT, [1, 5, 6])
    assert out == {
        "model": "m",
        "prompt": [1, 5, 6],
        "max_tokens": 12,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
    }
    # chat's default length is what the context leaves, not completions' 16 tokens
    unlimited = openai_api.completion_request({"messages": MESSAGES}, CHAT, [1])
    assert "max_tokens" in unlimited and unlimited["max_tokens"] is None


def event(data: dict) -> bytes:
    return b"data: " + json.dumps(data).encode() + b"\n\n"


def completion_chunk(text: str, ids: list[int], finish: str | None = None) -> bytes:
    choice = {"index": 0, "text": text, "finish_reason": finish, "token_ids": ids}
    return event({"id": "cmpl-1", "model": "m", "choices": [choice], "usage": None})


def test_ds_completion_stream_goes_back_as_chat_chunks_whatever_the_reads_cut():
    usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    stream = (
        completion_chunk("hel", [7])
        + completion_chunk("lo", [8], "length")
        + event({"id": "cmpl-1", "model": "m", "choices": [], "usage": usage})
        + b"data: [DONE]\n\n"
    )
    for cut in (len(stream), 7, 1):  # whole, in pieces, byte by byte
        chat = ChatStream("r1", json.loads, lambda d: json.dumps(d).encode())
        out = b"".join(chat.feed(stream[i : i + cut]) for i in range(0, len(stream), cut))
        events = [e for e in out.split(b"\n\n") if e]
        assert events[-1] == b"data: [DONE]"
        chunks = [json.loads(e[len(b"data: ") :]) for e in events[:-1]]
        assert [c["object"] for c in chunks] == ["chat.completion.chunk"] * 3
        assert {c["id"] for c in chunks} == {"chatcmpl-r1"}
        first, second, last = chunks
        # the role goes with the first token, so a client times its first token there
        assert first["choices"][0]["delta"] == {"role": "assistant", "content": "hel"}
        assert first["choices"][0]["token_ids"] == [7]
        assert second["choices"][0]["delta"] == {"content": "lo"}
        assert second["choices"][0]["finish_reason"] == "length"
        assert last["choices"] == [] and last["usage"] == usage


def test_a_non_streamed_completion_goes_back_as_a_chat_completion():
    completion = {
        "id": "cmpl-1",
        "created": 5,
        "model": "m",
        "choices": [{"index": 0, "text": "hello", "finish_reason": "stop", "token_ids": [7]}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }
    chat = openai_api.chat_response(completion, "r1")
    assert chat["object"] == "chat.completion" and chat["id"] == "chatcmpl-r1"
    assert chat["choices"][0]["message"] == {"role": "assistant", "content": "hello"}
    assert chat["choices"][0]["token_ids"] == [7] and chat["usage"] == completion["usage"]


def test_the_answers_token_count_is_read_from_its_usage_for_the_request_log():
    """What a recorded session's replay sends back (``output_tokens`` in the router's log)."""
    usage = {"usage": {"prompt_tokens": 9, "completion_tokens": 5}}
    assert openai_api.completion_tokens(json.dumps(usage).encode()) == 5
    assert openai_api.completion_tokens(b'{"choices": []}') == -1
    assert openai_api.completion_tokens(b'{"completion_tokens" broken') == -1
    events = [
        {"choices": [{"index": 0, "text": "a", "token_ids": [7]}]},
        {"choices": [], **usage},
    ]
    raw = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    for stream in (
        openai_api.CompletionStream(json.loads, lambda x: json.dumps(x).encode()),
        ChatStream("r", json.loads, lambda x: json.dumps(x).encode()),
    ):
        assert stream.completion_tokens == -1
        stream.feed(raw[:20])
        stream.feed(raw[20:])
        assert stream.completion_tokens == 5
