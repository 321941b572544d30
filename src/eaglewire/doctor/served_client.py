"""Talk to a live OpenAI-compatible server and read its speculative acceptance the way its engine reports it.

No torch here, and no hand-written HTTP: requests go through the standard library's `urllib.request`,
one at a time by default (the doctor sends its prompts in sequence, so that each response's counters
are its own). With `--concurrency N` they go from N clients at once (a batching server decodes them
together): each response's own report still says its rounds (SGLang's, eaglewire serve's), but the
server-wide /metrics can only be compared over all of them (`pooled_agreement`), and vLLM, which reports
only there, needs one request at a time.

What each engine reports, and where (`--engine`):

    sglang     per response, SGLang 0.5.23's `SpecTokensDetails` at `sglext.spec_tokens_details` of the
               response (`sglang/srt/entrypoints/openai/protocol.py` lines 456-481, `SglExt`; filled by
               `serving_chat.py` lines 2865-2897 when the request says `return_spec_tokens_details`), from
               `TokenizerManager._calculate_spec_decoding_metrics` (`tokenizer_manager.py` lines 3138-3200):
               `spec_verify_ct` (verifications), `spec_num_correct_drafts` (accepted drafts, no bonus),
               `spec_num_proposed_drafts` (= spec_verify_ct * (num_draft_tokens - 1)),
               `spec_correct_drafts_histogram[k]` (verifications that accepted exactly k drafts). Token ids:
               `choices[0].prompt_token_ids` / `response_token_ids` with `return_token_ids`
               (serving_chat.py lines 2974-2981).
    vllm       server-wide Prometheus counters at `/metrics` (vLLM 0.33.0 `vllm/v1/spec_decode/metrics.py`
               lines 228-264): `vllm:spec_decode_num_drafts_total` (verifications),
               `..._num_draft_tokens_total`, `..._num_accepted_tokens_total` (no bonus) and
               `..._num_accepted_tokens_per_pos_total{position="i"}` (verifications accepting >= i+1
               drafts), summed over their `engine` / `model_name` labels; read before and after each
               request, the difference is that request's (nothing else may use the server meanwhile).
               Token ids: top-level `prompt_token_ids` and `choices[0].token_ids` with `return_token_ids`
               (`vllm/entrypoints/openai/chat_completion/protocol.py` lines 128, 155).
    eaglewire  `eaglewire serve`: both of the above, which must agree.

Who emits the first token: SGLang and vLLM sample it in the prefill forward, which is no verification,
so their counters cover the tokens after it; eaglewire's engine emits every token from a verification
(`PREFILL_EMITS_FIRST_TOKEN`). The replay follows the same split (`eaglewire.doctor.served`).
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from eaglewire.errors import ServerError

Engine = Literal["sglang", "vllm", "eaglewire"]
ENGINES: tuple[Engine, ...] = ("sglang", "vllm", "eaglewire")
# SGLang and vLLM sample the first output token in the prefill forward (not a verification).
PREFILL_EMITS_FIRST_TOKEN: dict[str, bool] = {"sglang": True, "vllm": True, "eaglewire": False}

SPEC_DETAILS = "sglext.spec_tokens_details"
VLLM_DRAFTS = "vllm:spec_decode_num_drafts_total"
VLLM_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
VLLM_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
VLLM_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
DEFAULT_TIMEOUT_S = 600.0


@dataclass
class RoundCounts:
    """Verification rounds of greedy speculative decoding, counted as the engines count them.

    verifications: target verification forwards with a draft; accepted: drafts accepted over them (no
    bonus token); proposed: drafted tokens verified; accepted_per_position[i]: verifications that
    accepted >= i + 1 drafts (None when the source does not say)."""

    verifications: int = 0
    accepted: int = 0
    proposed: int = 0
    accepted_per_position: list[int] | None = field(default_factory=list)

    @property
    def tau(self) -> float | None:
        """Tokens per verification, the bonus token included: 1 + accepted / verifications (vLLM's
        mean acceptance length; SGLang's spec_accept_length also counts the prefill's token)."""
        return 1.0 + self.accepted / self.verifications if self.verifications else None

    @property
    def drafts_per_verification(self) -> float | None:
        return self.proposed / self.verifications if self.verifications else None

    def per_position_acceptance(self, depth: int | None = None) -> list[float] | None:
        """[D] the share of verifications that accepted >= j drafts, j = 1..D."""
        if self.accepted_per_position is None:
            return None
        counts = list(self.accepted_per_position)
        if depth is not None:
            counts = (counts + [0] * depth)[:depth]
        return [c / self.verifications if self.verifications else 0.0 for c in counts]

    def __add__(self, other: RoundCounts) -> RoundCounts:
        per_pos: list[int] | None = None
        if self.accepted_per_position is not None and other.accepted_per_position is not None:
            a, b = self.accepted_per_position, other.accepted_per_position
            n = max(len(a), len(b))
            per_pos = [(a[i] if i < len(a) else 0) + (b[i] if i < len(b) else 0) for i in range(n)]
        return RoundCounts(
            self.verifications + other.verifications,
            self.accepted + other.accepted,
            self.proposed + other.proposed,
            per_pos,
        )

    @classmethod
    def pooled(cls, counts: Iterable[RoundCounts]) -> RoundCounts:
        total = cls()
        for c in counts:
            total = total + c
        return total

    def to_json(self) -> dict[str, Any]:
        return {
            "verifications": self.verifications,
            "accepted_drafts": self.accepted,
            "proposed_drafts": self.proposed,
            "tau": self.tau,
            "accepted_per_position": self.accepted_per_position,
        }


def _histogram_per_position(histogram: Sequence[int]) -> list[int]:
    """SGLang's histogram (verifications that accepted exactly k drafts) -> verifications accepting >= j, j >= 1."""
    return [sum(histogram[j:]) for j in range(1, len(histogram))]


