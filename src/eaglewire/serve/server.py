"""Run the server until a signal: SIGINT (Ctrl-C) -> exit 130, SIGTERM -> exit 0.

130 is the CLI's "interrupted" status (README, "Exit codes"), so a script can tell a Ctrl-C from an
orderly stop by a supervisor (SIGTERM, what `docker stop`, systemd and Kubernetes send), which is 0.
Either way: the listening socket closes, every queued or decoding request is cancelled (decoding
stops at the end of its current round), the connections close, and no traceback is printed.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import signal
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

from eaglewire.errors import ConfigError
from eaglewire.serve.app import build_app
from eaglewire.serve.loading import ServedModel
from eaglewire.serve.metrics import ServerMetrics
from eaglewire.serve.worker import DecodeQueue

log = logging.getLogger(__name__)

EXIT_SIGNALS = {signal.SIGINT: 130, signal.SIGTERM: 0}
SHUTDOWN_SECONDS = 5.0  # connections still open this long after the jobs were cancelled are closed


@dataclass
class RunningServer:
    """A started server: its URL, queue and counters; `stop` cancels what is in flight and closes it."""

    url: str
    queue: DecodeQueue
    metrics: ServerMetrics
    runner: web.AppRunner

    async def stop(self) -> int:
        """Close the socket, cancel every queued or decoding request, wait for the decode thread;
        returns how many requests were cancelled."""
        cancelled = self.queue.cancel_all()
        await self.runner.cleanup()
        await asyncio.get_running_loop().run_in_executor(None, self.queue.shutdown)
        return cancelled


async def start_server(served: ServedModel, *, host: str, port: int, max_queue: int) -> RunningServer:
    """Listen on host:port (port 0: any free port) with the app on `served`; no signal handling (`serve`)."""
    spec = served.decoder.spec if served.speculative else None
    metrics = ServerMetrics(
        served.name,
        num_steps=None if spec is None else spec.num_steps,
        num_draft_tokens=None if spec is None else spec.num_draft_tokens,
    )
    queue: DecodeQueue
    if served.max_batch > 1:
        from eaglewire.serve.batch_worker import BatchDecodeQueue, batch_policy

        policy = batch_policy(served.decoder, served.draft.path, served.target or served.name)
        queue = BatchDecodeQueue(
            served.decoder, max_queue, metrics, max_batch=served.max_batch, policy=policy
        )
    else:
        queue = DecodeQueue(served.decoder, max_queue, metrics)
    await asyncio.get_running_loop().run_in_executor(None, queue.warm_up)
    app = build_app(served, queue, metrics)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=SHUTDOWN_SECONDS)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as e:
        await runner.cleanup()
        queue.shutdown()
        taken = e.errno == errno.EADDRINUSE
        raise ConfigError(
            f"--host {host} --port {port}: cannot listen ({e.strerror or e})",
            fix="pick a free port with --port (or --port 0 for any free one)"
            if taken
            else "use an address of this machine with --host (127.0.0.1, or 0.0.0.0 for every interface)",
        ) from None
    return RunningServer(_url(runner, host, port), queue, metrics, runner)


def serve(
    served: ServedModel,
    *,
    host: str,
    port: int,
    max_queue: int,
    on_listening: Callable[[str], None] | None = None,
) -> int:
    """Serve until SIGINT or SIGTERM; the exit status for that signal (module doc).
    `on_listening(url)` runs once the socket listens (`port=0`: the port the system picked)."""
    return asyncio.run(_serve(served, host, port, max_queue, on_listening))


async def _serve(
    served: ServedModel, host: str, port: int, max_queue: int, on_listening: Callable[[str], None] | None
) -> int:
    server = await start_server(served, host=host, port=port, max_queue=max_queue)
    loop = asyncio.get_running_loop()
    received: list[signal.Signals] = []
    stop = asyncio.Event()

    def on_signal(sig: signal.Signals) -> None:
        received.append(sig)
        stop.set()

    try:
        for sig in EXIT_SIGNALS:
            loop.add_signal_handler(sig, on_signal, sig)
        about = served.describe()
        log.info(
            "serving %s: draft %s (%s, aux boundaries %s: %s), speculative %s, context %d tokens, batch %d, queue %d",
            served.name,
            about["draft"],
            about["draft_format"],
            about["aux_boundaries"],
            about["aux_reading"],
            about["speculative"],
            served.context_length,
            served.max_batch,
            max_queue,
        )
        log.info("listening on %s (Ctrl-C or SIGTERM stops)", server.url)
        if on_listening is not None:
            on_listening(server.url)
        await stop.wait()
    finally:
        for sig in EXIT_SIGNALS:
            loop.remove_signal_handler(sig)
        cancelled = await server.stop()
        if received:
            log.info("%s: stopped; %d request(s) cancelled", received[0].name, cancelled)
    return EXIT_SIGNALS[received[0]]


def _url(runner: web.AppRunner, host: str, port: int) -> str:
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            shown = f"[{address[0]}]" if ":" in str(address[0]) else address[0]
            return f"http://{shown}:{address[1]}"
    return f"http://{host}:{port}"
