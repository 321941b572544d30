"""`eaglewire doctor --served` against `eaglewire serve` over real HTTP on 127.0.0.1 (issue 45 item 4 a, b).

The world (`served_world`): a tiny target whose boundaries differ, a draft trained on its greedy answers to the
prompts the doctor sends, and its real SGLang / vLLM exports. Each test starts the package's own server
(`eaglewire.serve`, the real aiohttp app on a free port, decoding with the real engine) on a correct or a
deliberately miswired deployment: an export whose config.json a user edited, served the way that engine
reads it, or a launch flag; the doctor (the CLI, in this process) sends the prompts, replays the served text
and must name the fault class and its fix. In float32 on a CPU the replay is exact: the matching candidate
predicts every prompt's verifications.
"""

from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner, Result

from eaglewire.cli import app
from eaglewire.doctor.miswirings import AuxSource, ServedSetup, Wiring, all_candidates
from eaglewire.doctor.served_client import RoundCounts, ServerError
from eaglewire.doctor.served_compare import CHECK, ServedCheck, compare_served, tolerance
from eaglewire.doctor.served_replay import ReplayWorld, ServedText
from eaglewire.engine.spec_args import SpecArgs
from tests.unit.doctor.served_world import ANSWER_TOKENS, CHAIN, ServedWorld, build_world, edit_config, export

runner = CliRunner()
SPEC = SpecArgs.chain(CHAIN)


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """Tiny matmuls on a shared 2-core machine: a second intra-op thread only adds contention."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> ServedWorld:
    base = tmp_path_factory.mktemp("served")
    w = build_world(base)
    export(w, "sglang", base / "sglang")
    export(w, "vllm", base / "vllm")
    return w


@contextmanager
def serving(
    world: ServedWorld, draft: Path | None, *, engine: str = "auto", spec: SpecArgs = SPEC
) -> Iterator[str]:
    """A real server (eaglewire.serve) on a free port of 127.0.0.1 for this deployment; yields its URL."""
    from eaglewire.serve.loading import LoadOptions, load_served_model
    from tests.unit.serve.world import running

    options = LoadOptions(
        target=str(world.target_dir), draft=draft, engine=engine, sglang_version=None, vllm_version=None,  # type: ignore[arg-type]
        spec=spec, dtype="float32", device="cpu", runner="auto", context_length=None,
    )  # fmt: skip
    with running(load_served_model(options, "tiny")) as server:
        yield server.url


def edited(world: ServedWorld, fmt: str, key: str, ids: list[int]) -> Path:
    """A copy of the world's `fmt` export whose config.json says `ids` at `key` (a user's hand edit)."""
    out = world.draft_dir.parent / f"{fmt}-{'-'.join(map(str, ids))}"
    if not out.exists():
        shutil.copytree(world.draft_dir.parent / fmt, out)
        edit_config(out, key, ids)
    return out


def doctor(url: str, world: ServedWorld, *extra: str, engine: str = "eaglewire") -> Result:
    args = ["doctor", "--served", url, "--engine", engine, "--draft", str(world.draft_dir),
            "--target", str(world.target_dir), "--prompts", str(world.prompts_file),
            "--max-tokens", str(ANSWER_TOKENS), *extra]  # fmt: skip
    return runner.invoke(app, args)


def served_block(result: Result) -> dict[str, Any]:
    report = json.loads(result.stdout)
    return next(c["served"] for c in report["checks"] if c["name"] == "served acceptance")


def test_a_correct_export_served_matches(world: ServedWorld) -> None:
    """(a) The SGLang export, served the way SGLang reads it, read SGLang's way (per response): exit 0, exact."""
    with serving(world, world.draft_dir.parent / "sglang", engine="sglang") as url:
        r = doctor(url, world, "--json", engine="sglang")
    assert r.exit_code == 0, r.output
    served = served_block(r)
    assert served["verdict"] == "match" and served["exact"], served
    assert served["served_verifications_per_prompt"] == served["predicted_verifications_per_prompt"]
    assert served["token_ids"] == ["server"]


