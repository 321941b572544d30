"""The batched speculative engine (`BatchEngine`) is lossless row by row: every request's greedy
tokens equal the prompt decoded alone (plain greedy from the HF model), chain and tree, trained and
untrained drafts, at B = 1, 2, 5 with rows of different lengths, rows that end early (eos, stop
string) and rows refilled mid-flight; switching settings (plain rounds, shorter trees) mid-request
changes nothing; a sampled row gives what `SpeculativeDecoder.generate` gives it alone (same seed)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

from eaglewire.engine.api import SpeculativeDecoder
from eaglewire.engine.batch.drafter import BatchDrafter
from eaglewire.engine.batch.engine import BatchEngine, BatchOutcome, BatchRequest, setting_label
from eaglewire.engine.runners.factory import make_runner
from eaglewire.engine.runners.fast.runner import FastTargetRunner
from eaglewire.engine.sampling import SamplingParams
from eaglewire.engine.spec_args import SpecArgs
from eaglewire.engine.verify import StopRule
from eaglewire.errors import ConfigError
from tests.unit.engine.conftest import plain_greedy

SPECS = {"chain": SpecArgs.chain(4), "tree": SpecArgs(num_steps=4, topk=3, num_draft_tokens=8)}
# settings a policy switches to mid-request: shorter than the drafter's own (they fit its cache)
SHORTER = {"chain": SpecArgs.chain(2), "tree": SpecArgs(num_steps=2, topk=2, num_draft_tokens=4)}
MAX_ROWS = 5
MAX_SEQ_LEN = 256
EOS = 353  # occurs once in references[1] (index 7): that row ends after 8 tokens
STOP_STRING = "tsh"  # first appears in the text of references[1] around token 10


def _decode(tiny):
    return lambda ids: str(tiny.target.tokenizer.decode(ids, skip_special_tokens=True))


@dataclass
class Case:
    """A request and the tokens it must produce (its reference as the stop rule cuts it)."""

    request: BatchRequest
    expected: list[int]
    finish: str


@pytest.fixture(scope="module")
def cases(tiny) -> list[Case]:
    """7 requests (more than the rows of every B tested): every prompt, a row per stop kind
    (max_new_tokens, eos, stop string), lengths 1..40."""
    decode = _decode(tiny)
    rules = [
        (0, StopRule(40)),
        (1, StopRule(40, eos_token_ids=frozenset({EOS}))),
        (2, StopRule(12)),
        (3, StopRule(40)),  # the one-token prompt
        (1, StopRule(40, stop_strings=(STOP_STRING,), decode=decode)),
        (0, StopRule(1)),
        (3, StopRule(25)),
    ]
    out = []
    for prompt, rule in rules:
        expected, finish = rule.cut([], tiny.references[prompt])
        assert finish is not None, "the references are long enough for every rule"
        out.append(Case(BatchRequest(list(tiny.prompts[prompt]), rule), expected, finish))
    assert [c.finish for c in out] == [
        "max_new_tokens",
        "eos",
        "max_new_tokens",
        "max_new_tokens",
        "stop_string",
        "max_new_tokens",
        "max_new_tokens",
    ]
    assert len(out[1].expected) == 8 and len(out[4].expected) < 40
    return out


@pytest.fixture(scope="module")
def runner(tiny) -> FastTargetRunner:
    """One CPU runner for the module (every engine resets it)."""
    return FastTargetRunner(
        tiny.target, tiny.contract.aux_boundaries, max_batch_size=MAX_ROWS, max_seq_len=MAX_SEQ_LEN
    )


@pytest.fixture(scope="module")
def drafters(tiny, trained):
    """BatchDrafter by (draft, shape), built once (every engine resets its rows)."""
    made: dict[tuple[str, str], BatchDrafter] = {}

    def get(which: str, shape: str) -> BatchDrafter:
        if (which, shape) not in made:
            draft = tiny.untrained if which == "untrained" else trained
            made[which, shape] = BatchDrafter(draft, SPECS[shape], max_rows=MAX_ROWS, max_seq_len=MAX_SEQ_LEN)
        return made[which, shape]

    return get


@dataclass
class Drive:
    """What stepping an engine to the end saw."""

    outcomes: dict[int, BatchOutcome] = field(default_factory=dict)  # by request index
    finish_order: list[int] = field(default_factory=list)
    buckets: list[int] = field(default_factory=list)  # the bucket each round ran at
    running: list[int] = field(default_factory=list)  # running rows after each step's admission


def drive(engine: BatchEngine, requests: list[BatchRequest]) -> Drive:
    for request in requests:
        engine.submit(request)
    index = {id(r): i for i, r in enumerate(requests)}
    seen = Drive()
    while not engine.idle:
        finished = engine.step()
        seen.buckets.append(engine.bucket)
        seen.running.append(engine.running + len(finished))
        for outcome in finished:
            i = index[id(outcome.request)]
            seen.outcomes[i] = outcome
            seen.finish_order.append(i)
        assert engine.bucket <= engine.max_rows
    assert sorted(seen.outcomes) == list(range(len(requests)))
    return seen


def assert_lossless(seen: Drive, cases: list[Case], where: str) -> None:
    for i, case in enumerate(cases):
        trace = seen.outcomes[i].trace
        assert trace.token_ids == case.expected, f"{where}: request {i}"
        assert trace.finish_reason == case.finish, f"{where}: request {i}"


@pytest.mark.parametrize("B", [1, 2, 5])
@pytest.mark.parametrize("shape", sorted(SPECS))
@pytest.mark.parametrize("which", ["untrained", "trained"])
def test_greedy_rows_equal_plain_greedy(tiny, runner, drafters, cases, which, shape, B, monkeypatch):
    moves: list[tuple[int, int]] = []
    move_row = runner.move_row
    monkeypatch.setattr(runner, "move_row", lambda src, dst: (moves.append((src, dst)), move_row(src, dst)))
    engine = BatchEngine(runner, drafters(which, shape), max_rows=B)
    seen = drive(engine, [c.request for c in cases])
    assert_lossless(seen, cases, f"{which}/{shape}/B={B}")
    assert engine.step() == [] and engine.bucket == 1  # an idle step shrinks the bucket to 1
    # the bucket held every running row and never more than B; it grew to B while requests waited
    assert max(seen.buckets) == B and all(r <= b for r, b in zip(seen.running, seen.buckets, strict=True))
    assert max(seen.running) == B
    # refills: requests were admitted after earlier ones ended while other rows went on decoding
    out = seen.outcomes
    refilled = [  # started after some request ended, while another that started earlier still ran
        i
        for i in out
        if any(out[j].finished_at < out[i].started_at for j in out)
        and any(out[k].started_at < out[i].started_at < out[k].finished_at for k in out)
    ]
    assert bool(refilled) == (B > 1), f"B={B}: refilled {refilled}, finish order {seen.finish_order}"
    if B == 2:
        # rows 0 and 1 start; the eos row (1, 8 tokens) ends first and request 2 takes its row
        # while request 0 (40 tokens) is still decoding
        assert seen.finish_order[0] == 1
        assert out[1].finished_at < out[2].started_at < out[0].finished_at
    if B == 5:  # 7 requests on 5 rows: the bucket shrank through 4 and 2 as rows ended,
        # moving running rows down into free ones
        assert {5, 4, 2} <= set(seen.buckets), seen.buckets
        assert moves and all(dst < src for src, dst in moves), moves
    if which == "trained":
        # drafted tokens were accepted, and some rows stopped inside an accepted block (the rule
        # cut a round's tokens short)
        traces = [o.trace for o in out.values()]
        chat = [out[0].trace, out[2].trace]  # the draft was trained on the chat prompts' answers
        assert sum(len(t.token_ids) for t in chat) / sum(t.num_verifications for t in chat) > 1.5
        assert any(sum(t.emitted_per_round) > len(t.token_ids) for t in traces)


@pytest.mark.parametrize("shape", sorted(SPECS))
def test_switching_settings_mid_request_is_lossless(tiny, runner, drafters, cases, shape):
    """Plain rounds at some batch sizes, a shorter setting at others, the full one at the rest;
    and a policy that changes the setting every round: the tokens stay the same."""
    full, short = SPECS[shape], SHORTER[shape]
    by_count = {5: None, 4: None, 3: short, 2: full, 1: short}
    engine = BatchEngine(runner, drafters("trained", shape), max_rows=MAX_ROWS, policy=by_count.__getitem__)
    assert_lossless(drive(engine, [c.request for c in cases]), cases, f"{shape}/by count")
    labels = {label for _, label in engine.stats.seconds}
    assert labels == {"plain", setting_label(short), setting_label(full)}, labels

    rounds = iter(range(10_000))
    cycle = [None, short, full, full, None, short]
    engine = BatchEngine(
        runner, drafters("trained", shape), max_rows=2, policy=lambda _n: cycle[next(rounds) % len(cycle)]
    )
    assert_lossless(drive(engine, [c.request for c in cases]), cases, f"{shape}/every round")
    assert {label for _, label in engine.stats.seconds} == {
        "plain",
        setting_label(short),
        setting_label(full),
    }


@pytest.mark.parametrize("shape", sorted(SPECS))
def test_requests_arriving_mid_flight_grow_the_bucket(runner, drafters, cases, shape):
    """Serving: requests come while others decode; the bucket grows around the running rows."""
    engine = BatchEngine(runner, drafters("trained", shape), max_rows=MAX_ROWS)
    requests = [c.request for c in cases]
    index = {id(r): i for i, r in enumerate(requests)}
    arrivals = {0: [0], 3: [1, 2], 5: [3, 4, 5, 6]}  # step -> requests submitted before it
    seen = Drive()
    step = 0
    while step <= max(arrivals) or not engine.idle:
        for i in arrivals.get(step, []):
            engine.submit(requests[i])
        for outcome in engine.step():
            seen.outcomes[index[id(outcome.request)]] = outcome
        seen.buckets.append(engine.bucket)
        step += 1
    assert_lossless(seen, cases, f"{shape}/staggered")
    assert seen.buckets[:3] == [1, 1, 1] and seen.buckets[3] == 4 and max(seen.buckets) == 5, seen.buckets


def test_plain_engine_without_a_drafter_is_plain_greedy(runner, cases):
    engine = BatchEngine(runner, None, max_rows=2)
    assert_lossless(drive(engine, [c.request for c in cases]), cases, "no drafter")
    assert {label for _, label in engine.stats.seconds} == {"plain"}


def test_cancel_through_on_round_frees_the_row(tiny, runner, drafters):
    calls = []

    def cancel_on_third(kept: list[int]) -> bool:
        calls.append(kept)
        return len(calls) < 3

    prompts, refs = tiny.prompts, tiny.references
    requests = [
        BatchRequest(list(prompts[0]), StopRule(40), on_round=cancel_on_third),
        BatchRequest(list(prompts[2]), StopRule(40)),
        BatchRequest(list(prompts[1]), StopRule(30)),
    ]
    engine = BatchEngine(runner, drafters("trained", "tree"), max_rows=2)
    for request in requests:
        engine.submit(request)
    done: dict[int, BatchOutcome] = {}
    while 0 not in done:
        for outcome in engine.step():
            done[[id(r) for r in requests].index(id(outcome.request))] = outcome
    assert len(calls) == 3 and 1 not in done
    cancelled = done[0].trace
    assert cancelled.finish_reason == "cancelled"
    n = sum(len(kept) for kept in calls)
    assert cancelled.token_ids == refs[0][:n] and n < 40  # what it kept through the cancelling round
    assert (engine.running, engine.waiting) == (1, 1)  # its row is free at once
    ended = engine.step()  # the next step admits the waiting request into the freed row
    assert engine.waiting == 0 and engine.running + len(ended) == 2
    for outcome in ended:
        done[[id(r) for r in requests].index(id(outcome.request))] = outcome
    while not engine.idle:
        for outcome in engine.step():
            done[[id(r) for r in requests].index(id(outcome.request))] = outcome
    assert done[1].trace.token_ids == refs[2] and done[2].trace.token_ids == refs[1][:30]
    assert done[2].started_at > done[0].finished_at


def test_submit_checks_the_request_fits(tiny, drafters):
    small = FastTargetRunner(tiny.target, tiny.contract.aux_boundaries, max_batch_size=2, max_seq_len=96)
    drafter = BatchDrafter(drafters("trained", "tree").draft, SPECS["tree"], max_rows=2, max_seq_len=96)
    engine = BatchEngine(small, drafter, max_rows=2)
    prompt = tiny.prompts[0]
    room = 96 - len(prompt) - SPECS["tree"].num_draft_tokens  # prompt + tokens + one tree
    with pytest.raises(ConfigError, match="max_seq_len=96"):
        engine.submit(BatchRequest(list(prompt), StopRule(room + 1)))
    with pytest.raises(ConfigError, match="empty"):
        engine.submit(BatchRequest([], StopRule(4)))
    assert engine.waiting == 0  # refused requests are not queued
    # exactly full: accepted and decoded to the last slot, beside a second row
    traces = engine.run([BatchRequest(list(prompt), StopRule(room)), BatchRequest([17], StopRule(room))])
    assert traces[0].token_ids == plain_greedy(tiny.target.model, prompt, room)
    assert traces[1].token_ids == plain_greedy(tiny.target.model, [17], room)
    with pytest.raises(ConfigError, match="runner holds 2 rows"):
        BatchEngine(small, drafter, max_rows=3)
    with pytest.raises(ConfigError, match="max_rows"):
        BatchEngine(small, drafter, max_rows=0)


SAMPLED_PROMPTS = [0, 3, 1, 2]  # the one-token prompt second: it is admitted in the first batch
SEEDS = [11, 12, 13, 14]
SAMPLED_TOKENS = [30, 24, 30, 18]


@pytest.mark.parametrize("shape", sorted(SPECS))
def test_sampled_rows_equal_their_alone_output(tiny, trained, shape):
    runner = make_runner(
        tiny.target, tiny.contract.aux_boundaries, "fast", max_batch_size=3, max_seq_len=MAX_SEQ_LEN
    )
    dec = SpeculativeDecoder(runner, trained, SPECS[shape], tokenizer=tiny.target.tokenizer)
    sampling = [SamplingParams(temperature=0.8, seed=s) for s in SEEDS]
    sampling[2] = SamplingParams(temperature=0.8, top_p=0.9, seed=SEEDS[2])
    prompts = [tiny.prompts[i] for i in SAMPLED_PROMPTS]
    alone = [
        dec.generate(p, max_new_tokens=n, sampling=s).token_ids
        for p, n, s in zip(prompts, SAMPLED_TOKENS, sampling, strict=True)
    ]
    # it really sampled: no row is its greedy reference
    assert all(a != tiny.references[i][: len(a)] for a, i in zip(alone, SAMPLED_PROMPTS, strict=True))
    engine = dec.batch_engine(3)
    requests = [
        dec.batch_request(p, max_new_tokens=n, sampling=s)
        for p, n, s in zip(prompts, SAMPLED_TOKENS, sampling, strict=True)
    ]
    seen = drive(engine, requests)
    assert max(seen.buckets) == 3
    assert seen.outcomes[3].started_at > min(o.finished_at for o in seen.outcomes.values())  # refilled
    for i, tokens in enumerate(alone):
        assert seen.outcomes[i].trace.token_ids == tokens, f"{shape}: request {i} (seed {SEEDS[i]})"
    # greedy rows beside sampled ones: each still decodes as it does alone
    greedy = [dec.batch_request(tiny.prompts[i], max_new_tokens=40) for i in (2, 3)]
    mixed = [requests[0], greedy[0], requests[1], requests[2], greedy[1], requests[3]]
    seen = drive(dec.batch_engine(3), mixed)
    got = [seen.outcomes[i].trace.token_ids for i in range(len(mixed))]
    assert [got[0], got[2], got[3], got[5]] == alone
    assert [got[1], got[4]] == [tiny.references[2], tiny.references[3]]


def test_generate_batch_equals_generate(tiny, trained):
    runner = make_runner(
        tiny.target, tiny.contract.aux_boundaries, "fast", max_batch_size=2, max_seq_len=MAX_SEQ_LEN
    )
    dec = SpeculativeDecoder(runner, trained, SPECS["tree"], tokenizer=tiny.target.tokenizer)
    results = dec.generate_batch(
        tiny.prompts, max_batch=2, max_new_tokens=20, policy=lambda n: None if n > 1 else SPECS["tree"]
    )
    assert [r.token_ids for r in results] == [ref[:20] for ref in tiny.references]
    assert all(r.finish_reason == "max_new_tokens" for r in results)
    with pytest.raises(ConfigError, match="runner holds 2 rows"):
        dec.generate_batch(tiny.prompts, max_batch=3, max_new_tokens=4)


def test_runner_rows_have_the_right_state_after_a_run(runner, drafters, cases):
    """After a run every row is empty again (a new engine on the same runner starts clean)."""
    engine = BatchEngine(runner, drafters("untrained", "chain"), max_rows=MAX_ROWS)
    drive(engine, [c.request for c in cases[:3]])
    assert runner.batch_size == 1 and runner.lengths.tolist() == [0]
    assert torch.equal(engine.drafter.committed, torch.zeros(MAX_ROWS, dtype=torch.long))  # type: ignore[union-attr]
