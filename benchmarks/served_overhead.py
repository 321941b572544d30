"""What serving over HTTP costs, and whether the doctor reads a live server right (issue 45, item 5).

For each speculative setting, on the same prompts, greedy, batch 1:
  in-process   `eaglewire bench` (the engine called directly; its bench.json also records every round's
               accepted tree nodes, the traces benchmarks/scale_model.py replays)
  over HTTP    `eaglewire serve` on 127.0.0.1, one POST /v1/chat/completions per prompt, sequentially,
               timed by the client around the whole request (tokenization, JSON, the socket included);
               acceptance read from SGLang's per-response fields (sglext.spec_tokens_details)
The overhead of serving is the difference per request and per generated token. Then the doctor against
live servers: the draft's SGLang export served as SGLang reads it (must exit 0), and its vLLM export with
the aux layer ids shifted by one, as a user's hand edit would leave it (must exit 1 naming the shift).

    python benchmarks/served_overhead.py --target smollm2 --draft DRAFT --prompts mt-bench \
        --settings chain:5,tree:8x12x128 --dtype bfloat16 --work WORK --out served.json     # on a GPU
    python benchmarks/served_overhead.py --tiny --work WORK --out served.json             # CPU check

Prints a short table last; writes served.json and served.md beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

EW = [sys.executable, "-m", "eaglewire"]


@dataclass(frozen=True)
class Setting:
    name: str  # "chain:5" or "tree:8x12x128"
    num_steps: int
    topk: int
    num_draft_tokens: int

    @classmethod
    def parse(cls, text: str) -> Setting:
        if text == "plain":
            return cls(text, 0, 0, 1)
        kind, _, value = text.partition(":")
        if kind == "chain":
            k = int(value)
            return cls(text, k, 1, k + 1)
        if kind == "tree":
            steps, topk, nodes = (int(v) for v in value.split("x"))
            return cls(text, steps, topk, nodes)
        raise SystemExit(f"--settings: expected chain:K or tree:SxKxN, got {text!r}")

    def bench_flags(self) -> list[str]:
        if self.name == "plain":
            return ["--methods", "plain"]
        if self.topk == 1:
            return ["--methods", "eagle-chain", "--chain-steps", str(self.num_steps)]
        return ["--methods", "eagle-tree", "--num-steps", str(self.num_steps), "--topk", str(self.topk),
                "--num-draft-tokens", str(self.num_draft_tokens)]  # fmt: skip

    def serve_flags(self) -> list[str]:
        if self.name == "plain":
            return []
        return ["--num-steps", str(self.num_steps), "--topk", str(self.topk),
                "--num-draft-tokens", str(self.num_draft_tokens)]  # fmt: skip

    @property
    def method(self) -> str:
        return "plain" if self.name == "plain" else "eagle-chain" if self.topk == 1 else "eagle-tree"


@dataclass
class SettingResult:
    setting: str
    inprocess_tokens_per_s: float
    inprocess_tau: float
    http_tokens_per_s: float
    http_tau: float  # completion tokens / verifications, summed over prompts (SGLang's accept length)
    http_seconds_per_request: float  # median
    overhead_ms_per_request: float  # median over prompts of (HTTP wall - in-process time)
    overhead_ms_per_token: float  # (sum HTTP wall - sum in-process time) / sum tokens
    identical_texts: int  # prompts whose served token ids equal the in-process ones
    prompts: int
    vllm_counters: dict[str, float] = field(default_factory=dict)  # /metrics after the run


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(cmd: list[str], log: Path, timeout: float) -> int:
    """Run `cmd`, its output into `log`; the exit code."""
    with log.open("w") as f:
        return subprocess.run(
            cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout, check=False
        ).returncode


class Server:
    """`eaglewire serve` in a subprocess on a free port of 127.0.0.1, until the `with` ends."""

    def __init__(self, args: list[str], log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.cmd = [*EW, "serve", *args, "--host", "127.0.0.1", "--port", str(self.port)]
        self.log = log

    def __enter__(self) -> Server:
        self._f = self.log.open("w")
        self.proc = subprocess.Popen(self.cmd, stdout=self._f, stderr=subprocess.STDOUT)
        from eaglewire.doctor.served_client import ServedClient, ServerError

        client = ServedClient(self.url, "sglang", timeout=5)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"eaglewire serve exited {self.proc.returncode}: see {self.log}")
            try:
                client.model()
                return self
            except ServerError:
                time.sleep(1.0)
        raise SystemExit(f"eaglewire serve did not answer in 300 s: see {self.log}")

    def __exit__(self, *exc: object) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._f.close()


def inprocess(args: argparse.Namespace, setting: Setting, work: Path) -> dict[str, Any]:
    out = work / f"inprocess_{setting.name.replace(':', '_')}"
    draft = [] if setting.name == "plain" else ["--draft", str(args.draft)]
    cmd = [*EW, "bench", "--target", args.target, *draft, "--prompts", args.prompts,
           "--max-new-tokens", str(args.max_new_tokens), *setting.bench_flags(), "--repeats", "1",
           "--warmup", "1", "--dtype", args.dtype, "--device", args.device, "--no-plots",
           "--no-served-prediction", "--out", str(out)]  # fmt: skip
    if args.num_prompts:
        cmd += ["--num-prompts", str(args.num_prompts)]
    rc = run(cmd, work / f"{out.name}.log", args.timeout)
    if rc != 0:
        raise SystemExit(f"in-process bench exited {rc}: see {work / f'{out.name}.log'}")
    return json.loads((out / "bench.json").read_text())


def over_http(
    args: argparse.Namespace, setting: Setting, work: Path, bench: dict[str, Any]
) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Each prompt once through a live server (after one untimed request); per prompt: wall, tokens, counts."""
    from eaglewire.bench.prompts import BenchPrompt, load_prompt_set
    from eaglewire.doctor.served_client import (
        ServedClient,
        ServedResponse,
        parse_chat_response,
        parse_prometheus,
    )

    prompts = load_prompt_set(args.prompts, args.num_prompts or None).prompts
    draft = [] if setting.name == "plain" else ["--draft", str(args.draft)]
    serve = ["--target", args.target, *draft, *setting.serve_flags(), "--dtype", args.dtype,
             "--device", args.device]  # fmt: skip
    rows = []
    fields = "vllm" if setting.name == "plain" else "sglang"  # plain decoding carries no SGLang fields
    with Server(serve, work / f"serve_{setting.name.replace(':', '_')}.log") as server:
        client = ServedClient(server.url, "sglang", timeout=args.timeout)
        where = f"POST {server.url}/chat/completions"

        def ask(prompt: BenchPrompt) -> ServedResponse:
            body = {"model": client.model(), "messages": prompt.chat(), "max_tokens": args.max_new_tokens,
                    "temperature": 0.0, "return_token_ids": True, "return_spec_tokens_details": fields == "sglang"}  # fmt: skip
            return parse_chat_response(
                client._json("POST", "/v1/chat/completions", body), prompt.prompt_id, fields, where
            )

        ask(
            prompts[0]
        )  # untimed: the first request pays for CUDA graphs and caches, as the bench's warm-up does
        for prompt in prompts:
            t0 = time.perf_counter()
            r = ask(prompt)
            wall = time.perf_counter() - t0
            counts = r.per_response  # None when decoding plainly: every token is one verification
            verifications = counts.verifications if counts else r.completion_tokens
            rows.append(dict(prompt_id=prompt.prompt_id, seconds=wall, tokens=r.completion_tokens,
                             verifications=verifications, output_ids=r.output_ids))  # fmt: skip
        raw, _ = client._request("GET", "/metrics")
        samples = parse_prometheus(raw.decode(), server.url)
    counters = {f"{k[0]}{dict(k[1]) if k[1] else ''}": v for k, v in samples.items() if "spec_decode" in k[0]}
    return rows, counters


