"""`eaglewire serve` over real HTTP on 127.0.0.1: a tiny target with a briefly trained draft, the
package's own server on a free port, and clients that share no code with it (urllib, http.client,
the `openai` package)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from eaglewire.engine.api import SpeculativeDecoder
from eaglewire.engine.sampling import SamplingParams
from eaglewire.serve.loading import LoadOptions, ServedModel, load_served_model
from tests.helpers.tiny import CORPUS
from tests.unit.serve.world import (
    SPEC,
    ServerThread,
    Stream,
    World,
    http,
    metric,
    running,
    sse_events,
    wait_for,
)


def options(world: World, **changes: Any) -> LoadOptions:
    base = LoadOptions(
        target=str(world.target_dir),
        draft=world.draft_dir,
        engine="auto",
        sglang_version=None,
        vllm_version=None,
        spec=SPEC,
        dtype="float32",
        device="cpu",
        runner="auto",
        context_length=None,
    )
    return replace(base, **changes)


@pytest.fixture(scope="module")
def served(world: World) -> ServedModel:
    return load_served_model(options(world), "tiny")


@pytest.fixture(scope="module")
def server(served: ServedModel) -> Iterator[ServerThread]:
    with running(served, max_queue=4) as s:
        yield s


@pytest.fixture(scope="module")
def reference(world: World) -> SpeculativeDecoder:
    """The same target and draft loaded the library's way, outside the server."""
    return SpeculativeDecoder.load(str(world.target_dir), world.draft_dir, spec=SPEC, dtype="float32")


def chat(text: str, **fields: Any) -> dict[str, Any]:
    return {"model": "tiny", "messages": [{"role": "user", "content": text}], "temperature": 0, **fields}


def streamed_text(events: list[Any]) -> str:
    out = []
    for e in events:
        if isinstance(e, dict) and e.get("choices"):
            choice = e["choices"][0]
            out.append(choice["delta"].get("content", "") if "delta" in choice else choice["text"])
    return "".join(out)


def spec_details(body: dict[str, Any]) -> dict[str, Any]:
    details: dict[str, Any] = body["sglext"]["spec_tokens_details"]
    return details


def test_greedy_served_equals_the_library(server: ServerThread, reference: SpeculativeDecoder) -> None:
    """Chat and completions: the served text and token ids are the decoder's, and the spec fields are
    SGLang's formulas over that generation's own rounds."""
    for text in CORPUS[:2]:
        body = chat(text, max_tokens=40, return_token_ids=True, return_meta_info=True)
        answer = http(server.url + "/v1/chat/completions", body)
        assert answer.status == 200, answer.body
        body = answer.json()
        expected = reference.generate(text, max_new_tokens=40)
        choice = body["choices"][0]
        assert choice["message"]["content"] == expected.text
        assert choice["token_ids"] == expected.token_ids
        assert (
            body["prompt_token_ids"] == choice["prompt_token_ids"] == reference.encode(text)
        )  # vLLM's, SGLang's
        assert choice["response_token_ids"] == expected.token_ids  # SGLang's name
        assert body["usage"] == {
            "prompt_tokens": expected.prompt_tokens,
            "completion_tokens": len(expected.token_ids),
            "total_tokens": expected.prompt_tokens + len(expected.token_ids),
        }
        details = spec_details(body)
        verify_ct = details["spec_verify_ct"]
        assert verify_ct == expected.num_verifications > 0
        assert details["spec_accept_length"] == pytest.approx(len(expected.token_ids) / verify_ct)
        histogram = details["spec_correct_drafts_histogram"]
        assert sum(histogram) == verify_ct
        assert sum(k * n for k, n in enumerate(histogram)) == details["spec_num_correct_drafts"] > 0
        assert details["spec_num_proposed_drafts"] == verify_ct * (SPEC.num_draft_tokens - 1)
        correct = details["spec_num_correct_drafts"]
        assert details["spec_accept_rate"] == pytest.approx(correct / (verify_ct * 4))
        meta = choice["meta_info"]  # SGLang's legacy place: the same numbers
        assert meta["finish_reason"] == {"type": "length", "length": 40} and meta["completion_tokens"] == 40
        assert all(
            meta[k] == details[k] for k in ("spec_verify_ct", "spec_accept_length", "spec_num_correct_drafts")
        )
    completion = http(
        server.url + "/v1/completions", {"prompt": "def add(a, b):", "max_tokens": 24, "temperature": 0}
    )
    expected = reference.generate("def add(a, b):", max_new_tokens=24, chat=False)
    assert completion.json()["choices"][0]["text"] == expected.text


