"""The OpenAI-compatible HTTP server (FastAPI): ``/v1/chat/completions``, ``/v1/completions``, ``/v1/models``
(and ``/v1/models/{id}``), ``/tokenize`` and ``/detokenize`` (``tokenizing``), ``/version``, ``/health``,
``/metrics``. With an API key, every ``/v1`` route and the two token routes ask for it as a Bearer token;
``allowed_origins`` lets browsers on those origins call it (CORS).

Every request goes through the engine worker's bounded queue (``worker``); a full queue is a 429 with
``Retry-After``. A bad request is a 4xx with OpenAI's error body before anything is sent: a streamed answer's
status is decided after its prompt has run (its first event), so an error in the prompt is still a 400, not an
event in a 200 stream. A client that goes away cancels its generation at the next token.
"""

from __future__ import annotations

import asyncio
import functools
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from importlib.metadata import version
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..chat.streaming import CALL, CONTENT, AnswerStream
from ..chat.tool_calls import ParsedOutput
from ..defaults import MAX_ACTIVE, MAX_NUM_BATCHED_TOKENS, MAX_QUEUE, QUEUE_TIMEOUT_S
from ..engine import Engine
from ..options import check_mode
from ..outputs import GenerationOutput
from ..status import Event
from .completions import (
    choice,
    completion_arguments,
    parse_completion_request,
    prompts,
    text_chunk,
    text_completion,
)
from .completions import completion_id as text_completion_id
from .door import KEYED_ROOT_ROUTES, bearer_matches, key_refused, needs_key, parse, read_body
from .fields import ignored_header_value
from .limits import BODY_TIMEOUT_S, finite
from .metrics import ServerMetrics
from .protocol import (
    APIError,
    TokenBytes,
    chat_logprobs,
    chunk,
    completion,
    completion_id,
    engine_arguments,
    finish_reason,
    from_value_error,
    parse_request,
    sse,
    unique_call_ids,
    usage_chunk,
    wire_tool_calls,
)
from .tokenizing import add_token_routes
from .worker import EngineWorker, Job, QueueFull

COMPILE_TIMEOUT_S = 10.0  # for a request to be prepared (its output grammar built), off the engine thread and the loop
COMPILE_THREADS = 2
ROUTES = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/models",
    *KEYED_ROOT_ROUTES,
    "/version",
    "/health",
    "/metrics",
)
IGNORED_HEADER = "X-Hypic-Ignored-Fields"  # the body fields the policy ignored (``fields``)
T = TypeVar("T")
POLL_S = 0.25  # how often a waiting request checks that its client is still there


class _Gone(Exception):
    """The client disconnected while its request waited."""


class _CountRequests:
    """Counts every answer by route and status (pure ASGI, so it leaves streaming and disconnects alone)."""

    def __init__(self, app: Any, metrics: ServerMetrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status: dict[str, int] = {}

        async def capture(message: dict) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, capture)
        finally:
            route = scope["path"] if scope["path"] in ROUTES else "other"
            self.metrics.requests.labels(route, str(status.get("code", "disconnected"))).inc()


class _RequireKey:
    """Refuses a ``/v1`` request without ``Authorization: Bearer <key>`` (compared in constant time); the other
    routes (``/health``, ``/metrics``) stay open, as vLLM leaves them. Pure ASGI, like ``_CountRequests``."""

    def __init__(self, app: Any, key: str) -> None:
        self.app, self.key = app, key.encode()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and needs_key(scope["path"], scope.get("method")):
            headers = dict(scope.get("headers") or [])
            if not bearer_matches(headers.get(b"authorization", b""), self.key):
                await _error(key_refused())(scope, receive, send)
                return
        await self.app(scope, receive, send)


def token_bytes(engine: Engine) -> TokenBytes:
    """Each token id's bytes, for log-probabilities: exact from the grammar's vocabulary where it is built."""
    try:
        llg = engine.grammar_tokenizer().llg
    except ValueError:
        return lambda token: engine.decode([token]).encode()
    return lambda token: llg.decode_bytes([token])