@pytest.mark.parametrize(
    ("fmt", "key", "ids", "engine", "fault", "says"),
    [
        pytest.param(
            "vllm", "eagle_aux_hidden_state_layer_ids", [3, 5, 6], "vllm", "served.aux.shifted",
            ("aux states shifted by +1", "boundaries [3, 5, 6] for the trained [2, 4, 5]",
             "vLLM 0.33.0 reads [3, 5, 6] as boundaries [3, 5, 6]", "eagle_aux_hidden_state_layer_ids in {export}/config.json "
             "to [2, 4, 5]"),
            id="shifted",
        ),
        pytest.param(
            "vllm", "eagle_aux_hidden_state_layer_ids", [1, 3, 4], "eaglewire", "served.aux.shifted",
            ("aux states shifted by -1: the engine feeds boundaries [1, 3, 4] for the trained [2, 4, 5] (ids written "
             "as layer outputs (SGLang/SpecForge numbering) read by vLLM as boundaries)",
             "eagle_aux_hidden_state_layer_ids in {export}/config.json to [2, 4, 5]"),
            id="sglang-ids-in-a-vllm-config",
        ),
        pytest.param(
            "vllm", "eagle_aux_hidden_state_layer_ids", [0, 4, 5], "eaglewire", "served.aux.embedding_first",
            ("the embedding output (boundary 0) in place of the first aux state",
             "the first state must be boundary 2 (output of layer 1)"),
            id="embedding",
        ),
    ],
)  # fmt: skip
def test_an_edited_export_is_named(
    world: ServedWorld, fmt: str, key: str, ids: list[int], engine: str, fault: str, says: tuple[str, ...]
) -> None:
    """(b) An export whose layer ids were edited by hand, served as its engine reads them: exit 1 naming the fault
    class, the config key and the value to write; the match is exact (every prompt's verifications)."""
    directory = edited(world, fmt, key, ids)
    with serving(world, directory, engine=fmt) as url:
        r = doctor(url, world, engine=engine)
    assert r.exit_code == 1, r.output
    text = " ".join(r.output.split())
    assert f"[error] {fault}:" in text
    assert "every prompt's verifications equal: exact" in text
    for s in says:
        assert s.format(export=directory) in text, s


def test_a_rewritten_draft_length_is_named(world: ServedWorld) -> None:
    """(b) A server flag: launched asking for 4 tokens per verification with topk 1 and num_steps 1, which SGLang
    silently runs as a chain of 1 (served here by a server running just that); the doctor, told the flags,
    predicts the chain of 3 they asked for and names the rewrite from the acceptance."""
    flags = "--speculative-algorithm EAGLE3 --speculative-num-steps 1 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4"
    with serving(world, world.draft_dir, spec=SpecArgs.chain(1)) as url:
        r = doctor(url, world, "--sglang-args", flags)
    assert r.exit_code == 1, r.output
    text = " ".join(r.output.split())
    assert "[error] served.spec.draft_length:" in text
    assert (
        "silently runs --speculative-num-draft-tokens 2 (1 draft token(s) per verification), not the requested 4"
        in text
    )
    assert (
        "fix: --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4" in text
    )


def test_a_server_without_the_fields_is_an_input_error(world: ServedWorld) -> None:
    """A server decoding plainly reports no speculative fields: an input error (exit 2) naming the field."""
    with serving(world, None) as url:
        r = doctor(url, world)
    assert isinstance(r.exception, ServerError), r.output
    assert "no sglext.spec_tokens_details" in str(r.exception)


# --- the rest of the candidate logic in-process: the real engine decodes, no HTTP (fast) ---


def engine_texts(
    world: ServedWorld, draft: Any, spec: SpecArgs = SPEC, prompts: int | None = None
) -> list[ServedText]:
    """The first `prompts` prompts (None: all) decoded by the real engine with `draft` (as a server would serve
    them), with its counts."""
    from eaglewire.engine.api import SpeculativeDecoder
    from eaglewire.engine.runners.factory import make_runner

    runner = make_runner(world.target, world.contract.aux_boundaries)
    decoder = SpeculativeDecoder(runner, draft, spec, eos_token_ids=world.target.eos_token_ids)
    texts = []
    for i, prompt in enumerate(world.prompt_ids[:prompts]):
        result = decoder.generate(prompt, max_new_tokens=ANSWER_TOKENS)
        acc = result.accepted_per_round
        per_pos = [sum(a >= j for a in acc) for j in range(1, spec.num_steps + 1)]
        counts = RoundCounts(len(acc), sum(acc), len(acc) * (spec.num_draft_tokens - 1), per_pos)
        texts.append(ServedText(f"p{i}", list(prompt), list(result.token_ids), "server", counts))
    return texts


def compare(world: ServedWorld, texts: list[ServedText], replay: ReplayWorld | None = None) -> ServedCheck:
    setup = ServedSetup(
        world.contract.aux_boundaries, world.target.num_layers, "vllm", d2t_file="e/model.safetensors"
    )
    return compare_served(
        ServedCheck(name=CHECK), texts, target=world.target, draft=world.draft, trained=world.contract.aux_boundaries,
        trained_from="test", spec=SPEC, setup=setup, engine="eaglewire", prefill_token=False, world=replay,
    )  # fmt: skip