def _int_field(holder: Mapping[str, Any], key: str, where: str, url: str) -> int:
    value = holder.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ServerError(
            f"{url}: {where}.{key}: expected a non-negative integer, got {value!r}",
            fix="point --served at an SGLang 0.5.x server (or eaglewire serve), or pass the server's --engine",
        )
    return value


def sglang_counts(body: Mapping[str, Any], url: str, *, completion_tokens: int) -> RoundCounts:
    """One response's SGLang spec fields (module docstring) as RoundCounts. SGLang leaves them out of a
    response that needed no verification (a single token); anything else without them is an error."""
    ext = body.get("sglext")
    details = ext.get("spec_tokens_details") if isinstance(ext, Mapping) else None
    if isinstance(details, list):  # n > 1 gives a list; the doctor asks for one choice
        details = details[0] if details else None
    if details is None:
        if completion_tokens <= 1:
            return RoundCounts(0, 0, 0, [])
        raise ServerError(
            f"{url}: the response has no {SPEC_DETAILS} (the request asked for it with "
            "return_spec_tokens_details): the server reports no speculative statistics per response",
            fix="launch SGLang with speculative decoding (--speculative-algorithm EAGLE3) at version 0.5.23 or "
            "later, or, for vLLM (which reports them at /metrics), pass --engine vllm",
        )
    if not isinstance(details, Mapping):
        raise ServerError(f"{url}: {SPEC_DETAILS}: expected an object, got {type(details).__name__}")
    verifications = _int_field(details, "spec_verify_ct", SPEC_DETAILS, url)
    accepted = _int_field(details, "spec_num_correct_drafts", SPEC_DETAILS, url)
    proposed = _int_field(details, "spec_num_proposed_drafts", SPEC_DETAILS, url)
    histogram = details.get("spec_correct_drafts_histogram")
    per_pos: list[int] | None = None
    if isinstance(histogram, list) and all(isinstance(h, int) and not isinstance(h, bool) for h in histogram):
        if histogram and sum(histogram) != verifications:
            raise ServerError(
                f"{url}: {SPEC_DETAILS}.spec_correct_drafts_histogram sums to {sum(histogram)} verifications, "
                f"spec_verify_ct says {verifications}"
            )
        if histogram and sum(k * h for k, h in enumerate(histogram)) != accepted:
            raise ServerError(
                f"{url}: {SPEC_DETAILS}.spec_correct_drafts_histogram counts "
                f"{sum(k * h for k, h in enumerate(histogram))} accepted drafts, spec_num_correct_drafts says "
                f"{accepted}"
            )
        per_pos = _histogram_per_position(histogram)
    return RoundCounts(verifications, accepted, proposed, per_pos)


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\S+)?\s*$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')