def _error(exc: APIError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


def _as_api_error(exc: BaseException, retry_after: int) -> APIError:
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, ValueError):
        return from_value_error(exc)
    if isinstance(exc, TimeoutError):
        return APIError(
            429, f"the server is busy: {exc}", type="rate_limit_error", headers={"Retry-After": str(retry_after)}
        )
    if isinstance(exc, RuntimeError) and "shutting down" in str(exc):
        return APIError(503, str(exc), type="server_error")
    return APIError(500, f"internal error: {type(exc).__name__}: {exc}", type="server_error")


def create_app(
    engine: Engine,
    *,
    model_names: Sequence[str] = (),
    default_mode: str = "hypic",
    max_queue: int = MAX_QUEUE,
    max_active: int = MAX_ACTIVE,
    max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS,
    max_body_bytes: int = 8 << 20,
    queue_timeout_s: float = QUEUE_TIMEOUT_S,
    body_timeout_s: float = BODY_TIMEOUT_S,
    api_key: str | None = None,
    allowed_origins: Sequence[str] = (),
    shadow_rate: float = 0.0,
) -> FastAPI:
    """The app serving ``engine`` under ``model_names`` (the first is the one listed; the engine's own name
    is always accepted). The engine worker starts and stops with the app. A body must arrive whole within
    ``body_timeout_s`` of its headers (uvicorn has no such limit): else a 408. ``api_key``: the Bearer token
    every ``/v1`` route asks for; ``allowed_origins``: the origins browsers may call it from (``"*"``: any);
    ``shadow_rate``: the share of composed requests also run in ``full`` when the engine is idle, their KL
    exported as ``hypic_shadow_kl`` (``worker.py``)."""
    check_mode(default_mode)
    if api_key is not None and not api_key:
        raise ValueError("api_key must not be empty (leave it None for no key)")
    if engine.chat_setup is None:
        raise ValueError(f"checkpoint {engine.name!r} has no chat template; the chat API needs one")
    names = list(dict.fromkeys([*model_names, engine.name]))
    clock = _ServiceClock(max_active)
    worker = EngineWorker(
        engine,
        max_queue=max_queue,
        max_active=max_active,
        max_num_batched_tokens=max_num_batched_tokens,
        queue_timeout_s=queue_timeout_s,
        observe=lambda job, out: clock.observe(job, out, metrics),
        observe_step=lambda running, tokens: metrics.step(running, tokens),
        shadow_rate=shadow_rate,
        shadowed=lambda job, kl: metrics.shadow_kl.labels(job.prepared.options.mode).observe(kl),
    )
    metrics = ServerMetrics(engine, worker.queue.qsize, lambda: len(worker.active))
    compiler = _Compiler()

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        worker.start()
        try:
            yield
        finally:
            compiler.shutdown()
            await asyncio.to_thread(worker.stop)

    app = FastAPI(title="hypic-rag", lifespan=lifespan)
    app.state.engine, app.state.worker, app.state.metrics = engine, worker, metrics
    _add_middleware(app, api_key, allowed_origins, metrics)
    _add_error_handlers(app)
    read_json = _JsonReader(max_body_bytes, body_timeout_s)
    retry_after = functools.partial(clock.retry_after, worker)
    serving = _Serving(engine, worker, names, default_mode, max_queue, read_json, _next_event, retry_after, compiler)
    _add_model_routes(app, names, engine)
    _add_chat_route(app, serving)
    _add_completions_route(app, serving)
    add_token_routes(app, serving)
    _add_service_routes(app, names, worker, metrics)
    return app


class _ServiceClock:
    """A running mean of a request's service time, which a 429's ``Retry-After`` is reckoned from, and what
    each finished request tells the metrics."""

    def __init__(self, max_active: int) -> None:
        self.max_active, self.service_s = max_active, 1.0

    def observe(self, job: Job, out: GenerationOutput, metrics: ServerMetrics) -> None:
        request = job.request  # its timestamps: arrival, start, first token, end
        started, first, ended = request.started, request.first_token, request.finished
        assert started is not None and first is not None and ended is not None
        reason = "cancelled" if out.finish_reason == "cancelled" else finish_reason(out)
        mode = job.prepared.options.mode
        metrics.record(
            mode, out.stats, first - request.arrival, ended - request.arrival, reason, started - request.arrival
        )
        self.service_s = 0.8 * self.service_s + 0.2 * (ended - started)

    def retry_after(self, worker: EngineWorker) -> int:
        return max(1, math.ceil(self.service_s * (worker.queue.qsize() + 1) / self.max_active))


