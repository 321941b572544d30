"""The server's pure parts, in-process: request checking, the spec statistics' arithmetic, the
Prometheus text, and what a stream may show before the end."""

from __future__ import annotations

import json

import pytest

from eaglewire.serve.metrics import ServerMetrics
from eaglewire.serve.protocol import RequestError, parse_json_body, parse_request
from eaglewire.serve.spec_stats import SpecCounters, spec_tokens_details
from eaglewire.serve.streaming import TextDeltas, stop_prefix_length
from tests.unit.serve.world import metric

CHAT = {"messages": [{"role": "user", "content": "hi"}]}


def refused(endpoint: str, body: dict[str, object]) -> RequestError:
    with pytest.raises(RequestError) as info:
        parse_request(endpoint, body)  # type: ignore[arg-type]
    assert info.value.status == 400
    return info.value


def test_defaults_are_openais() -> None:
    chat = parse_request("chat", CHAT)
    assert (chat.temperature, chat.top_p, chat.max_tokens, chat.seed, chat.stop, chat.stream) == (
        1.0, 1.0, None, None, (), False,
    )  # fmt: skip
    completion = parse_request("completion", {"prompt": [[5, 6, 7]], "stop": "x", "max_tokens": 64.0})
    assert completion.prompt == (5, 6, 7) and completion.stop == ("x",) and completion.max_tokens == 64