def summarize(
    setting: Setting, bench: dict[str, Any], rows: list[dict[str, Any]], counters: dict[str, float]
) -> SettingResult:
    method = bench["methods"][setting.method]
    local = {p["prompt_id"]: p for p in method["prompts"]}
    tokens = sum(r["tokens"] for r in rows)
    http_s = sum(r["seconds"] for r in rows)
    local_s = sum(local[r["prompt_id"]]["seconds"] for r in rows)
    identical = sum(r["output_ids"] == local[r["prompt_id"]]["token_ids"] for r in rows)
    return SettingResult(
        setting=setting.name,
        inprocess_tokens_per_s=float(method["tokens_per_s"]),
        inprocess_tau=float(method["tau"] or 1.0),
        http_tokens_per_s=tokens / http_s,
        http_tau=tokens / max(sum(r["verifications"] for r in rows), 1),
        http_seconds_per_request=statistics.median(r["seconds"] for r in rows),
        overhead_ms_per_request=1e3
        * statistics.median(r["seconds"] - local[r["prompt_id"]]["seconds"] for r in rows),
        overhead_ms_per_token=1e3 * (http_s - local_s) / max(tokens, 1),
        identical_texts=identical,
        prompts=len(rows),
        vllm_counters=counters,
    )


def doctor_runs(args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    """The doctor against a correct and a miswired live deployment (exit codes 0 and 1 expected)."""
    exports = work / "exports"
    for fmt in ("sglang", "vllm"):
        if not (exports / fmt / "config.json").exists():
            rc = run([*EW, "export", "--draft", str(args.draft), "--format", fmt, "--out", str(exports / fmt)],
                     work / f"export_{fmt}.log", args.timeout)  # fmt: skip
            if rc != 0:
                raise SystemExit(f"export {fmt} exited {rc}: see {work / f'export_{fmt}.log'}")
    shifted = exports / "vllm-shifted"
    if not shifted.exists():
        subprocess.run(["cp", "-r", str(exports / "vllm"), str(shifted)], check=True)
        config = json.loads((shifted / "config.json").read_text())
        ids = config["eagle_aux_hidden_state_layer_ids"]
        config["eagle_aux_hidden_state_layer_ids"] = [i + 1 for i in ids]
        (shifted / "config.json").write_text(json.dumps(config, indent=2))
    cases = [
        ("correct: the SGLang export, served as SGLang reads it", exports / "sglang", "sglang", 0),
        ("miswired: the vLLM export with its aux ids shifted by +1", shifted, "vllm", 1),
    ]
    results = []
    for label, directory, engine, expected in cases:
        name = directory.name
        serve = ["--target", args.target, "--draft", str(directory), "--engine", engine, "--dtype", args.dtype,
                 "--device", args.device, *Setting.parse(args.doctor_setting).serve_flags()]  # fmt: skip
        with Server(serve, work / f"serve_doctor_{name}.log") as server:
            cmd = [*EW, "doctor", "--served", server.url, "--engine", engine, "--draft", str(args.draft),
                   "--target", args.target, "--max-tokens", str(args.doctor_max_tokens)]  # fmt: skip
            if args.doctor_prompts:  # default: the doctor's own mix of MT-bench questions and code
                cmd += ["--prompts", args.doctor_prompts, "--num-prompts", str(args.doctor_num_prompts)]
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, check=False)
            seconds = time.perf_counter() - t0
        (work / f"doctor_{name}.txt").write_text(proc.stdout + proc.stderr)
        keep = ("[error]", "XX tau", "ok tau", "everything matches")
        verdicts = [line.strip() for line in proc.stdout.splitlines() if line.strip().startswith(keep)]
        results.append(dict(case=label, export=str(directory), engine=engine, exit=proc.returncode,
                            expected_exit=expected, seconds=seconds, verdicts=verdicts[:6]))  # fmt: skip
    return results