MetricKey = tuple[str, tuple[tuple[str, str], ...]]


def parse_prometheus(text: str, where: str) -> dict[MetricKey, float]:
    """Prometheus text exposition format (0.0.4) -> {(name, sorted labels): value}; comments skipped."""
    out: dict[MetricKey, float] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = _SAMPLE.match(line.strip())
        if m is None:
            raise ServerError(f"{where} line {lineno}: not a Prometheus sample: {line[:120]!r}")
        name, _, label_text, value = m.group(1), m.group(2), m.group(3), m.group(4)
        labels: list[tuple[str, str]] = []
        if label_text:
            pos = 0
            while pos < len(label_text):
                lm = _LABEL.match(label_text, pos)
                if lm is None:
                    raise ServerError(f"{where} line {lineno}: unreadable labels {{{label_text}}}")
                labels.append((lm.group(1), lm.group(2).replace('\\"', '"').replace("\\\\", "\\")))
                pos = lm.end()
        try:
            number = float(value)
        except ValueError:
            raise ServerError(f"{where} line {lineno}: {name}: value {value!r} is not a number") from None
        out[(name, tuple(sorted(labels)))] = number
    return out


def _summed(samples: Mapping[MetricKey, float], name: str) -> float | None:
    found = [v for (n, _), v in samples.items() if n == name]
    return sum(found) if found else None


def _per_position(samples: Mapping[MetricKey, float]) -> dict[int, float]:
    out: dict[int, float] = {}
    for (n, labels), v in samples.items():
        if n != VLLM_PER_POS:
            continue
        position = dict(labels).get("position")
        if position is not None and position.isdigit():
            out[int(position)] = out.get(int(position), 0.0) + v
    return out


def vllm_counts(before: Mapping[MetricKey, float], after: Mapping[MetricKey, float], url: str) -> RoundCounts:
    """The spec-decode counters' increase between two /metrics readings (module docstring)."""
    values = {}
    for name in (VLLM_DRAFTS, VLLM_DRAFT_TOKENS, VLLM_ACCEPTED):
        a, b = _summed(before, name), _summed(after, name)
        if a is None or b is None:
            raise ServerError(
                f"{url}/metrics has no {name}: the server is not decoding speculatively, or is not vLLM",
                fix="launch vLLM with an EAGLE-3 --speculative-config, or pass the server's --engine",
            )
        values[name] = int(round(b - a))
    pos_before, pos_after = _per_position(before), _per_position(after)
    depth = max([*pos_after, -1]) + 1
    per_pos = [int(round(pos_after.get(i, 0.0) - pos_before.get(i, 0.0))) for i in range(depth)]
    counts = RoundCounts(values[VLLM_DRAFTS], values[VLLM_ACCEPTED], values[VLLM_DRAFT_TOKENS], per_pos)
    if any(x < 0 for x in (counts.verifications, counts.accepted, counts.proposed, *per_pos)):
        raise ServerError(
            f"{url}/metrics: the spec-decode counters went down during a request (the server restarted?)"
        )
    return counts


