"""What the server serves: the target, the draft (eaglewire or an engine export, or none), the
speculative decoder over them, and the request-side tokenization and length checks.

An SGLang or vLLM export directory is read the way the named engine (and version) would read it
(`eaglewire.export.importing`), and served with exactly the aux states that reading picks: an export
whose config.json names the wrong layers is served wrong, as that engine would serve it, so that
its acceptance shows the fault (`eaglewire doctor --served`). Nothing is "fixed" on the way in, and
nothing is written anywhere: the export is turned into a draft in memory.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from eaglewire.engine.fits import ContextFit
from eaglewire.errors import BoundaryError, CheckpointError, ConfigError
from eaglewire.serve.protocol import GenerationRequest, RequestError

if TYPE_CHECKING:
    from eaglewire.engine.api import SpeculativeDecoder
    from eaglewire.engine.runners.factory import RunnerKind
    from eaglewire.engine.spec_args import SpecArgs

log = logging.getLogger(__name__)

Engine = Literal["auto", "eaglewire", "sglang", "vllm"]
ENGINES = ("auto", "eaglewire", "sglang", "vllm")
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's (and vLLM's, SGLang's) default for /v1/completions


@dataclass(frozen=True)
class DraftInfo:
    """What the logs and /v1/models say about the draft."""

    path: str | None  # None: plain decoding
    format: str  # "eaglewire" | "sglang" | "vllm" | "none"
    aux_boundaries: tuple[int, ...]
    reading: str  # how the aux states were chosen, e.g. "contract.json" or an engine's reading of its ids


@dataclass(frozen=True)
class LoadOptions:
    target: str
    draft: Path | None
    engine: Engine
    sglang_version: str | None
    vllm_version: str | None
    spec: SpecArgs
    dtype: str
    device: str
    runner: RunnerKind
    context_length: int | None  # None: min(the target's max_position_embeddings, 4096)
    max_batch: int = 1  # requests decoded together (`serve --max-batch`; > 1: `serve.batch_worker`)


class ServedModel:
    """The decoder and everything a request needs before it is queued (thread-safe to read)."""

    def __init__(
        self,
        decoder: SpeculativeDecoder,
        name: str,
        draft: DraftInfo,
        context_length: int,
        *,
        max_batch: int = 1,
        target: str = "",
    ) -> None:
        """max_batch: requests decoded together (the runner holds that many rows); target: as given."""
        self.decoder = decoder
        self.name = name
        self.draft = draft
        self.context_length = context_length
        self.max_batch = max_batch
        self.target = target
        self.vocab_size = int(decoder.runner.vocab_size)
        tok = decoder.tokenizer
        if tok is None:
            raise ConfigError(
                "the target has no tokenizer: a server takes text", fix="serve a target with one"
            )
        self.tokenizer = tok
        # the decoder's own rule (`engine.fits`), bounded by this server's context
        fit = decoder.context_fit()
        self.fit = ContextFit.of(
            positions=fit.positions, capacity=context_length, tree_tokens=fit.tree_tokens
        )

    @property
    def speculative(self) -> bool:
        return self.decoder.drafter is not None

    @property
    def reserved(self) -> int:
        """Positions a generation keeps free beyond its tokens: one draft tree (`engine.fits`; 0 plain)."""
        return self.fit.tree_tokens

    def decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))

    def encode(self, request: GenerationRequest) -> list[int]:
        """The prompt's token ids: chat turns through the target's chat template, or completions text /
        ids as given (the same as `SpeculativeDecoder.encode`). RequestError when they cannot be made."""
        if request.messages is not None:
            ids = self._chat_ids(request.messages)
        elif isinstance(request.prompt, str):
            ids = list(self.tokenizer(request.prompt)["input_ids"])
        else:
            assert request.prompt is not None
            ids = list(request.prompt)
            bad = [t for t in ids if t >= self.vocab_size]
            if bad:
                raise RequestError(
                    f"prompt: token id {bad[0]} is out of the target's vocabulary (ids 0..{self.vocab_size - 1})",
                    param="prompt",
                    code="invalid_value",
                )
        if not ids:
            param = "messages" if request.messages is not None else "prompt"
            raise RequestError(f"{param}: the prompt has no tokens", param=param, code="invalid_value")
        return ids

    def _chat_ids(self, messages: Sequence[dict[str, str]]) -> list[int]:
        if not getattr(self.tokenizer, "chat_template", None):
            raise RequestError(
                f"the target's tokenizer has no chat template, so /v1/chat/completions cannot render "
                f"messages for {self.name}; send text to /v1/completions instead",
                param="messages",
                code="no_chat_template",
            )
        try:
            text = self.tokenizer.apply_chat_template(
                list(messages), tokenize=False, add_generation_prompt=True
            )
        except Exception as e:  # noqa: BLE001 - a template's raise_exception (e.g. no system role) is the client's fault
            raise RequestError(
                f"messages: the target's chat template refused them: {e}",
                param="messages",
                code="invalid_value",
            ) from None
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def max_new_tokens(self, request: GenerationRequest, prompt_tokens: int) -> int:
        """The request's max_tokens (or its default), or a RequestError when the context cannot hold it."""
        room = self.fit.room(prompt_tokens)
        assert room is not None  # the fit is bounded by context_length
        param = "max_completion_tokens" if request.endpoint == "chat" else "max_tokens"
        if room < 1:
            raise RequestError(
                f"the prompt is {prompt_tokens} tokens, but this server's context holds {self.context_length} "
                f"tokens, {self.reserved} of which are kept for the draft tree (--num-draft-tokens): at most "
                f"{self.context_length - self.reserved - 1} prompt tokens leave room for one generated token",
                param="messages" if request.endpoint == "chat" else "prompt",
                code="context_length_exceeded",
            )
        if request.max_tokens is None:
            return min(room, COMPLETIONS_DEFAULT_MAX_TOKENS) if request.endpoint == "completion" else room
        if request.max_tokens > room:
            raise RequestError(
                f"{param}={request.max_tokens} does not fit: the prompt is {prompt_tokens} tokens and the context "
                f"holds {self.context_length}, {self.reserved} of which are kept for the draft tree, so at most "
                f"{room} tokens can be generated",
                param=param,
                code="context_length_exceeded",
            )
        return request.max_tokens

    def describe(self) -> dict[str, Any]:
        spec = self.decoder.spec
        return {
            "draft": self.draft.path,
            "draft_format": self.draft.format,
            "aux_boundaries": list(self.draft.aux_boundaries),
            "aux_reading": self.draft.reading,
            "max_batch": self.max_batch,
            "speculative": None
            if not self.speculative
            else {"num_steps": spec.num_steps, "topk": spec.topk, "num_draft_tokens": spec.num_draft_tokens},
        }