@pytest.mark.parametrize(
    ("endpoint", "body", "param", "says"),
    [
        ("completion", {"prompt": "a", "max_tokens": "ten"}, "max_tokens", 'got "ten" (a string)'),
        ("completion", {"prompt": "a", "max_tokens": 0}, "max_tokens", "an integer >= 1"),
        ("completion", {"prompt": "a", "temperature": True}, "temperature", "true (a boolean)"),
        ("completion", {"prompt": "a", "top_p": 0}, "top_p", "(0, 1]"),
        ("completion", {"prompt": "a", "seed": -1}, "seed", "in [0,"),
        ("completion", {"prompt": "a", "stop": ""}, "stop", "empty stop string"),
        ("completion", {"prompt": "a", "stop": [1]}, "stop", "array of strings"),
        ("completion", {"prompt": ["a", "b"]}, "prompt", "one prompt per request"),
        ("completion", {"prompt": []}, "prompt", "non-empty array of token ids"),
        ("completion", {"prompt": "a", "n": 2}, "n", "supports only null or 1"),
        ("completion", {"prompt": "a", "echo": True}, "echo", "only null or false"),
        ("completion", {"prompt": "a", "logprobs": 5}, "logprobs", "no log-probabilities"),
        ("completion", {"prompt": "a", "ignore_eos": True}, "ignore_eos", "unrecognized request argument"),
        (
            "completion",
            {"prompt": "a", "stream_options": {"include_usage": True}},
            "stream_options",
            "stream=true",
        ),
        ("chat", {"messages": []}, "messages", "non-empty array"),
        ("chat", {"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role", "one of system"),
        (
            "chat",
            {"messages": [{"role": "user", "content": 3}]},
            "messages[0].content",
            "a string or an array",
        ),
        ("chat", {**CHAT, "max_tokens": 3, "max_completion_tokens": 4}, "max_completion_tokens", "disagree"),
        ("chat", {**CHAT, "model": 7}, "model", "a string or null"),
        ("chat", {**CHAT, "tools": [{"type": "function"}]}, "tools", "supports only"),
        (
            "chat",
            {**CHAT, "stream": True, "return_meta_info": True},
            "return_meta_info",
            "not supported with streaming",
        ),
    ],
)
def test_each_bad_field_is_named(endpoint: str, body: dict[str, object], param: str, says: str) -> None:
    error = refused(endpoint, body)
    assert error.param == param and says in error.message, error.message
    assert set(error.body()["error"]) == {"message", "type", "param", "code"}


def test_body_must_be_a_json_object() -> None:
    for raw, says in (
        (b"{bad", "invalid JSON"),
        (b"[1]", "expected a JSON object, got an array"),
        (b"\xff", "UTF-8"),
    ):
        with pytest.raises(RequestError, match=says):
            parse_json_body(raw)
    assert parse_json_body(json.dumps(CHAT).encode()) == CHAT


def test_text_parts_and_accepted_no_ops() -> None:
    body = {
        "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
        "n": 1, "presence_penalty": 0, "logprobs": False, "user": "me", "return_spec_tokens_details": True,
        "response_format": {"type": "text"}, "stream": True, "stream_options": {"include_usage": True},
    }  # fmt: skip
    request = parse_request("chat", body)
    assert request.messages == ({"role": "user", "content": "ab"},) and request.include_usage


def test_sglang_spec_fields_add_up() -> None:
    rounds = [2, 0, 3, 3, 1]
    details = spec_tokens_details(rounds, completion_tokens=12, num_draft_tokens=5)
    assert details["spec_verify_ct"] == 5
    assert details["spec_accept_length"] == 12 / 5
    assert details["spec_num_correct_drafts"] == 9
    assert details["spec_num_proposed_drafts"] == 5 * 4
    assert details["spec_accept_rate"] == 9 / 20
    assert details["spec_correct_drafts_histogram"] == [1, 1, 1, 2]
    empty = spec_tokens_details([], completion_tokens=0, num_draft_tokens=5)
    assert empty["spec_accept_length"] == 0.0 and empty["spec_correct_drafts_histogram"] == []


def test_vllm_counters_and_their_text() -> None:
    counters = SpecCounters(num_positions=3)
    counters.observe([2, 0, 3], drafts_per_round=4)
    assert (counters.num_drafts, counters.num_draft_tokens, counters.num_accepted_tokens) == (3, 12, 5)
    assert counters.num_accepted_tokens_per_pos == [2, 2, 1]
    with pytest.raises(ValueError, match="accepted=4"):
        counters.observe([4], drafts_per_round=4)

    metrics = ServerMetrics('tiny "model"', num_steps=3, num_draft_tokens=5)
    metrics.record_generation(
        prompt_tokens=7, completion_tokens=9, accepted_per_round=[2, 0, 3], finished="length"
    )
    metrics.record_generation(prompt_tokens=3, completion_tokens=1, accepted_per_round=[1], finished="abort")
    text = metrics.render(running=1, waiting=2)
    assert metric(text, "vllm:spec_decode_num_drafts_total") == 4
    assert metric(text, "vllm:spec_decode_num_draft_tokens_total") == 16
    assert metric(text, "vllm:spec_decode_num_accepted_tokens_total") == 6
    assert [metric(text, "vllm:spec_decode_num_accepted_tokens_per_pos_total", position=str(i)) for i in range(3)] == [
        3, 2, 1,
    ]  # fmt: skip
    assert metric(text, "vllm:request_success_total", finished_reason="length") == 1
    assert metric(text, "eaglewire:requests_cancelled_total") == 1
    assert metric(text, "vllm:num_requests_waiting") == 2
    assert 'model_name="tiny \\"model\\""' in text  # label values escaped
    plain = ServerMetrics("m", num_steps=None, num_draft_tokens=None).render(running=0, waiting=0)
    assert "spec_decode" not in plain  # as vLLM: no spec counters without a speculative config


def test_stream_holds_back_what_may_still_change() -> None:
    assert stop_prefix_length("hello wor", ["world"]) == 3
    assert stop_prefix_length("hello", ["xyz"]) == 0
    pieces = {1: "ab", 2: "c<", 3: "/s", 4: "x", 5: "\u00e9"}

    def decode(ids: list[int]) -> str:
        text = "".join(pieces[i] for i in ids)
        return text[:-1] + "\ufffd" if ids and ids[-1] == 5 else text  # a partial character, as bytes decode

    deltas = TextDeltas(decode, ["</s>"])
    assert deltas.push([1]) == "ab"
    assert deltas.push([2]) == "c"  # "<" may begin the stop string
    assert deltas.push([3]) == ""  # "</s" too
    assert deltas.push([5]) == ""  # a partial character is not shown (and "</s" may still be the stop)
    assert deltas.push([4]) == "</s\u00e9x"
    assert deltas.push([2]) == "c"
    assert deltas.finish("abc</s\u00e9xc") == ""  # stopped before "</s>": the held-back "<" is not sent
    other = TextDeltas(decode, [])
    assert other.push([1, 2]) == "abc<" and other.finish("abc<!") == "!"