class _Compiler:
    """The threads a request is prepared on (``Engine.prepare_chat``, ``Engine.prepare``: its template rendered, its
    pieces tokenized, its output grammar compiled), within ``COMPILE_TIMEOUT_S``: a prompt past the context or a
    schema the grammar cannot hold is a 400 naming the field before the request is queued, and neither the engine
    nor the event loop waits on the preparing."""

    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(COMPILE_THREADS, thread_name_prefix="hypic-prepare")

    async def __call__(self, prepare: Callable[[], T]) -> T:
        try:
            ready = asyncio.get_running_loop().run_in_executor(self.pool, prepare)
            return await asyncio.wait_for(ready, COMPILE_TIMEOUT_S)
        except TimeoutError:
            raise APIError(
                400, f"the output grammar took over {COMPILE_TIMEOUT_S:g} s to build: simplify the schema"
            ) from None
        except ValueError as exc:
            raise from_value_error(exc) from None

    def shutdown(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


class _JsonReader:
    """A request's JSON body, read whole within ``timeout_s`` and ``max_bytes``: a form or a slow or oversized
    body is refused before it is parsed."""

    def __init__(self, max_bytes: int, timeout_s: float) -> None:
        self.max_bytes, self.timeout_s = max_bytes, timeout_s

    async def __call__(self, request: Request) -> Any:
        media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if media != "application/json" and not media.endswith("+json"):
            # a form or text/plain body is what a page on any origin may send without a CORS preflight
            raise APIError(
                415,
                f"the request body must be JSON sent as Content-Type: application/json, not {media or 'none'}",
                code="unsupported_media_type",
            )
        return parse(await read_body(request, self.max_bytes, self.timeout_s))


async def _next_event(job: Job, request: Request) -> tuple[str, Any]:
    """The job's next event; a client gone meanwhile cancels it (``_Gone``)."""
    while True:
        try:
            return await asyncio.wait_for(job.events.get(), POLL_S)
        except TimeoutError:
            if await request.is_disconnected():
                job.cancel()
                raise _Gone from None


def _add_middleware(app: FastAPI, api_key: str | None, allowed_origins: Sequence[str], metrics: ServerMetrics) -> None:
    if api_key is not None:
        app.add_middleware(_RequireKey, key=api_key)
    if allowed_origins:
        from starlette.middleware.cors import CORSMiddleware

        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(allowed_origins),
            allow_methods=["GET", "POST", "OPTIONS"],
            allow_headers=["*"],
            expose_headers=[IGNORED_HEADER],
        )
    app.add_middleware(_CountRequests, metrics=metrics)


def _add_error_handlers(app: FastAPI) -> None:
    """Every error as OpenAI's error body: ours, Starlette's (a 404, a 405) and a bug's (a 500)."""

    @app.exception_handler(APIError)
    async def api_error(_: Request, exc: APIError) -> JSONResponse:
        return _error(exc)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return _error(APIError(exc.status_code, str(exc.detail), type=kind))

    @app.exception_handler(Exception)
    async def bug(_: Request, exc: Exception) -> JSONResponse:
        return _error(_as_api_error(exc, 1))


def _add_service_routes(app: FastAPI, names: list[str], worker: EngineWorker, metrics: ServerMetrics) -> None:
    @app.get("/health")
    async def health() -> JSONResponse:
        """``ok``, or ``degraded`` (still a 200: answers go on, computed without it) while a persistent cache
        tier cannot be reached, with the reason; a 500 when the engine has stopped."""
        if not worker.alive:
            raise APIError(500, "the engine worker has stopped", type="server_error")
        tiers = await asyncio.to_thread(worker.engine.segment_store.check_tiers)
        down = {f"{name}_tier": reason for name, reason in tiers.items() if reason is not None}
        body: dict[str, Any] = {"status": "degraded" if down else "ok", "model": names[0]}
        body["queue_depth"] = worker.queue.qsize()
        if down:
            body["degraded"] = down
        return JSONResponse(body)

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")