def load_served_model(options: LoadOptions, name: str) -> ServedModel:
    """Load the target and draft and build the decoder (the slow part: seconds to minutes)."""
    from eaglewire.engine.api import SpeculativeDecoder, check_draft_fits_target
    from eaglewire.engine.runners.factory import DEFAULT_MAX_SEQ_LEN, make_runner
    from eaglewire.target.loading import load_target

    kind = "none"
    if options.draft is not None:
        kind = _draft_kind(options.draft, options.engine)  # before the target loads: a bad path fails fast
    elif options.engine not in ("auto", "eaglewire"):
        raise ConfigError(
            f"--engine {options.engine} reads an export directory, but no --draft was given",
            fix="pass --draft EXPORT_DIR, or drop --engine",
        )
    for flag, value, wanted in (
        ("--sglang-version", options.sglang_version, "sglang"),
        ("--vllm-version", options.vllm_version, "vllm"),
    ):
        if value is not None and kind != wanted:
            served = "no draft" if options.draft is None else f"--draft {options.draft} is {kind}"
            raise ConfigError(
                f"{flag} {value} names the {wanted} release that reads a {wanted} export, but {served}",
                fix=f"drop {flag}, or point --draft at a {wanted} export",
            )
    target = load_target(options.target, dtype=options.dtype, device=options.device)
    limit = int(getattr(target.config, "max_position_embeddings", DEFAULT_MAX_SEQ_LEN))
    context = (
        options.context_length if options.context_length is not None else min(limit, DEFAULT_MAX_SEQ_LEN)
    )
    if context > limit:
        raise ConfigError(
            f"--context-length {context}: the target's max_position_embeddings is {limit}",
            fix=f"use --context-length {limit} or less",
        )
    smallest = options.spec.num_draft_tokens + 2  # one prompt token, one generated, one draft tree
    if context < smallest:
        raise ConfigError(
            f"--context-length {context} holds no request: one prompt token, one generated token and a draft "
            f"tree of --num-draft-tokens {options.spec.num_draft_tokens} need {smallest}",
            fix=f"use --context-length {smallest} or more",
        )
    draft_model = None
    info = DraftInfo(None, "none", (), "no draft: plain decoding")
    if options.draft is not None:
        if kind == "eaglewire":
            from eaglewire.draft.io import load_draft

            draft_model, contract = load_draft(options.draft, device=target.device, dtype=target.dtype)
            check_draft_fits_target(contract, target)
            info = DraftInfo(str(options.draft), "eaglewire", tuple(contract.aux_boundaries), "contract.json")
        else:
            draft_model, info = _load_export(options, kind, target)
    runner = make_runner(
        target, info.aux_boundaries, options.runner, max_seq_len=context, max_batch_size=options.max_batch
    )
    capacity = int(getattr(runner, "max_seq_len", context))
    decoder = SpeculativeDecoder(
        runner, draft_model, options.spec, tokenizer=target.tokenizer, eos_token_ids=target.eos_token_ids
    )
    return ServedModel(
        decoder, name, info, min(capacity, context), max_batch=options.max_batch, target=options.target
    )


