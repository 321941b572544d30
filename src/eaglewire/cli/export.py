"""`eaglewire export` and `eaglewire import`: engine formats both ways, with launch commands."""

from __future__ import annotations

from pathlib import Path

import typer

from eaglewire.cli.common import console, print_table
from eaglewire.output_marker import OutputKind
from eaglewire.outputs import check_output_dir

# --format -> what the export directory holds (eaglewire.export.exporting.EXPORT_KINDS; not imported here: torch)
EXPORT_KINDS = {"sglang": OutputKind.EXPORT_SGLANG, "vllm": OutputKind.EXPORT_VLLM}


def export_cmd(
    draft: Path = typer.Option(
        ..., "--draft", help="eaglewire draft directory (config.json + model.safetensors + contract.json)"
    ),
    fmt: str = typer.Option(..., "--format", help="sglang | vllm (speculators layout)"),
    out: Path = typer.Option(..., "--out", help="directory to write the export to"),
    sglang_version: str = typer.Option(
        None,
        "--sglang-version",
        help="the SGLang release you serve with, e.g. 0.5.23 (see `eaglewire ids --arch`); default: ids every "
        "release eaglewire has read reads alike for the target's architecture, else refused",
    ),
    vllm_version: str = typer.Option(
        None,
        "--vllm-version",
        help="the vLLM release you serve with, e.g. 0.33.0; default: every release eaglewire has read",
    ),
    verifier: str = typer.Option(
        None,
        "--verifier",
        help="--format vllm: the target as speculators_config.verifier names it, a directory (written absolute) or "
        "a model hub id (default: --target-path or the contract's target, absolute)",
    ),
    best_setting: Path = typer.Option(
        None,
        "--best-setting",
        help="best_setting.json from the benchmark (default: the one in --draft, if any)",
    ),
    num_steps: int = typer.Option(
        None, "--num-steps", help="SGLang --speculative-num-steps (overrides any best setting)"
    ),
    topk: int = typer.Option(
        None, "--topk", help="SGLang --speculative-eagle-topk (default 1 with --num-steps)"
    ),
    num_draft_tokens: int = typer.Option(
        None, "--num-draft-tokens", help="SGLang --speculative-num-draft-tokens (topk=1: num_steps + 1)"
    ),
    target_path: str = typer.Option(
        None,
        "--target-path",
        help="the target for the launch command (and vLLM's verifier), written as an absolute path (default: the "
        "contract's)",
    ),
    dtype: str = typer.Option(
        None, "--dtype", help="float32 | bfloat16 | float16 (default: the contract's dtype)"
    ),
    force: bool = typer.Option(
        False,
        "--force",
        help="replace an earlier export of the same --format in --out, as a whole (never another kind of directory)",
    ),
) -> None:
    """Write a draft SGLang or vLLM loads as is, and the command that serves it."""
    if fmt in EXPORT_KINDS:  # first: a refusal costs nothing (export_draft checks --format and again --out)
        check_output_dir(out, EXPORT_KINDS[fmt], force=force)

    from eaglewire.export.exporting import export_draft

    result = export_draft(
        draft,
        fmt,  # type: ignore[arg-type]  # checked by export_draft
        out,
        sglang_version=sglang_version,
        vllm_version=vllm_version,
        verifier=verifier,
        best_setting=best_setting,
        num_steps=num_steps,
        topk=topk,
        num_draft_tokens=num_draft_tokens,
        target_path=target_path,
        dtype=dtype,
        force=force,
    )
    s = result.spec
    print_table(
        f"{fmt} export written to {result.out}",
        ["field", "value"],
        [
            ["aux boundaries", list(result.boundaries)],
            ["layer ids in config.json", f"{list(result.layer_ids)}: {result.numbering}"],
            *[["read as", r] for r in result.readings],
            ["target", result.verifier],
            ["speculative", f"num_steps={s.num_steps} topk={s.topk} num_draft_tokens={s.num_draft_tokens}"],
            ["from", result.spec_source],
            ["launch script", result.launch_file],
        ],
    )
    console.print(result.launch_command, markup=False, highlight=False, soft_wrap=True)


def import_cmd(
    fmt: str = typer.Option(..., "--format", help="sglang | vllm | eagle (EAGLE official, safetensors)"),
    src: Path = typer.Option(..., "--src", help="the engine-format draft directory"),
    target: str = typer.Option(..., "--target", help="HF model directory, .gguf file, or 'smollm2'"),
    out: Path = typer.Option(..., "--out", help="directory to write the eaglewire draft to"),
    numbering: str = typer.Option(
        None,
        "--numbering",
        help="the rule the layer ids follow (boundary, vllm, speculators, layer-output, pr25454, specforge, "
        "modelopt, eagle); default: from the format, or for SGLang from --sglang-version and the target",
    ),
    sglang_version: str = typer.Option(
        None,
        "--sglang-version",
        help="--format sglang: the SGLang release the draft was served with (its id rule depends on release and "
        "target architecture); default: inferred when every release eaglewire has read agrees",
    ),
    dtype: str = typer.Option(
        "float32", "--dtype", help="dtype to run the target in for the contract's fingerprint"
    ),
    trust_remote_code: bool = typer.Option(False, "--trust-remote-code"),
    force: bool = typer.Option(
        False,
        "--force",
        help="replace an earlier eaglewire draft in --out, as a whole (never another kind of directory)",
    ),
) -> None:
    """Read an SGLang / vLLM / EAGLE draft into an eaglewire draft with a contract built on the live target."""
    check_output_dir(out, OutputKind.DRAFT, force=force)  # first: a refusal costs nothing

    from eaglewire.export.importing import import_draft
    from eaglewire.target.loading import load_target

    loaded = load_target(target, dtype=dtype, trust_remote_code=trust_remote_code)
    result = import_draft(
        fmt,  # type: ignore[arg-type]  # checked inside
        src,
        loaded,
        out,
        numbering=numbering,
        sglang_version=sglang_version,
        force=force,
    )
    ids = "engine defaults" if result.layer_ids is None else list(result.layer_ids)
    print_table(
        f"{fmt} draft imported to {result.out}",
        ["field", "value"],
        [
            ["layer ids in the source", ids],
            ["numbering", f"{result.numbering} (from {result.numbering_from})"],
            ["aux boundaries", ", ".join(result.contract.describe()[: result.contract.num_aux])],
            *[["note", n] for n in result.notes],
        ],
    )


def register(app: typer.Typer) -> None:
    app.command("export")(export_cmd)
    app.command("import")(import_cmd)
