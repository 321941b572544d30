"""The aiohttp application: routes, OpenAI-style errors, the access log.

    POST /v1/chat/completions   chat turns through the target's chat template
    POST /v1/completions        text or token ids as given
    GET  /v1/models             the one model (its context length, the draft and how its ids were read)
    GET  /health                200 once the model is loaded (the server listens only then)
    GET  /metrics               Prometheus text (`serve.metrics`)

Every error is a JSON body `{"error": {"message", "type", "param", "code"}}`: 400 for a bad request
(malformed JSON, a field of the wrong type or value, a prompt the context cannot hold), 404 / 405
for an unknown path or method, 503 with `Retry-After` when the queue is full (`serve.worker`), 500
for a bug (logged with its traceback). One access-log line per request (logger
`eaglewire.serve.access`): client, method, path, status, prompt and completion tokens, seconds.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from eaglewire.errors import EaglewireError
from eaglewire.serve.loading import ServedModel
from eaglewire.serve.metrics import CONTENT_TYPE, ServerMetrics
from eaglewire.serve.protocol import MAX_SEED, Endpoint, RequestError, parse_json_body, parse_request
from eaglewire.serve.responses import Reply, matched_stop, openai_finish_reason
from eaglewire.serve.streaming import DONE, SSE_HEADERS, TextDeltas, sse
from eaglewire.serve.worker import DecodeQueue, Job

log = logging.getLogger(__name__)
access_log = logging.getLogger("eaglewire.serve.access")

MAX_BODY_BYTES = 32 * 2**20
SERVED: web.AppKey[ServedModel] = web.AppKey("served", ServedModel)
QUEUE: web.AppKey[DecodeQueue] = web.AppKey("queue", DecodeQueue)
METRICS: web.AppKey[ServerMetrics] = web.AppKey("metrics", ServerMetrics)
STARTED: web.AppKey[int] = web.AppKey("started", int)
ROUTES = "POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /health, GET /metrics"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def build_app(served: ServedModel, queue: DecodeQueue, metrics: ServerMetrics) -> web.Application:
    app = web.Application(middlewares=[_errors_and_access_log], client_max_size=MAX_BODY_BYTES)
    app[SERVED], app[QUEUE], app[METRICS], app[STARTED] = served, queue, metrics, int(time.time())
    app.router.add_post("/v1/chat/completions", _chat)
    app.router.add_post("/v1/completions", _completions)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/health", _health)
    app.router.add_get("/metrics", _metrics)
    return app


def _shutting_down() -> RequestError:
    return RequestError(
        "the server is stopping: this request was cancelled before it decoded",
        status=503,
        type="server_overloaded",
        code="shutting_down",
    )


def _error_response(error: RequestError) -> web.Response:
    return web.json_response(error.body(), status=error.status, headers=error.headers)


@web.middleware
async def _errors_and_access_log(request: web.Request, handler: Handler) -> web.StreamResponse:
    start = time.monotonic()
    request["tokens"] = None  # (prompt, completion), set by the generation handlers
    status: int | str = "-"
    try:
        response = await handler(request)
        status = response.status
        return response
    except RequestError as e:
        status = f"{e.status} ({e.code}{'' if e.param is None else ': ' + e.param})"
        request.app[METRICS].record_rejected("queue_full" if e.status == 503 else "bad_request")
        return _error_response(e)
    except web.HTTPException as e:  # the router's 404 / 405, the body-size limit's 413
        status = e.status
        return _error_response(
            RequestError(
                f"{request.method} {request.path}: {e.reason}; this server answers {ROUTES}",
                status=e.status,
                code=e.reason.lower().replace(" ", "_"),
                headers={k: v for k, v in e.headers.items() if k == "Allow"},
            )
        )
    except (asyncio.CancelledError, ConnectionResetError):
        status = "cancelled (the client went away)"
        raise
    except Exception as e:
        status = 500
        log.exception("internal error on %s %s", request.method, request.path)
        return _error_response(
            RequestError(
                f"internal error: {type(e).__name__}: {e} (a bug in eaglewire; the server log has the traceback)",
                status=500,
                type="server_error",
                code="internal_error",
            )
        )
    finally:
        tokens = request["tokens"]
        shown = "" if tokens is None else f" prompt={tokens[0]} completion={tokens[1]}"
        access_log.info(
            '%s "%s %s" %s%s %.3fs',
            request.remote,
            request.method,
            request.path,
            status,
            shown,
            time.monotonic() - start,
        )


async def _health(request: web.Request) -> web.Response:
    queue = request.app[QUEUE]
    return web.json_response({"status": "ok", "running": queue.running, "waiting": queue.waiting})


async def _metrics(request: web.Request) -> web.Response:
    queue = request.app[QUEUE]
    text = request.app[METRICS].render(running=queue.running, waiting=queue.waiting)
    return web.Response(body=text.encode("utf-8"), headers={"Content-Type": CONTENT_TYPE})


async def _models(request: web.Request) -> web.Response:
    served = request.app[SERVED]
    card = {
        "id": served.name,
        "object": "model",
        "created": request.app[STARTED],
        "owned_by": "eaglewire",
        "root": served.name,
        "max_model_len": served.context_length,
        "eaglewire": served.describe(),
    }
    return web.json_response({"object": "list", "data": [card]})


async def _chat(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "chat")


async def _completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "completion")


async def _generate(request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
    from eaglewire.engine.sampling import SamplingParams

    served, queue = request.app[SERVED], request.app[QUEUE]
    body = parse_json_body(await request.read())
    req = parse_request(endpoint, body)
    prompt_ids = served.encode(req)
    max_new_tokens = served.max_new_tokens(req, len(prompt_ids))
    seed = req.seed if req.seed is not None else secrets.randbelow(MAX_SEED)
    job = Job(
        prompt_ids,
        max_new_tokens,
        SamplingParams(temperature=req.temperature, top_p=req.top_p, seed=seed),
        req.stop,
    )
    reply = Reply(
        endpoint,
        served.name,
        prompt_ids,
        req.return_token_ids,
        served.reserved if served.speculative else None,
        return_prompt_token_ids=req.return_prompt_token_ids,
        return_meta_info=req.return_meta_info,
    )
    if req.stream:
        return await _stream(request, job, reply, req.include_usage)
    future = queue.submit(job)  # 503 when full
    try:
        result = await future
    except asyncio.CancelledError:
        queue.cancel(job)
        raise
    except EaglewireError as e:
        raise RequestError(str(e), code="invalid_value") from None
    if result is None:  # dropped before it ran: the server is stopping (a gone client reads nothing)
        raise _shutting_down()
    request["tokens"] = (len(prompt_ids), len(result.token_ids))
    return web.json_response(reply.body(result, _matched(served, result, req.stop)))


def _matched(served: ServedModel, result: Any, stops: tuple[str, ...]) -> int | str | None:
    full = served.decode(result.token_ids) if result.finish_reason == "stop_string" else None
    return matched_stop(result, stops, served.decoder.eos_token_ids, full)


async def _stream(request: web.Request, job: Job, reply: Reply, include_usage: bool) -> web.StreamResponse:
    """Server-sent events: a chunk per round that shows new text, the last one with the finish reason,
    SGLang's spec-details chunk, the usage chunk when asked, then `data: [DONE]`."""
    served, queue = request.app[SERVED], request.app[QUEUE]
    loop = asyncio.get_running_loop()
    rounds: asyncio.Queue[list[int] | None] = asyncio.Queue()

    def on_tokens(kept: list[int]) -> None:  # on the decode thread
        loop.call_soon_threadsafe(rounds.put_nowait, kept)

    job.on_tokens = on_tokens
    future = queue.submit(job)  # 503 before any byte of the stream
    # The decode thread schedules each round's tokens before the future's result: the sentinel comes last.
    future.add_done_callback(lambda _: rounds.put_nowait(None))
    response = web.StreamResponse(status=200, headers=SSE_HEADERS)
    generated = 0
    try:
        await response.prepare(request)
        deltas = TextDeltas(served.decode, job.stop)
        first = True
        if reply.endpoint == "chat" or reply.return_token_ids:
            await response.write(sse(reply.chunk("", first=True)))
            first = False
        while (ids := await rounds.get()) is not None:
            generated += len(ids)
            text = deltas.push(ids)
            if text or reply.return_token_ids:
                await response.write(sse(reply.chunk(text, token_ids=ids, first=first)))
                first = False
        try:
            result = future.result()
        except EaglewireError as e:
            await response.write(sse(RequestError(str(e), code="invalid_value").body()))
            await response.write(DONE)
            return response
        except Exception as e:
            log.exception("internal error while streaming %s", request.path)
            error = RequestError(f"internal error: {type(e).__name__}: {e}", status=500, type="server_error")
            await response.write(sse(error.body()))
            await response.write(DONE)
            return response
        if result is None:
            await response.write(sse(_shutting_down().body()))
            await response.write(DONE)
            return response
        request["tokens"] = (len(reply.prompt_ids), len(result.token_ids))
        await response.write(
            sse(
                reply.chunk(
                    deltas.finish(result.text),
                    finish_reason=openai_finish_reason(result.finish_reason),
                    matched_stop=_matched(served, result, job.stop),
                    first=first,
                )
            )
        )
        ext = reply.sglext_chunk(result)
        if ext is not None:
            await response.write(sse(ext))
        if include_usage:
            await response.write(sse(reply.usage_chunk(result)))
        await response.write(DONE)
        await response.write_eof()
        return response
    except (asyncio.CancelledError, ConnectionResetError):
        queue.cancel(job)
        request["tokens"] = (len(reply.prompt_ids), generated)
        raise
