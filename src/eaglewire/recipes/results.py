"""What each quickstart stage returns, and the summary: typed values with the JSON of `<stage>.json`.

A finished stage's result is written to `<stage>.json` as {"stage", "seconds", "result": to_json()},
and a rerun reads it back with `from_json`. The keys are those the recipe always wrote, so a run
directory made by an earlier release still resumes: keys added since are optional on reading, and
keys an older release wrote under another name are read by it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, Self, TypeVar

EvalSummary = dict[str, Any]  # `EvalResult.summary()`: loss, accuracy and conditional accuracy per step


class StageResult(Protocol):
    def to_json(self) -> dict[str, Any]: ...

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Self: ...


R = TypeVar("R", bound=StageResult)


@dataclass(frozen=True)
class TargetStageResult:
    contract: dict[str, Any]  # Contract.to_json()
    engine_ids: dict[str, Any]  # engine / tool -> the aux layer ids it is given (or why none)
    norms: list[tuple[int, str, float]]  # (boundary, "pre" | "post", mean per-token L2 norm)

    def to_json(self) -> dict[str, Any]:
        return {
            "contract": self.contract,
            "engine_ids": {
                k: list(v) if isinstance(v, tuple | list) else v for k, v in self.engine_ids.items()
            },
            "norms": [list(n) for n in self.norms],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Self:
        norms = [(int(b), str(n), float(x)) for b, n, x in data["norms"]]
        return cls(data["contract"], dict(data["engine_ids"]), norms)


@dataclass(frozen=True)
class CaptureResult:
    shards: int
    bytes: int
    tokens_per_s: float


@dataclass(frozen=True)
class DataSplitResult:
    conversations: int
    tokens: int
    loss_tokens: int
    regenerated: bool
    regenerate_tokens_per_s: float | None  # None: not regenerated
    truncated: int  # records cut at max_length
    capture: CaptureResult | None = None  # train_from_shards: the split's shards

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "conversations": self.conversations,
            "tokens": self.tokens,
            "loss_tokens": self.loss_tokens,
            "regenerated": self.regenerated,
            "regenerate_tokens_per_s": self.regenerate_tokens_per_s,
            "truncated": self.truncated,
        }
        if self.capture is not None:
            out["capture"] = vars(self.capture).copy()
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Self:
        capture = data.get("capture")
        return cls(
            conversations=data["conversations"],
            tokens=data["tokens"],
            loss_tokens=data["loss_tokens"],
            regenerated=data["regenerated"],
            regenerate_tokens_per_s=data.get("regenerate_tokens_per_s"),
            truncated=data.get("truncated", 0),
            capture=None if capture is None else CaptureResult(**capture),
        )


@dataclass(frozen=True)
class DataStageResult:
    splits: dict[str, DataSplitResult]  # "train", "eval"
    vocab: dict[str, int | float | str]  # the draft vocabulary's statistics

    def to_json(self) -> dict[str, Any]:
        return {**{name: s.to_json() for name, s in self.splits.items()}, "vocab": self.vocab}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Self:
        splits = {k: DataSplitResult.from_json(v) for k, v in data.items() if k != "vocab"}
        return cls(splits, dict(data.get("vocab", {})))


@dataclass(frozen=True)
class TrainStageResult:
    draft_dir: str  # absolute: a rerun from another working directory finds it
    optimizer_steps: int
    tokens: int | None  # None: a run made before the count was recorded
    tokens_per_s: float
    eval: EvalSummary | None  # the trainer's final held-out evaluation

    def to_json(self) -> dict[str, Any]:
        return dict(vars(self))

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Self:
        return cls(
            data["draft_dir"],
            data["optimizer_steps"],
            data.get("tokens"),
            data["tokens_per_s"],
            data.get("eval"),
        )


@dataclass(frozen=True)
class EvalStageResult:
    summary: EvalSummary  # whole held-out responses
    predicted_tau_chain: float  # the chain at the decode horizon, every answer
    # None below: a run made before they were recorded
    predicted_tau_chain_first_answers: float | None  # what a benchmark prompt is: its first answer
    predicted_horizon_tokens: int | None
    predicted_tau_chain_whole_responses: float | None

    def to_json(self) -> dict[str, Any]:
        return dict(vars(self))

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Self:
        return cls(
            data["summary"],
            data["predicted_tau_chain"],
            data.get("predicted_tau_chain_first_answers"),
            data.get("predicted_horizon_tokens"),
            data.get("predicted_tau_chain_whole_responses"),
        )


@dataclass(frozen=True)
class HeldoutPrediction:
    """A speculative setting's tau predicted on the held-out data (`eaglewire.predict.predictor`)."""

    predicted_tau: float | None
    method: str
    relative_error: float | None
    note: str

    def to_json(self) -> dict[str, Any]:
        return {
            "heldout_predicted_tau": self.predicted_tau,
            "heldout_prediction_method": self.method,
            "heldout_relative_error": self.relative_error,
            "heldout_prediction_note": self.note,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HeldoutPrediction | None:
        if "heldout_predicted_tau" not in data:
            return None
        return cls(
            data["heldout_predicted_tau"],
            data.get("heldout_prediction_method", ""),
            data.get("heldout_relative_error"),
            data.get("heldout_prediction_note", ""),
        )


@dataclass(frozen=True)
class ServedPrediction:
    """A speculative setting's tau predicted on the text it served (`eaglewire.predict.served`)."""

    predicted_tau: float | None
    measured_tau_in_text: float | None
    relative_error: float | None
    predicted_per_position_acceptance: list[float]
    note: str

    def to_json(self) -> dict[str, Any]:
        return {
            "served_predicted_tau": self.predicted_tau,
            "measured_tau_in_text": self.measured_tau_in_text,
            "served_relative_error": self.relative_error,
            "served_predicted_per_position_acceptance": self.predicted_per_position_acceptance,
            "served_prediction_note": self.note,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ServedPrediction | None:
        if "served_predicted_tau" not in data:
            return None
        return cls(
            data["served_predicted_tau"],
            data.get("measured_tau_in_text"),
            data.get("served_relative_error"),
            list(data.get("served_predicted_per_position_acceptance", [])),
            data.get("served_prediction_note", ""),
        )


@dataclass(frozen=True)
class DecodeMethodResult:
    """One method on one prompt set of the decode stage."""

    tokens_per_s: float | None
    tau: float | None  # None: plain decoding
    speedup_vs_plain: float | None
    decode_tokens_per_s: float | None
    decode_speedup_vs_plain: float | None
    identical_to_plain: bool | None  # greedy text equal to plain's; None: not compared
    # every difference explained by rounding or the reference's drift (not this method's bug); None: none
    differences_explained: bool | None
    per_position_acceptance: list[float]
    heldout: HeldoutPrediction | None = None  # speculative methods only
    served: ServedPrediction | None = None  # where made

    def to_json(self) -> dict[str, Any]:
        return {
            "tokens_per_s": self.tokens_per_s,
            "tau": self.tau,
            **(self.heldout.to_json() if self.heldout else {}),
            "speedup_vs_plain": self.speedup_vs_plain,
            "decode_tokens_per_s": self.decode_tokens_per_s,
            "decode_speedup_vs_plain": self.decode_speedup_vs_plain,
            "identical_to_plain": self.identical_to_plain,
            "differences_explained": self.differences_explained,
            "per_position_acceptance": self.per_position_acceptance,
            **(self.served.to_json() if self.served else {}),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Self:
        return cls(
            tokens_per_s=data.get("tokens_per_s"),
            tau=data.get("tau"),
            speedup_vs_plain=data.get("speedup_vs_plain"),
            decode_tokens_per_s=data.get("decode_tokens_per_s"),
            decode_speedup_vs_plain=data.get("decode_speedup_vs_plain"),
            identical_to_plain=data.get("identical_to_plain"),
            # older releases: every difference was at a near-tie of the target's two best tokens
            differences_explained=data.get("differences_explained", data.get("differences_at_near_ties")),
            per_position_acceptance=list(data.get("per_position_acceptance", [])),
            heldout=HeldoutPrediction.from_json(data),
            served=ServedPrediction.from_json(data),
        )


@dataclass(frozen=True)
class DecodeStageResult:
    sets: dict[str, dict[str, DecodeMethodResult]]  # decode run name -> method -> result

    def to_json(self) -> dict[str, Any]:
        return {name: {m: r.to_json() for m, r in methods.items()} for name, methods in self.sets.items()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Self:
        return cls(
            {
                name: {m: DecodeMethodResult.from_json(r) for m, r in methods.items()}
                for name, methods in data.items()
            }
        )

    def served_tau_chain(self) -> dict[str, float | None]:
        """Per prompt set: the chain's tau predicted on the text it served (None where not made)."""
        out: dict[str, float | None] = {}
        for name, methods in self.sets.items():
            chain = methods.get("eagle-chain")
            out[name] = chain.served.predicted_tau if chain is not None and chain.served else None
        return out

    def heldout_values(self, attr: str = "predicted_tau") -> dict[str, Any]:
        """Per speculative method: an attribute of its prediction on the held-out data at the decode
        horizon (the same for every prompt set): the first set's value that is not None."""
        out: dict[str, Any] = {}
        for methods in self.sets.values():
            for method, r in methods.items():
                if r.heldout is not None and out.get(method) is None:
                    out[method] = getattr(r.heldout, attr)
        return out


@dataclass(frozen=True)
class ExportFormatResult:
    dir: str
    layer_ids: list[int]  # as written in the export's config
    numbering: str  # what the ids mean to the engine
    launch_command: str


@dataclass(frozen=True)
class ExportStageResult:
    formats: dict[str, ExportFormatResult]  # "sglang", "vllm"

    def to_json(self) -> dict[str, Any]:
        return {fmt: vars(r).copy() for fmt, r in self.formats.items()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Self:
        return cls({fmt: ExportFormatResult(**r) for fmt, r in data.items()})


@dataclass(frozen=True)
class DoctorFormatResult:
    ok: bool
    findings: list[str]
    verdict: list[list[str]]  # (check, status, summary) rows


@dataclass(frozen=True)
class DoctorStageResult:
    formats: dict[str, DoctorFormatResult]  # the doctor on each export

    def to_json(self) -> dict[str, Any]:
        return {fmt: vars(r).copy() for fmt, r in self.formats.items()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Self:
        return cls({fmt: DoctorFormatResult(**r) for fmt, r in data.items()})

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.formats.values())


@dataclass(frozen=True)
class QuickstartSummary:
    """What the quickstart reports (summary.json). Stopped early (`stop_after`) it names the stage
    and has no results."""

    preset: str
    stage_seconds: dict[str, float]
    out_dir: str
    stopped_after: str | None = None
    predicted_tau_chain: float | None = None  # held-out records
    predicted_tau_chain_first_answers: float | None = None
    heldout_predicted_tau: dict[str, float | None] = field(default_factory=dict)  # per speculative method
    heldout_prediction_method: dict[str, str] = field(default_factory=dict)
    served_predicted_tau_chain: dict[str, float | None] = field(default_factory=dict)  # per prompt set
    decode: DecodeStageResult | None = None  # user-like sets first (mt-bench, user-eval: the headline)
    doctor_ok: bool | None = None
    # decode run -> "user-like" | "in-distribution held-out" (`bench.prompts.prompt_set_kind`)
    prompt_set_kind: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        if self.stopped_after is not None:
            return {
                "preset": self.preset,
                "stage_seconds": self.stage_seconds,
                "stopped_after": self.stopped_after,
                "out_dir": self.out_dir,
            }
        return {
            "preset": self.preset,
            "stage_seconds": self.stage_seconds,
            "predicted_tau_chain": self.predicted_tau_chain,
            "predicted_tau_chain_first_answers": self.predicted_tau_chain_first_answers,
            "heldout_predicted_tau": self.heldout_predicted_tau,
            "heldout_prediction_method": self.heldout_prediction_method,
            "served_predicted_tau_chain": self.served_predicted_tau_chain,
            "decode": None if self.decode is None else self.decode.to_json(),
            "prompt_set_kind": self.prompt_set_kind,
            "doctor_ok": self.doctor_ok,
            "out_dir": self.out_dir,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Self:
        decode = data.get("decode")
        return cls(
            preset=data["preset"],
            stage_seconds=dict(data["stage_seconds"]),
            out_dir=data["out_dir"],
            stopped_after=data.get("stopped_after"),
            predicted_tau_chain=data.get("predicted_tau_chain"),
            predicted_tau_chain_first_answers=data.get("predicted_tau_chain_first_answers"),
            heldout_predicted_tau=dict(data.get("heldout_predicted_tau", {})),
            heldout_prediction_method=dict(data.get("heldout_prediction_method", {})),
            served_predicted_tau_chain=dict(data.get("served_predicted_tau_chain", {})),
            decode=None if decode is None else DecodeStageResult.from_json(decode),
            doctor_ok=data.get("doctor_ok"),
            prompt_set_kind=dict(data.get("prompt_set_kind", {})),  # older summaries have none
        )