def test_stream_and_no_stream_agree(server: ServerThread, reference: SpeculativeDecoder) -> None:
    """(d) The same text, usage and spec fields, streamed or not; with a stop string as well."""
    full = reference.generate(CORPUS[2], max_new_tokens=48)
    stop = full.text[len(full.text) // 2 :][:2]  # a stop string the greedy text reaches
    cases = [
        ("/v1/chat/completions", chat(CORPUS[2], max_tokens=48)),
        ("/v1/chat/completions", chat(CORPUS[2], max_tokens=48, stop=[stop])),
        ("/v1/completions", {"prompt": CORPUS[0], "max_tokens": 30, "temperature": 0}),
    ]
    for path, body in cases:
        whole = http(server.url + path, body).json()
        answer = http(server.url + path, {**body, "stream": True, "stream_options": {"include_usage": True}})
        assert answer.status == 200 and answer.headers["Content-Type"].startswith("text/event-stream")
        events = sse_events(answer.body)
        assert events[-1] == "[DONE]"
        choice = whole["choices"][0]
        assert streamed_text(events) == choice.get("message", {}).get("content", choice.get("text"))
        last = [e for e in events if isinstance(e, dict) and e["choices"]][-1]["choices"][0]
        assert (last["finish_reason"], last["matched_stop"]) == (
            choice["finish_reason"],
            choice["matched_stop"],
        )
        assert events[-2]["usage"] == whole["usage"]
        assert events[-3]["sglext"] == whole["sglext"]
    stopped = http(server.url + cases[1][0], cases[1][1]).json()["choices"][0]
    assert stopped["finish_reason"] == "stop" and stopped["matched_stop"] == stop
    assert stopped["message"]["content"] == reference.generate(CORPUS[2], max_new_tokens=48, stop=[stop]).text


def test_metrics_move_by_exactly_the_request(server: ServerThread) -> None:
    before = http(server.url + "/metrics").body.decode()
    body = http(server.url + "/v1/chat/completions", chat(CORPUS[0], max_tokens=32)).json()
    after = http(server.url + "/metrics").body.decode()
    details = spec_details(body)

    def delta(name: str, **labels: str) -> float:
        return metric(after, name, **labels) - metric(before, name, **labels)

    histogram = details["spec_correct_drafts_histogram"]
    assert delta("vllm:spec_decode_num_drafts_total") == details["spec_verify_ct"]
    assert delta("vllm:spec_decode_num_draft_tokens_total") == details["spec_num_proposed_drafts"]
    assert delta("vllm:spec_decode_num_accepted_tokens_total") == details["spec_num_correct_drafts"]
    for i in range(SPEC.num_steps):  # position i: rounds that accepted more than i drafts
        assert delta("vllm:spec_decode_num_accepted_tokens_per_pos_total", position=str(i)) == sum(
            histogram[i + 1 :]
        )
    assert delta("vllm:generation_tokens_total") == body["usage"]["completion_tokens"]
    assert delta("vllm:prompt_tokens_total") == body["usage"]["prompt_tokens"]
    assert delta("vllm:request_success_total", finished_reason="length") == 1


def test_bad_requests_get_400_with_the_reason(server: ServerThread) -> None:
    """(e) Malformed JSON, a field of the wrong type, a prompt longer than the context."""
    cases = [
        (b'{"messages": [', "invalid JSON", None, "invalid_json"),
        (json.dumps(chat("hi", max_tokens="ten")).encode(), 'max_tokens: expected an integer', "max_tokens", "invalid_type"),
        (json.dumps(chat("hi " * 600)).encode(), "context holds 512 tokens", "messages", "context_length_exceeded"),
        (json.dumps(chat("hi", max_tokens=500)).encode(), "max_completion_tokens=500 does not fit", "max_completion_tokens",
         "context_length_exceeded"),
    ]  # fmt: skip
    for raw, says, param, code in cases:
        answer = http(server.url + "/v1/chat/completions", raw=raw)
        assert answer.status == 400, answer.body
        error = answer.json()["error"]
        assert says in error["message"] and error["param"] == param and error["code"] == code, error
        assert error["type"] == "invalid_request_error"
    missing = http(server.url + "/v1/embeddings", {"input": "x"})
    assert missing.status == 404 and "/v1/chat/completions" in missing.json()["error"]["message"]


def test_models_and_health(server: ServerThread, world: World) -> None:
    card = http(server.url + "/v1/models").json()["data"][0]
    assert card["id"] == "tiny" and card["max_model_len"] == 512
    assert card["eaglewire"]["aux_boundaries"] == list(world.contract.aux_boundaries)
    assert http(server.url + "/health").json()["status"] == "ok"


LONG = {"prompt": CORPUS[3], "max_tokens": 400, "temperature": 0, "return_token_ids": True}


def test_a_client_that_disconnects_cancels_its_request(server: ServerThread) -> None:
    cancelled_before = server.server.metrics.cancelled
    generated_before = server.server.metrics.generation_tokens
    stream = Stream(server.url, LONG)
    assert stream.next_event()["choices"][0]["token_ids"] == []  # the first chunk: the prompt's ids
    assert stream.next_event()["choices"][0]["token_ids"]  # decoding: a round's tokens
    stream.hang_up()
    wait_for(
        lambda: server.server.metrics.cancelled == cancelled_before + 1 and server.server.queue.running == 0
    )
    assert server.server.metrics.generation_tokens - generated_before < LONG["max_tokens"]
    started = time.monotonic()  # the decoder is free: the next request is answered at once
    assert http(server.url + "/v1/completions", {"prompt": "a", "max_tokens": 4}).status == 200
    assert time.monotonic() - started < 2


def test_a_full_queue_answers_503_with_retry_after(served: ServedModel) -> None:
    with running(served, max_queue=0) as server:
        stream = Stream(server.url, LONG)
        stream.next_event()  # the request holds the decoder (queued or decoding): the queue is full
        answer = http(server.url + "/v1/chat/completions", chat("hi", max_tokens=4))
        assert answer.status == 503, answer.body
        assert int(answer.headers["Retry-After"]) >= 1
        error = answer.json()["error"]
        assert error["code"] == "queue_full" and "--max-queue 0" in error["message"]
        stream.hang_up()
        wait_for(lambda: server.server.queue.running + server.server.queue.waiting == 0)
        assert http(server.url + "/v1/chat/completions", chat("hi", max_tokens=4)).status == 200
        assert (
            metric(
                http(server.url + "/metrics").body.decode(),
                "eaglewire:requests_rejected_total",
                reason="queue_full",
            )
            == 1
        )


def test_the_openai_client_talks_to_it_unchanged(server: ServerThread, reference: SpeculativeDecoder) -> None:
    """(f) The `openai` package, streaming and not, and its error class for a 400."""
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    expected = reference.generate(CORPUS[1], max_new_tokens=32).text
    messages = [{"role": "user", "content": CORPUS[1]}]
    reply = client.chat.completions.create(model="tiny", messages=messages, max_tokens=32, temperature=0)
    assert reply.choices[0].message.content == expected and reply.usage.completion_tokens == 32
    chunks = client.chat.completions.create(
        model="tiny",
        messages=messages,
        max_tokens=32,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected
    completion = client.completions.create(model="tiny", prompt="def add(a, b):", max_tokens=8, temperature=0)
    assert (
        completion.choices[0].text == reference.generate("def add(a, b):", max_new_tokens=8, chat=False).text
    )
    assert [m.id for m in client.models.list()] == ["tiny"]
    with pytest.raises(openai.BadRequestError, match="top_p"):
        client.chat.completions.create(model="tiny", messages=messages, top_p=2.0)


def test_sampling_follows_the_seed(server: ServerThread, reference: SpeculativeDecoder) -> None:
    body = chat(CORPUS[0], max_tokens=24, temperature=0.8, top_p=0.9, seed=7)
    first = http(server.url + "/v1/chat/completions", body).json()["choices"][0]["message"]["content"]
    assert http(server.url + "/v1/chat/completions", body).json()["choices"][0]["message"]["content"] == first
    expected = reference.generate(CORPUS[0], max_new_tokens=24, sampling=SamplingParams(0.8, 0.9, 7))
    assert first == expected.text


# An edit of the export's config.json -> the aux boundaries that engine then reads (trained: 2, 4, 5).
MISWIRED = {
    # vLLM: ids are boundaries; one layer late each
    "vllm": (lambda c: c.update(eagle_aux_hidden_state_layer_ids=[3, 5, 6]), (3, 5, 6)),
    # SGLang: ids are layer outputs (every release, as the first id is 1): layers 1, 2, 3 = boundaries 2, 3, 4
    "sglang": (lambda c: c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=[1, 2, 3]), (2, 3, 4)),
}


@pytest.mark.parametrize("engine", sorted(MISWIRED))
def test_an_export_is_served_as_its_engine_reads_it(
    world: World, tmp_path: Path, reference: SpeculativeDecoder, engine: str
) -> None:
    """An export of the draft serves the same rounds as the draft; one whose config.json names other
    layers is served with those layers (lossless still, its acceptance the miswired one), as that
    engine would serve it: nothing is corrected on the way in."""
    from eaglewire.export.exporting import export_draft

    export = export_draft(world.draft_dir, engine, tmp_path / engine).out  # type: ignore[arg-type]
    right = load_served_model(options(world, draft=export, engine=engine), "tiny")
    assert right.draft.aux_boundaries == world.contract.aux_boundaries == (2, 4, 5)
    expected = reference.generate(CORPUS[2], max_new_tokens=32)
    got = right.decoder.generate(CORPUS[2], max_new_tokens=32)
    assert got.token_ids == expected.token_ids and got.accepted_per_round == expected.accepted_per_round

    edit, served_boundaries = MISWIRED[engine]
    config = json.loads((export / "config.json").read_text())
    edit(config)
    (export / "config.json").write_text(json.dumps(config))
    wrong = load_served_model(options(world, draft=export, engine=engine), "tiny")
    assert wrong.draft.aux_boundaries == served_boundaries
    with running(wrong) as server:
        body = http(server.url + "/v1/chat/completions", chat(CORPUS[2], max_tokens=32)).json()
        card = http(server.url + "/v1/models").json()["data"][0]["eaglewire"]
    assert card["aux_boundaries"] == list(served_boundaries) and card["draft_format"] == engine
    assert body["choices"][0]["message"]["content"] == expected.text  # greedy: lossless whatever the wiring
    assert spec_details(body)["spec_accept_length"] < expected.tau


def test_without_a_draft_it_decodes_plainly_and_reports_no_spec_fields(
    world: World, reference: SpeculativeDecoder
) -> None:
    plain = load_served_model(options(world, draft=None), "tiny")
    with running(plain) as server:
        body = http(server.url + "/v1/chat/completions", chat(CORPUS[1], max_tokens=24)).json()
        text = http(server.url + "/metrics").body.decode()
    assert "sglext" not in body and "spec_decode" not in text  # as SGLang and vLLM without speculation
    assert body["choices"][0]["message"]["content"] == reference.generate(CORPUS[1], max_new_tokens=24).text


def test_an_export_is_served_in_the_engines_order_and_release(
    world: World, tmp_path: Path, reference: SpeculativeDecoder
) -> None:
    """vLLM sorts the ids it is given (so ids written out of order are served in layer order, as vLLM
    does); a release eaglewire never read is refused by name; a named release is the one whose rule reads."""
    from eaglewire.contract.numbering import Engine, engine_readings
    from eaglewire.errors import BoundaryError
    from eaglewire.export.exporting import export_draft

    export = export_draft(world.draft_dir, "vllm", tmp_path / "vllm").out
    config = json.loads((export / "config.json").read_text())
    config["eagle_aux_hidden_state_layer_ids"] = [5, 2, 4]
    (export / "config.json").write_text(json.dumps(config))
    served = load_served_model(options(world, draft=export, vllm_version="0.33.0"), "tiny")
    assert served.draft.aux_boundaries == (2, 4, 5) and "vLLM 0.33.0" in served.draft.reading
    got = served.decoder.generate(CORPUS[2], max_new_tokens=32)
    assert got.accepted_per_round == reference.generate(CORPUS[2], max_new_tokens=32).accepted_per_round

    sglang = export_draft(world.draft_dir, "sglang", tmp_path / "sglang").out
    with pytest.raises(BoundaryError, match="--sglang-version 0.1.0"):
        load_served_model(options(world, draft=sglang, sglang_version="0.1.0"), "tiny")
    named = load_served_model(options(world, draft=sglang, sglang_version="0.5.23"), "tiny")
    ids = json.loads((sglang / "config.json").read_text())["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    (reading,) = engine_readings(
        Engine.SGLANG, world.target.architecture, ids, world.target.num_layers, "0.5.23"
    )
    assert named.draft.aux_boundaries == reading.boundaries == world.contract.aux_boundaries


def test_releases_that_read_the_ids_apart_need_the_release_named(world: World, tmp_path: Path) -> None:
    """On a DeepSeek-V3 target SGLang's id rule changed between releases: ids that the releases read
    apart are refused without --sglang-version (each release's reading shown), served with it."""
    from eaglewire.contract.numbering import Engine, engine_readings
    from eaglewire.errors import BoundaryError
    from eaglewire.export.exporting import export_draft
    from tests.helpers.tiny import make_tiny_target, save_tiny_target

    target_dir = save_tiny_target(make_tiny_target("deepseek_v3"), tmp_path / "deepseek")
    export = export_draft(world.draft_dir, "sglang", tmp_path / "sglang").out
    config = json.loads((export / "config.json").read_text())
    ids = list(world.contract.aux_boundaries)  # boundaries written as SGLang ids: the field reports' mistake
    config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = ids
    (export / "config.json").write_text(json.dumps(config))
    on_deepseek = options(world, target=str(target_dir), draft=export)
    with pytest.raises(BoundaryError, match="--sglang-version X.Y.Z") as refused:
        load_served_model(on_deepseek, "deepseek")
    readings = engine_readings(Engine.SGLANG, "DeepseekV3ForCausalLM", ids, 8)
    assert len({r.boundaries for r in readings}) > 1 and all(r.label in str(refused.value) for r in readings)
    for reading in readings:
        served = load_served_model(replace(on_deepseek, sglang_version=str(reading.rule.last)), "deepseek")
        assert served.draft.aux_boundaries == reading.boundaries


def test_a_release_flag_for_another_format_is_refused(world: World) -> None:
    from eaglewire.errors import ConfigError

    with pytest.raises(ConfigError, match="--sglang-version 0.5.23 names the sglang release .* is eaglewire"):
        load_served_model(options(world, sglang_version="0.5.23"), "tiny")
    with pytest.raises(ConfigError, match="--vllm-version 0.33.0 .* but no draft"):
        load_served_model(options(world, draft=None, vllm_version="0.33.0"), "tiny")