@pytest.fixture(scope="module")
def correct_texts(world: ServedWorld) -> list[ServedText]:
    return engine_texts(world, world.draft)


def test_d2t_read_as_absolute_ids(world: ServedWorld) -> None:
    """An engine that indexes the target vocabulary with d2t's offsets: nothing it drafts is accepted. Both vocab
    misreadings predict exactly that; the finding names one, lists the other, and says what else looks alike."""
    draft = copy.deepcopy(world.draft)
    absolute = draft.get_buffer("draft_to_target")
    absolute.copy_(absolute - torch.arange(absolute.shape[0]))  # the offsets, used as ids
    result = compare(
        world, engine_texts(world, draft, prompts=2)
    )  # two prompts: garbage replays are the slowest
    (finding,) = result.findings
    assert finding.check == "served.vocab.d2t_as_absolute", finding
    assert "d2t in e/model.safetensors holds offsets" in finding.fix
    details = " ".join(finding.details)
    assert "d2t holds absolute target ids" in details and "no drafted token is ever accepted" in details


def test_served_above_the_prediction(world: ServedWorld, correct_texts: list[ServedText]) -> None:
    """More accepted than this draft can reach on this text: the server serves another draft (or target)."""
    best = [
        replace(t, counts=RoundCounts(-(-len(t.output_ids) // SPEC.num_draft_tokens), 0, 0, None))
        for t in correct_texts
    ]  # every round accepting every draft
    (finding,) = compare(world, best).findings
    assert finding.check == "served.above_prediction"
    assert "pass the draft and target the server was launched with" in finding.fix


def test_short_and_no_candidate_explains_it(world: ServedWorld, correct_texts: list[ServedText]) -> None:
    """Served short of the prediction at a tau that no candidate replays to: "short, no candidate explains it"."""
    setup = ServedSetup(world.contract.aux_boundaries, world.target.num_layers, "vllm")
    wirings = [c.wiring for c in all_candidates(setup, identity_map=True) if c.wiring is not None]
    declared = Wiring.of(world.contract.aux_boundaries)
    replay = ReplayWorld(
        world.target, world.draft, correct_texts, False, [declared, *wirings]
    )  # replays reused
    served = compare(world, correct_texts, replay).served
    assert served["verdict"] == "match" and served["exact"]
    # where the candidates land on this text, from a deployment served short (one verification per 2 tokens)
    halved = [replace(t, counts=RoundCounts(-(-len(t.output_ids) // 2), 0, 0, None)) for t in correct_texts]
    candidates = compare(world, halved, replay).served["candidates"]
    taus = sorted(c["predicted_tau"] for c in candidates if "predicted_tau" in c)
    gaps = [(b - a, (a + b) / 2) for a, b in zip(taus, taus[1:], strict=False) if b - a > 3 * tolerance(b)]
    assert gaps, taus
    _, middle = max(gaps)
    emitted = sum(len(t.output_ids) for t in correct_texts)
    rounds = round(emitted / middle)
    share = [rounds * len(t.output_ids) // emitted for t in correct_texts]
    share[0] += rounds - sum(share)
    unexplained = [
        replace(t, counts=RoundCounts(n, 0, 0, None)) for t, n in zip(correct_texts, share, strict=True)
    ]
    result = compare(world, unexplained, replay)
    (finding,) = result.findings
    assert finding.check == "served.short_unexplained", finding
    assert result.served["verdict"] == "short, unexplained"
    assert "no candidate miswiring explains it" in finding.what


def test_post_norm_candidate_reads_the_final_norms_output(
    world: ServedWorld, correct_texts: list[ServedText]
) -> None:
    """The post-norm candidate feeds Hugging Face's hidden_states[L] (after the final norm) where boundary L was."""
    L = world.target.num_layers
    wiring = Wiring((AuxSource(2), AuxSource(L), AuxSource(L, "post")))
    replay = ReplayWorld(world.target, world.draft, correct_texts[:1], False, [wiring])
    aux = replay._aux(0, wiring)  # [T, 3*Ht]
    prompt, generated = correct_texts[0].replay_split(False)
    with torch.no_grad():
        hf = world.target.model(
            torch.tensor([[*prompt, *generated]]), output_hidden_states=True
        ).hidden_states
    Ht = world.target.hidden_size
    torch.testing.assert_close(aux[:, :Ht], hf[2][0])
    torch.testing.assert_close(aux[:, 2 * Ht :], hf[L][0])  # post-norm: what HF calls the last hidden state
    assert not torch.allclose(aux[:, Ht : 2 * Ht], aux[:, 2 * Ht :])  # pre-norm boundary L differs
