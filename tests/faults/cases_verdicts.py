"""Verdicts of `ids`, `generate --check-lossless`, `bench`, `eval`, `export` and `import`, both ways.

The failing lossless and bench cases run with an engine bug injected (tests/faults/inject): a
verification that accepts the first draft token unverified. They are what those checks exist for.
"""

from __future__ import annotations

from pathlib import Path

from tests.faults.harness import Case

TARGET, DRAFT = "{ws}/target", "{ws}/qs/train/draft"
GENERATE = f"generate --target {TARGET} --draft {DRAFT} --prompts-file {{ws}}/prompts.txt --max-new-tokens 16 --device cpu"
BENCH = (
    f"bench --target {TARGET} --draft {DRAFT} --prompts {{ws}}/prompts.jsonl --methods plain,eagle-chain "
    "--max-new-tokens 16 --warmup 0 --repeats 1 --dtype float32 --device cpu --no-plots --no-served-prediction "
    "--out {ws}/bench"
)


def build(base: Path) -> None:
    (base / "prompts.jsonl").write_text(
        '{"prompt": "Hello! How are you today?"}\n{"prompt": "def add(a, b):"}\n', encoding="utf-8"
    )


CASES = [
    Case("ids:valid", "ids --num-layers 7 --from vllm 2,3,4", 0, says=("output of layer 1",)),
    Case(
        "ids:past-the-last-layer",
        "ids --num-layers 7 --from sglang --arch LlamaForCausalLM 9,10,11",
        2,
        says=("name no boundary of a 7-layer target (0..7)",),
    ),
    Case(
        "generate:lossless",
        f"{GENERATE} --check-lossless",
        0,
        says=("lossless: speculative == plain greedy",),
    ),
    Case(
        "generate:not-lossless",
        f"{GENERATE} --check-lossless",
        1,
        says=("NOT LOSSLESS: prompt", "differs at generated token"),
        inject="accept-first-draft",
    ),
    Case("bench:greedy-identical", BENCH, 0, says=("wrote {ws}/bench/bench.json",)),
    Case(
        "bench:greedy-differs",
        BENCH,
        1,
        says=("NOT LOSSLESS: speculative greedy output differs from plain greedy: eagle-chain",),
        inject="accept-first-draft",
    ),
    Case(
        "bench:report-into-a-model-directory",
        BENCH.replace("--out {ws}/bench", "--out {ws}/target"),
        2,
        says=("--out {ws}/target: not empty and not an eaglewire output",),
    ),
    Case(
        "eval:clean",
        f"eval --draft {DRAFT} --target {TARGET} --data {{ws}}/qs/data/eval --num-steps 2 --device cpu",
        0,
    ),
    Case(
        "eval:another-target",
        f"eval --draft {DRAFT} --target {{ws}}/target5 --data {{ws}}/qs/data/eval --num-steps 2 --device cpu",
        2,
        says=("num_layers",),
    ),
    Case(
        "export:vllm",
        f"export --draft {DRAFT} --format vllm --out {{ws}}/exported",
        0,
        says=("layer ids in config.json",),
    ),
    Case(
        "import:vllm",
        f"import --format vllm --src {{ws}}/qs/export/vllm --target {TARGET} --out {{ws}}/imported",
        0,
    ),
    Case(
        "import:wrong-format",
        f"import --format sglang --src {{ws}}/qs/export/vllm --target {TARGET} --out {{ws}}/imported",
        2,
        says=("{ws}/qs/export/vllm",),
    ),
]
