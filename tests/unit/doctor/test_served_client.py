"""Reading served acceptance the engines' ways, from responses in their documented shapes (no server).

SGLang 0.5.23: `sglext.spec_tokens_details` (`SpecTokensDetails`, protocol.py 456-481) and the choice's
`prompt_token_ids` / `response_token_ids`; vLLM 0.33.0: the Prometheus counters of
`vllm/v1/spec_decode/metrics.py` (labels `model_name`, `engine`, `position`) and `token_ids`.
"""

from __future__ import annotations

import socket
from types import SimpleNamespace
from typing import Any

import pytest

from eaglewire.doctor.served_client import (
    RoundCounts,
    ServedClient,
    ServerError,
    agreement,
    base_url,
    parse_chat_response,
    parse_prometheus,
    validate_served_flags,
    vllm_counts,
)
from eaglewire.errors import ConfigError, EaglewireError

WHERE = "POST http://127.0.0.1:1/v1/chat/completions"


def sglang_answer(**details: Any) -> dict[str, Any]:
    """A non-streamed SGLang 0.5.23 chat completion asked for return_spec_tokens_details and return_token_ids."""
    spec = {
        "spec_accept_rate": 0.5,
        "spec_accept_length": 2.5,
        "spec_cap_length": 0.0,
        "spec_block_accept_length": 0.0,
        "spec_num_correct_drafts": 3,
        "spec_num_proposed_drafts": 6,
        "spec_verify_ct": 2,
        "spec_correct_drafts_histogram": [0, 1, 1],
        "spec_cap_lens_histogram": [],
    } | details
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hi there"},
                "finish_reason": "length",
                "matched_stop": None,
                "prompt_token_ids": [1, 2, 3],
                "response_token_ids": [5, 6, 7, 8, 9],
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8},
        "sglext": {"spec_tokens_details": spec},
    }


def test_sglang_fields_become_rounds() -> None:
    r = parse_chat_response(sglang_answer(), "p0", "sglang", WHERE)
    assert (r.prompt_ids, r.output_ids, r.completion_tokens, r.text) == (
        [1, 2, 3],
        [5, 6, 7, 8, 9],
        5,
        "Hi there",
    )
    counts = r.counts("sglang")
    assert (counts.verifications, counts.accepted, counts.proposed) == (2, 3, 6)
    assert counts.accepted_per_position == [2, 1]  # histogram [0, 1, 1]: both rounds >= 1, one >= 2
    assert counts.tau == 2.5 and counts.per_position_acceptance(3) == [1.0, 0.5, 0.0]


def test_sglang_without_the_fields_names_them() -> None:
    answer = sglang_answer()
    del answer["sglext"]
    with pytest.raises(ServerError, match=r"(?s)no sglext\.spec_tokens_details.*return_spec_tokens_details"):
        parse_chat_response(answer, "p0", "sglang", WHERE)
    with pytest.raises(ServerError, match=r"spec_verify_ct: expected a non-negative integer, got None"):
        parse_chat_response(sglang_answer(spec_verify_ct=None), "p0", "sglang", WHERE)
    with pytest.raises(ServerError, match=r"histogram sums to 2 verifications, spec_verify_ct says 3"):
        parse_chat_response(sglang_answer(spec_verify_ct=3), "p0", "sglang", WHERE)
    one_token = sglang_answer()
    del one_token["sglext"]
    one_token["usage"]["completion_tokens"] = 1  # SGLang leaves the fields out when nothing was verified
    assert parse_chat_response(one_token, "p0", "sglang", WHERE).counts("sglang").verifications == 0


def test_vllm_shape_ids_and_no_per_response_counts() -> None:
    answer = sglang_answer()
    del answer["sglext"]
    choice = answer["choices"][0]
    del choice["prompt_token_ids"], choice["response_token_ids"]
    answer["prompt_token_ids"], choice["token_ids"] = [7, 8], [9, 10]
    r = parse_chat_response(answer, "p0", "vllm", WHERE)
    assert (r.prompt_ids, r.output_ids, r.per_response) == ([7, 8], [9, 10], None)
    del answer["prompt_token_ids"], choice["token_ids"]
    r = parse_chat_response(answer, "p0", "vllm", WHERE)
    assert (r.prompt_ids, r.output_ids) == (None, None)  # the doctor re-tokenizes then