async def _stream(
    job: Job, first: Any, model: str, tools: bool, include_usage: bool, engine: Engine
) -> AsyncIterator[bytes]:
    """The answer as server-sent events in OpenAI's chunk shape; closing it (the client left) cancels the job."""
    request_id, created = completion_id(), int(time.time())
    setup = engine.chat_setup
    assert setup is not None
    split = AnswerStream(
        setup.format,
        thinking_open=first.thinking_open,
        tools=tools,
        answer_prefix=first.answer_prefix,
        exact=first.exact_content,
        calls=first.call_streaming,
    )

    def piece(kind: str, payload: Any) -> bytes:
        if kind == CALL:
            delta = {"tool_calls": [payload]}
        else:
            delta = {"content" if kind == CONTENT else "reasoning_content": payload}
        return sse(chunk(request_id, model, created, delta, include_usage=include_usage))

    try:
        yield sse(chunk(request_id, model, created, {"role": "assistant", "content": ""}, include_usage=include_usage))
        while True:
            kind, payload = await job.events.get()
            if kind is Event.DELTA:
                for part, text in split.feed(payload):
                    yield piece(part, text)
            elif kind is Event.DONE:
                out: GenerationOutput = unique_call_ids(payload)
                parsed = ParsedOutput(out.text or "", out.reasoning, out.tool_calls, out.partial_call)
                for part, text in split.finish(parsed):
                    yield piece(part, text)
                for part, call in split.finish_calls(wire_tool_calls(out, streamed=True)):
                    yield piece(part, call)
                # Log-probabilities come with the last chunk: the deltas before it are not cut at tokens.
                logprobs = chat_logprobs(out, token_bytes(engine)) if out.logprobs is not None else None
                reason = finish_reason(out)
                yield sse(chunk(request_id, model, created, {}, reason, include_usage=include_usage, logprobs=logprobs))
                if include_usage:
                    yield sse(usage_chunk(request_id, model, created, out))
                yield sse("[DONE]")
                return
            elif kind is Event.ERROR:
                yield sse(_as_api_error(payload, 1).body())
                return
    finally:
        job.cancel()  # a no-op once done; stops the generation when the client has gone


@dataclass(frozen=True)
class _Serving:
    """What the routes added outside ``create_app`` share with it."""

    engine: Engine
    worker: EngineWorker
    names: list[str]
    default_mode: str
    max_queue: int
    read_json: Callable[[Request], Awaitable[Any]]
    next_event: Callable[[Job, Request], Awaitable[tuple[str, Any]]]
    retry_after: Callable[[], int]
    compiled: _Compiler

    def check_model(self, model: str) -> None:
        if model not in self.names:
            raise APIError(
                404, f"model {model!r} is not served here; try {self.names[0]!r}", param="model", code="model_not_found"
            )

    def submit(self, job: Job) -> None:
        try:
            self.worker.submit(job)
        except QueueFull:
            raise APIError(
                429,
                f"the server is busy: {self.max_queue} requests are already waiting",
                type="rate_limit_error",
                headers={"Retry-After": str(self.retry_after())},
            ) from None

    async def event(self, job: Job, request: Request) -> tuple[str, Any]:
        """The job's next event; an error event raised as the API error it is."""
        kind, payload = await self.next_event(job, request)
        if kind is Event.ERROR:
            raise _as_api_error(payload, self.retry_after())
        return kind, payload

    async def done(self, job: Job, request: Request, kind: str, payload: Any) -> Any:
        """The job's answer, awaited from its event ``kind``/``payload`` on."""
        while kind is not Event.DONE:
            kind, payload = await self.event(job, request)
        return payload


def _add_chat_route(app: FastAPI, serving: _Serving) -> None:
    """``POST /v1/chat/completions``: one job (``Engine.start_chat``), answered whole or streamed."""

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        body = parse_request(await serving.read_json(request))
        serving.check_model(body.model)
        engine = serving.engine
        arguments = engine_arguments(body, serving.default_mode, engine.chat_format)
        job = Job(await serving.compiled(partial(engine.prepare_chat, **arguments)), asyncio.get_running_loop())
        ignored = {IGNORED_HEADER: ignored_header_value(body.ignored_fields)} if body.ignored_fields else {}
        serving.submit(job)
        streaming = False
        try:
            kind, payload = await serving.event(job, request)
            if body.stream:
                streaming = True  # from here the stream owns the job
                include_usage = bool(body.stream_options and body.stream_options.include_usage)
                return StreamingResponse(
                    _stream(job, payload, serving.names[0], bool(body.tools), include_usage, engine),
                    media_type="text/event-stream",
                    headers={"Cache-Control": "no-cache", **ignored},
                )
            out = await serving.done(job, request, kind, payload)
            answer = completion(unique_call_ids(out), serving.names[0], completion_id(), token_bytes(engine))
            if body.ignored_fields:
                answer["hypic"]["ignored_fields"] = body.ignored_fields
            return JSONResponse(finite(answer), headers=ignored)
        except _Gone:
            return Response(status_code=499)
        finally:
            if not streaming:
                job.cancel()  # a no-op once done; stops the work of a request that failed or was left