def _draft_kind(directory: Path, engine: Engine) -> str:
    """The draft directory's format; --engine, when named, must be the one that reads it."""
    from eaglewire.doctor.draft_source import detect_kind
    from eaglewire.typed_config import read_json_file

    if not directory.is_dir():
        raise CheckpointError(
            f"--draft {directory}: not a directory", fix="point --draft at a draft directory"
        )
    cfg_path = directory / "config.json"
    if not cfg_path.is_file():
        raise CheckpointError(
            f"--draft {directory}: config.json missing", fix="point --draft at a draft or export directory"
        )
    config = read_json_file(cfg_path)
    if not isinstance(config, dict):
        raise ConfigError(f"{cfg_path}: expected a JSON object")
    kind = str(detect_kind(config, str(cfg_path)))
    if engine not in ("auto", kind):
        raise ConfigError(
            f"--engine {engine}, but {cfg_path} is {'an' if kind == 'eaglewire' else 'a'} {kind} "
            f"{'draft' if kind == 'eaglewire' else 'export'}",
            fix=f"use --engine {kind} (or --engine auto), or point --draft at the {engine} export",
        )
    return kind


def _load_export(options: LoadOptions, kind: str, target: Any) -> tuple[Any, DraftInfo]:
    """An SGLang / vLLM export as a draft in memory, with the aux states that engine's release captures."""
    from eaglewire.doctor.draft_source import load_engine_draft, read_draft_source
    from eaglewire.export.importing import READERS

    assert options.draft is not None
    cfg_path = options.draft / "config.json"
    source = read_draft_source(options.draft, with_tensors=False)
    foreign = READERS[kind](source.config, str(cfg_path))
    boundaries, reading = served_boundaries(
        kind, foreign.layer_ids, target.architecture, target.num_layers, options, options.draft
    )
    model = load_engine_draft(source, target).to(device=target.device, dtype=target.dtype)
    if model.config.num_aux != len(boundaries):  # an engine would fail on the fc layer's width
        raise CheckpointError(
            f"{cfg_path}: {reading}, but the draft's fc.weight takes {model.config.num_aux} aux states",
            fix="write as many layer ids as the draft was trained on (`eaglewire ids` shows the ids for each engine)",
        )
    return model, DraftInfo(str(options.draft), kind, boundaries, reading)


def served_boundaries(
    kind: str,
    ids: tuple[int, ...] | None,
    architecture: str,
    num_layers: int,
    options: LoadOptions,
    directory: Path,
) -> tuple[tuple[int, ...], str]:
    """The aux boundaries an engine release serves for an export's ids, in the order it concatenates
    them, from `contract.numbering`'s engine table (the rules' one home): the release named with
    --sglang-version / --vllm-version, else the one our own export.json records, else every release
    read, which must agree (else refused, showing each release's reading). An engine would concatenate
    fewer states than the ids name (a boundary its capture never reaches, a duplicate): refused, since
    it could not serve the draft at all. Anything else it does to the ids (its id rule, layer order) is
    what is served: nothing is corrected."""
    from eaglewire.contract.numbering import VERSION_FLAGS, Engine, engine_readings, read_versions

    engine = Engine(kind)
    flag = VERSION_FLAGS[engine]
    version = options.sglang_version if engine is Engine.SGLANG else options.vllm_version
    named_by = flag
    if version is None and ids is not None:
        version, named_by = _manifest_version(directory, ids), "export.json"
    readings = engine_readings(engine, architecture, ids, num_layers, version)
    shown = "; ".join(r.text() for r in readings)
    where = directory / "config.json"
    if len({r.boundaries for r in readings}) > 1:
        raise BoundaryError(
            f"{where}: the {engine.value} releases eaglewire has read serve these ids differently on a "
            f"{architecture} target: {shown}",
            fix=f"name the release you serve with: {flag} X.Y.Z (releases read: {read_versions(engine, architecture)})",
        )
    reading = readings[-1]
    wanted = len(ids) if ids is not None else len(reading.boundaries or ())
    if reading.boundaries is None or len(reading.boundaries) < wanted:
        raise BoundaryError(
            f"{where}: {shown}: {engine.value} could not serve this draft",
            fix="write ids that engine captures (`eaglewire ids` shows them for each engine and release)",
        )
    if reading.problem:
        log.warning("%s: served as %s does: %s", where, reading.label, reading.problem)
    how = f"{reading.label}" + (
        f", named by {named_by}" if version is not None else ", every release read agrees"
    )
    written = "its default ids" if ids is None else f"ids {list(ids)}"
    return reading.boundaries, f"{written} read as {engine.value} does ({how})"


def _manifest_version(directory: Path, ids: tuple[int, ...]) -> str | None:
    """The release our own export.json says the ids were written for, while they are still its ids."""
    from eaglewire.typed_config import read_json_file

    path = directory / "export.json"
    if not path.is_file():
        return None
    manifest = read_json_file(path)
    if not isinstance(manifest, dict) or manifest.get("layer_ids") != list(ids):
        return None
    version = manifest.get("engine_version")
    return version if isinstance(version, str) else None