VLLM_METRICS = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{{engine="0",model_name="m"}} {drafts}
vllm:spec_decode_num_drafts_created{{engine="0",model_name="m"}} 1.7e9
vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="m"}} {tokens}
vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="m"}} {accepted}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="0"}} {p0}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="1"}} {p1}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="2"}} {p2}
vllm:num_requests_running{{engine="0",model_name="m \\"quoted\\""}} 0.0
"""


def metrics(**values: float) -> dict[Any, float]:
    return parse_prometheus(VLLM_METRICS.format(**values), "http://x/metrics")


def test_vllm_counters_deltas() -> None:
    before = metrics(drafts=10, tokens=30, accepted=12, p0=7, p1=4, p2=1)
    after = metrics(drafts=14.0, tokens=42, accepted=19, p0=11, p1=6, p2=2)
    counts = vllm_counts(before, after, "http://x")
    assert (counts.verifications, counts.proposed, counts.accepted) == (4, 12, 7)
    assert counts.accepted_per_position == [4, 2, 1]
    assert counts.tau == 1 + 7 / 4  # vLLM's mean acceptance length
    label = dict(next(k for k in before if k[0] == "vllm:num_requests_running")[1])
    assert label["model_name"] == 'm "quoted"'


def test_vllm_without_counters_names_them() -> None:
    plain = parse_prometheus('vllm:num_requests_running{engine="0"} 0\n', "http://x/metrics")
    with pytest.raises(
        ServerError, match=r"(?s)has no vllm:spec_decode_num_drafts_total.*--speculative-config"
    ):
        vllm_counts(plain, plain, "http://x")
    with pytest.raises(ServerError, match=r"line 1: not a Prometheus sample"):
        parse_prometheus("<html>not metrics</html>\n", "http://x/metrics")


def test_our_two_reports_must_agree() -> None:
    r = parse_chat_response(sglang_answer(), "p0", "eaglewire", WHERE)
    r.metrics_delta = RoundCounts(2, 3, 6, [2, 1])
    assert agreement(r) == []
    r.metrics_delta = RoundCounts(3, 3, 9, [2, 1, 0])
    found = agreement(r)
    assert any("verifications" in line and "2 vs 3" in line for line in found)
    assert any("proposed drafts" in line for line in found)


def test_urls() -> None:
    assert base_url("http://127.0.0.1:30000/v1/") == "http://127.0.0.1:30000"
    assert base_url("https://host/prefix/v1") == "https://host/prefix"
    with pytest.raises(ServerError, match="expected an http"):
        base_url("127.0.0.1:30000")


def test_unreachable_server_is_named() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = ServedClient(f"http://127.0.0.1:{port}", "sglang", timeout=5)
    with pytest.raises(
        ServerError, match=rf"--served http://127.0.0.1:{port}: cannot reach .*/v1/models"
    ) as e:
        client.model()
    assert isinstance(e.value, EaglewireError) and "--served http://HOST:PORT" in str(e.value)


def flags(**changes: Any) -> SimpleNamespace:
    base = {"served": "http://127.0.0.1:1", "engine": "sglang", "prompts": None, "num_prompts": None,
            "draft": "d", "target": "t"}  # fmt: skip
    return SimpleNamespace(**(base | changes))


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"engine": None}, "--served needs --engine"),
        ({"engine": "tgi"}, "--engine: expected one of sglang, vllm, eaglewire"),
        ({"target": None}, "--target missing"),
        ({"served": None}, "--engine: only used with --served"),
        ({"num_prompts": 0}, "--num-prompts: expected >= 1"),
    ],
)
def test_flags_checked_before_anything_loads(changes: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        validate_served_flags(flags(**changes))
    validate_served_flags(flags())