def _add_model_routes(app: FastAPI, names: list[str], engine: Engine) -> None:
    """One model, listed once under its first name; the others are its ``aliases``, which ``/v1/models/{id}`` and
    every request accept too. ``max_model_len`` is its context (vLLM's name for it), prompt and answer together."""

    def entry() -> dict[str, Any]:
        return {
            "id": names[0],
            "object": "model",
            "created": created,
            "owned_by": "hypic-rag",
            "root": engine.name,
            "max_model_len": engine.preparer.context,
            "aliases": names[1:],
        }

    created = int(time.time())

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [entry()]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> dict[str, Any]:
        if model_id not in names:
            raise APIError(404, f"model {model_id!r} is not served here", param="model", code="model_not_found")
        return entry()

    @app.get("/version")
    async def server_version() -> dict[str, str]:
        return {"version": version("hypic-rag")}


def _add_completions_route(app: FastAPI, serving: _Serving) -> None:
    """``POST /v1/completions``: each prompt a job of its own (``Engine.start``), answered together."""

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = parse_completion_request(await serving.read_json(request))
        serving.check_model(body.model)
        loop = asyncio.get_running_loop()
        each = [completion_arguments(body, prompt, serving.default_mode) for prompt in prompts(body, serving.max_queue)]
        prepared = await serving.compiled(lambda: [serving.engine.prepare(**arguments) for arguments in each])
        jobs = [Job(one, loop) for one in prepared]
        ignored = {IGNORED_HEADER: ignored_header_value(body.ignored_fields)} if body.ignored_fields else {}
        submitted: list[Job] = []
        streaming = False
        try:
            for job in jobs:
                serving.submit(job)
                submitted.append(job)
            # every prompt's first event before the status: an error in any is a 4xx
            firsts = [await serving.event(job, request) for job in jobs]
            if body.stream:
                streaming = True
                include_usage = bool(body.stream_options and body.stream_options.include_usage)
                return StreamingResponse(
                    _text_stream(jobs, firsts, serving, include_usage),
                    media_type="text/event-stream",
                    headers={"Cache-Control": "no-cache", **ignored},
                )
            outs = [await serving.done(job, request, *first) for job, first in zip(jobs, firsts, strict=True)]
            answer = text_completion(outs, serving.names[0], text_completion_id(), token_bytes(serving.engine))
            return JSONResponse(finite(answer), headers=ignored)
        except _Gone:
            return Response(status_code=499)
        finally:
            if not streaming:
                for job in submitted:
                    job.cancel()


async def _text_stream(
    jobs: list[Job], firsts: list[tuple[str, Any]], serving: _Serving, include_usage: bool
) -> AsyncIterator[bytes]:
    """Each prompt's text as it is chosen, prompt after prompt (they decode together), in OpenAI's chunks."""
    request_id, created, model = text_completion_id(), int(time.time()), serving.names[0]
    outs = []
    try:
        for index, (job, (kind, payload)) in enumerate(zip(jobs, firsts, strict=True)):
            while kind is not Event.DONE:
                kind, payload = await job.events.get()
                if kind is Event.DELTA:
                    yield sse(text_chunk(request_id, model, created, index, payload))
                elif kind is Event.ERROR:
                    yield sse(_as_api_error(payload, 1).body())
                    return
            out: GenerationOutput = payload
            outs.append(out)
            final = choice(index, out, token_bytes(serving.engine))
            yield sse(text_chunk(request_id, model, created, index, "", final["finish_reason"], final["logprobs"]))
        if include_usage:
            total = text_completion(outs, model, request_id, token_bytes(serving.engine))
            tail = {"id": request_id, "object": "text_completion", "created": created, "model": model, "choices": []}
            yield sse({**tail, "usage": total["usage"]})
        yield sse("[DONE]")
    finally:
        for job in jobs:
            job.cancel()