@dataclass
class ServedResponse:
    """One prompt's answer and what the server says its decoding did."""

    prompt_id: str
    text: str
    finish_reason: str | None
    completion_tokens: int
    prompt_ids: list[int] | None  # as the server tokenized the prompt (None: it did not say)
    output_ids: list[int] | None  # the generated ids (None: it did not say; the text is re-tokenized)
    per_response: RoundCounts | None = None  # SGLang's fields (sglang, eaglewire)
    metrics_delta: RoundCounts | None = None  # vLLM's /metrics counters' increase (vllm, eaglewire)

    def counts(self, engine: str) -> RoundCounts:
        """The counts the engine's own way: SGLang per response, vLLM from /metrics, ours per response
        (checked against /metrics by `agreement`)."""
        chosen = self.metrics_delta if engine == "vllm" else self.per_response
        assert chosen is not None
        return chosen


def agreement(response: ServedResponse) -> list[str]:
    """Where eaglewire serve's two reports of one response disagree (empty when they agree)."""
    a, b = response.per_response, response.metrics_delta
    if a is None or b is None:
        return []
    out = []
    for what, x, y in (
        ("verifications (spec_verify_ct vs vllm:spec_decode_num_drafts_total)", a.verifications, b.verifications),
        ("accepted drafts (spec_num_correct_drafts vs vllm:spec_decode_num_accepted_tokens_total)", a.accepted,
         b.accepted),
        ("proposed drafts (spec_num_proposed_drafts vs vllm:spec_decode_num_draft_tokens_total)", a.proposed,
         b.proposed),
    ):  # fmt: skip
        if x != y:
            out.append(f"{response.prompt_id}: {what}: {x} vs {y}")
    if a.accepted_per_position is not None and b.accepted_per_position is not None:
        depth = max(len(a.accepted_per_position), len(b.accepted_per_position))
        pa = (a.accepted_per_position + [0] * depth)[:depth]
        pb = (b.accepted_per_position + [0] * depth)[:depth]
        if pa != pb:
            out.append(
                f"{response.prompt_id}: accepted per position (spec_correct_drafts_histogram vs "
                f"vllm:spec_decode_num_accepted_tokens_per_pos_total): {pa} vs {pb}"
            )
    return out


def pooled_agreement(
    responses: Sequence[ServedResponse],
    before: Mapping[MetricKey, float],
    after: Mapping[MetricKey, float],
    url: str,
) -> list[str]:
    """`agreement` over requests sent at once: the sum of their per-response reports vs the /metrics
    increase around all of them (nothing else may use the server meanwhile)."""
    mine = [r.per_response for r in responses]
    if not responses or any(c is None for c in mine):
        return []
    pooled = ServedResponse(
        prompt_id=f"all {len(responses)} prompts",
        text="",
        finish_reason=None,
        completion_tokens=sum(r.completion_tokens for r in responses),
        prompt_ids=None,
        output_ids=None,
        per_response=RoundCounts.pooled(c for c in mine if c is not None),
        metrics_delta=vllm_counts(before, after, url),
    )
    return agreement(pooled)


def parse_chat_response(answer: Mapping[str, Any], prompt_id: str, engine: str, where: str) -> ServedResponse:
    """A non-streamed chat completion -> ServedResponse (with SGLang's per-response counts for sglang and
    eaglewire). Token ids where the server gave them: vLLM's (and eaglewire serve's) top-level
    `prompt_token_ids` + `choices[0].token_ids`, or SGLang's `choices[0].prompt_token_ids` +
    `choices[0].response_token_ids`."""
    choices = answer.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ServerError(f"{where}: the response has no choices[0]")
    choice = choices[0]
    message = choice.get("message")
    text = message.get("content") if isinstance(message, dict) else None
    if not isinstance(text, str):
        raise ServerError(f"{where}: choices[0].message.content: expected a string, got {text!r}")
    usage = answer.get("usage")
    completion_tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    if isinstance(completion_tokens, bool) or not isinstance(completion_tokens, int):
        raise ServerError(f"{where}: usage.completion_tokens: expected an integer, got {completion_tokens!r}")
    prompt_ids = _ids(answer.get("prompt_token_ids")) or _ids(choice.get("prompt_token_ids"))
    output_ids = _ids(choice.get("token_ids"))
    if output_ids is None:
        output_ids = _ids(choice.get("response_token_ids"))
    finish = choice.get("finish_reason")
    response = ServedResponse(
        prompt_id=prompt_id,
        text=text,
        finish_reason=finish if isinstance(finish, str) else None,
        completion_tokens=completion_tokens,
        prompt_ids=prompt_ids,
        output_ids=output_ids,
    )
    if engine in ("sglang", "eaglewire"):
        response.per_response = sglang_counts(answer, where, completion_tokens=completion_tokens)
    return response