def tiny_world(work: Path) -> tuple[str, Path]:
    """A tiny target and a tiny trained draft (the test helpers' quickstart), for a CPU check of the plumbing."""
    run_dir = work / "tiny"
    draft = run_dir / "tiny" / "train" / "draft"
    target = work / "tiny_target"
    if not (draft / "config.json").exists():
        code = ("import sys; from pathlib import Path; from tests.helpers.tiny import make_tiny_target, "
                "save_tiny_target; save_tiny_target(make_tiny_target('llama'), Path(sys.argv[1]))")  # fmt: skip
        subprocess.run([sys.executable, "-c", code, str(target)], check=True)
        rc = run([*EW, "quickstart", "--preset", "tiny", "--target", str(target), "--out", str(run_dir),
                  "--stop-after", "train"], work / "tiny_quickstart.log", 600)  # fmt: skip
        if rc != 0:
            raise SystemExit(f"tiny quickstart exited {rc}: see {work / 'tiny_quickstart.log'}")
    return str(target), draft


def table(results: list[SettingResult], doctors: list[dict[str, Any]]) -> str:
    lines = [
        "| setting | in-process tok/s | HTTP tok/s | tau in-process | tau served | overhead ms/request (median) "
        "| overhead ms/token | identical texts |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.setting} | {r.inprocess_tokens_per_s:.1f} | {r.http_tokens_per_s:.1f} | {r.inprocess_tau:.2f} "
            f"| {r.http_tau:.2f} | {r.overhead_ms_per_request:.1f} | {r.overhead_ms_per_token:.3f} "
            f"| {r.identical_texts}/{r.prompts} |"
        )
    lines += [
        "",
        "| doctor --served case | engine | exit (expected) | seconds | first verdicts |",
        "|---|---|---|---|---|",
    ]
    for d in doctors:
        lines.append(f"| {d['case']} | {d['engine']} | {d['exit']} ({d['expected_exit']}) | {d['seconds']:.0f} "
                     f"| {'; '.join(d['verdicts'][:2])[:300]} |")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2")
    ap.add_argument("--draft", type=Path)
    ap.add_argument("--prompts", default="mt-bench")
    ap.add_argument("--num-prompts", type=int, default=0, help="0 = all")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--settings", default="plain,chain:5,tree:8x12x128", help="plain, chain:K, tree:SxKxN")
    ap.add_argument("--doctor-setting", default="chain:5", help="the spec the doctor's servers run")
    ap.add_argument("--doctor-max-tokens", type=int, default=128)
    ap.add_argument("--doctor-prompts", default="", help="the doctor's prompts (default: its own mix)")
    ap.add_argument("--doctor-num-prompts", type=int, default=10)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--skip-doctor", action="store_true")
    ap.add_argument(
        "--tiny", action="store_true", help="a tiny target and draft on CPU (checks the plumbing)"
    )
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.tiny:
        if args.draft is None:  # a world of its own (full_run.sh's tiny mode passes its tiny quickstart's)
            args.target, args.draft = tiny_world(args.work)
        args.prompts, args.num_prompts, args.max_new_tokens = "mt-bench", 2, 8
        args.settings, args.doctor_setting, args.doctor_max_tokens = "plain,chain:2,tree:2x2x4", "chain:2", 8
        args.doctor_prompts, args.doctor_num_prompts = (
            "mt-bench",
            2,
        )  # the doctor's mix outgrows a tiny context
        args.dtype, args.device = "float32", "cpu"
    if args.draft is None:
        raise SystemExit("--draft is required (or --tiny)")
    results = []
    for setting in (Setting.parse(s) for s in args.settings.split(",") if s):
        bench = inprocess(args, setting, args.work)
        rows, counters = over_http(args, setting, args.work, bench)
        results.append(summarize(setting, bench, rows, counters))
    doctors = [] if args.skip_doctor else doctor_runs(args, args.work)
    report = dict(
        date=datetime.now(UTC).isoformat(timespec="seconds"),
        command=" ".join(sys.argv),
        device=_device_name(),
        prompts=args.prompts,
        max_new_tokens=args.max_new_tokens,
        settings=[asdict(r) for r in results],
        doctor=doctors,
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    text = table(results, doctors)
    args.out.with_suffix(".md").write_text(text + "\n")
    print(text)
    bad = [d for d in doctors if d["exit"] != d["expected_exit"]]
    sys.exit(1 if bad else 0)


def _device_name() -> str:
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


if __name__ == "__main__":
    main()
