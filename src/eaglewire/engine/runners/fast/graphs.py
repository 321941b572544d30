"""CUDA graph capture per static shape bucket.

A `GraphCache` maps a key (batch, new tokens, attended slots, variant) to a captured graph with
static input buffers. Running it copies the inputs into those buffers and replays the graph: one
launch for the whole forward, no Python or host synchronisation per kernel. All graphs share one
memory pool (they never run concurrently; every output a caller still holds stays allocated).
Each capture is timed (warm-up runs, where torch.compile does its work, included): `captures` and
`capture_seconds` are running totals, so callers can report what a new shape cost them.
"""

from __future__ import annotations

import itertools
import logging
import time
import types
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import torch

log = logging.getLogger(__name__)
_CODE_IDS = itertools.count()

GraphFn = Callable[[dict[str, torch.Tensor]], tuple[torch.Tensor, ...]]


@dataclass
class CapturedGraph:
    graph: torch.cuda.CUDAGraph
    inputs: dict[str, torch.Tensor]
    outputs: tuple[torch.Tensor, ...]

    def run(self, values: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """Copy `values` into the static inputs (same shapes), replay; returns the static outputs,
        which the next replay of this graph overwrites."""
        for name, value in values.items():
            self.inputs[name].copy_(value, non_blocking=True)
        self.graph.replay()
        return self.outputs


class GraphCache:
    def __init__(self, device: torch.device, *, warmup_runs: int = 2) -> None:
        self.device = device
        self.warmup_runs = warmup_runs
        self._graphs: dict[Hashable, CapturedGraph] = {}
        self._pool = torch.cuda.graph_pool_handle()
        self.captures = 0  # graphs captured so far (clear() does not reset it)
        self.capture_seconds = 0.0  # seconds those captures took, warm-up and compilation included

    def __len__(self) -> int:
        return len(self._graphs)

    def get(
        self,
        key: Hashable,
        make_inputs: Callable[[], dict[str, torch.Tensor]],
        fn: GraphFn,
    ) -> CapturedGraph:
        """The graph for `key`, capturing it on first use: `make_inputs()` allocates the static
        inputs (filled with valid values), `fn(inputs)` is the work; it is run `warmup_runs` times
        on a side stream first (compiling whatever it compiles), then captured."""
        found = self._graphs.get(key)
        if found is not None:
            return found
        torch.cuda.synchronize(self.device)
        start = time.perf_counter()
        inputs = make_inputs()
        side = torch.cuda.Stream(device=self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(self.warmup_runs):
                fn(inputs)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            outputs = fn(inputs)
        torch.cuda.synchronize(self.device)
        seconds = time.perf_counter() - start
        self.captures += 1
        self.capture_seconds += seconds
        captured = CapturedGraph(graph=graph, inputs=inputs, outputs=outputs)
        self._graphs[key] = captured
        log.debug(
            "captured CUDA graph %s in %.3fs (%d graphs held; %d captures, %.2fs in all)",
            key,
            seconds,
            len(self._graphs),
            self.captures,
            self.capture_seconds,
        )
        return captured

    def clear(self) -> None:
        self._graphs.clear()


def own_code(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A copy of `fn` with its own code object. torch.compile keeps compiled entries per code
    object, and every runner's closures share one, so several runners in a process (or several
    kernel choices) would pile up guards and hit the recompile limit; a private copy isolates them."""
    code = fn.__code__.replace(co_name=f"{fn.__code__.co_name}_{next(_CODE_IDS)}")
    copy = types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__, fn.__closure__)
    copy.__kwdefaults__ = fn.__kwdefaults__
    return copy