def _ids(value: Any) -> list[int] | None:
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return [int(v) for v in value]
    return None


def base_url(url: str) -> str:
    """'http://host:port', 'http://host:port/' or 'http://host:port/v1' -> 'http://host:port'."""
    parsed = urllib.parse.urlparse(url.strip())
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ServerError(
            f"--served {url!r}: expected an http(s) URL such as http://127.0.0.1:30000",
            fix="pass the server's address, e.g. --served http://127.0.0.1:30000",
        )
    path = parsed.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[: -len("/v1")]
    return urllib.parse.urlunparse((parsed.scheme, parsed.netloc, path, "", "", "")).rstrip("/")


class ServedClient:
    """A few requests to one server, sequentially (module docstring)."""

    def __init__(self, url: str, engine: Engine, *, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        if engine not in ENGINES:
            raise ServerError(f"--engine: expected one of {', '.join(ENGINES)}, got {engine!r}")
        self.url = base_url(url)
        self.engine = engine
        self.timeout = timeout
        self._model: str | None = None
        self.model_card: dict[str, Any] = {}

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[bytes, str]:
        url = self.url + path
        data = None if body is None else json.dumps(body).encode("utf-8")
        headers = {"Content-Type": "application/json"} if data is not None else {}
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return response.read(), response.headers.get("Content-Type", "")
        except urllib.error.HTTPError as e:
            detail = e.read().decode("utf-8", errors="replace")
            try:
                parsed = json.loads(detail)
                message = parsed.get("error", {}).get("message") if isinstance(parsed, dict) else None
                detail = message or parsed.get("message") or detail
            except (json.JSONDecodeError, AttributeError):
                pass
            raise ServerError(
                f"{method} {url}: HTTP {e.code} {e.reason}: {str(detail).strip()[:400]}",
                fix="check that --served names the server and --engine its kind (sglang, vllm or eaglewire)",
            ) from None
        except (urllib.error.URLError, ConnectionError, TimeoutError) as e:
            reason = getattr(e, "reason", e)
            raise ServerError(
                f"--served {self.url}: cannot reach {url} ({reason})",
                fix="start the server, or pass the address it listens on with --served http://HOST:PORT",
            ) from None

    def _json(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        raw, _ = self._request(method, path, body)
        try:
            parsed = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ServerError(
                f"{method} {self.url}{path}: the answer is not JSON ({e}): {raw[:200]!r}"
            ) from None
        if not isinstance(parsed, dict):
            raise ServerError(
                f"{method} {self.url}{path}: expected a JSON object, got {type(parsed).__name__}"
            )
        return parsed

    def model(self) -> str:
        """The served model's name (the first of GET /v1/models), which vLLM requires in every request."""
        if self._model is None:
            listing = self._json("GET", "/v1/models")
            data = listing.get("data")
            if not isinstance(data, list) or not data or not isinstance(data[0], dict) or "id" not in data[0]:
                raise ServerError(f"GET {self.url}/v1/models: no model listed (data[0].id missing)")
            self.model_card = data[0]
            self._model = str(data[0]["id"])
        return self._model

    @property
    def prefill_emits_first_token(self) -> bool:
        """Whether the server samples the first output token in the prefill (no verification): SGLang and
        vLLM do; eaglewire serve (which says `owned_by: eaglewire` in /v1/models) does not, whatever
        engine's report format it is read in."""
        if self.model_card.get("owned_by") == "eaglewire":
            return False
        return PREFILL_EMITS_FIRST_TOKEN[self.engine]

    def metrics(self) -> dict[MetricKey, float]:
        raw, _ = self._request("GET", "/metrics")
        return parse_prometheus(raw.decode("utf-8", errors="replace"), f"{self.url}/metrics")

    def chat(
        self, prompt_id: str, messages: list[dict[str, str]], *, max_tokens: int, metrics: bool = True
    ) -> ServedResponse:
        """One greedy chat completion, with the engine's counters for it (`metrics`: with its /metrics
        increase; False when other requests run meanwhile, so that the increase is not its own)."""
        body: dict[str, Any] = {
            "model": self.model(),
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "stream": False,
            "return_token_ids": True,
        }
        if self.engine in ("sglang", "eaglewire"):
            body["return_spec_tokens_details"] = True
        before = self.metrics() if metrics and self.engine in ("vllm", "eaglewire") else None
        answer = self._json("POST", "/v1/chat/completions", body)
        after = self.metrics() if before is not None else None
        response = parse_chat_response(answer, prompt_id, self.engine, f"POST {self.url}/v1/chat/completions")
        if before is not None and after is not None:
            response.metrics_delta = vllm_counts(before, after, self.url)
        return response


def validate_served_flags(opts: Any) -> None:
    """`eaglewire doctor`'s --served / --engine / --prompts / --num-prompts, before anything loads.
    `opts`: the doctor's options (served, engine, prompts, num_prompts, draft, target)."""
    from eaglewire.errors import ConfigError

    if opts.served is None:
        given = [flag for flag, value in (("--engine", opts.engine), ("--prompts", opts.prompts),
                                          ("--num-prompts", opts.num_prompts)) if value is not None]  # fmt: skip
        if getattr(opts, "concurrency", 1) != 1:
            given.append("--concurrency")
        if given:
            raise ConfigError(
                f"{', '.join(given)}: only used with --served URL", fix="add --served URL, or drop them"
            )
        return
    if opts.engine is None:
        raise ConfigError(
            "--served needs --engine: how the server reports its acceptance",
            fix="add --engine sglang, --engine vllm or --engine eaglewire (eaglewire serve)",
        )
    if opts.engine not in ENGINES:
        raise ConfigError(
            f"--engine: expected one of {', '.join(ENGINES)}, got {opts.engine!r}",
            fix="pass --engine sglang, --engine vllm or --engine eaglewire",
        )
    missing = [flag for flag, value in (("--draft", opts.draft), ("--target", opts.target)) if value is None]
    if missing:
        raise ConfigError(
            f"--served replays the served text with the draft on the target: {' and '.join(missing)} missing",
            fix="pass the draft the server serves (or the eaglewire draft it was exported from) with --draft, and "
            "its target with --target",
        )
    if opts.num_prompts is not None and opts.num_prompts < 1:
        raise ConfigError(
            f"--num-prompts: expected >= 1, got {opts.num_prompts}", fix="pass --num-prompts 1 or more"
        )
    concurrency = getattr(opts, "concurrency", 1)
    if concurrency < 1:
        raise ConfigError(
            f"--concurrency: expected >= 1 (clients sending at once), got {concurrency}",
            fix="pass --concurrency 1 (one request at a time) or more",
        )
    if concurrency > 1 and opts.engine == "vllm":
        raise ConfigError(
            f"--concurrency {concurrency} with --engine vllm: vLLM reports acceptance only in its server-wide "
            "/metrics counters, so each request's counts are the increase around it, which needs one request "
            "at a time",
            fix="drop --concurrency with --engine vllm (or pass --concurrency 1)",
        )
    base_url(opts.served)


def served_client_for(opts: Any) -> ServedClient | None:
    """The client for --served, already past GET /v1/models (so an unreachable server fails before the
    target loads), or None without --served."""
    if opts.served is None:
        return None
    client = ServedClient(opts.served, opts.engine)
    client.model()
    return client
