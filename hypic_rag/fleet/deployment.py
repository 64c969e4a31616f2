"""The fleet as a Ray Serve application: ``EngineReplica`` deployments (each an engine and the server's own app)
behind one ``Ingress`` that computes a request's segment keys and lets ``SegmentAffinityRouter`` pick the replica.

    from ray import serve
    from hypic_rag.fleet import build_app
    serve.run(build_app("path/to/checkpoint", replicas=4, cache_url="redis://10.0.0.5:6379"), route_prefix="/")

or ``serve deploy examples/serve_config.yaml`` (``app_builder``) on a cluster of your own.

Each replica runs ``server.app.create_app``'s app in-process (``asgi.py``), so routes, limits, errors, the API key
and streaming are the single server's. The ingress answers ``/metrics`` (every replica's, labelled and summed,
with the routing counters) and ``/fleet`` (what it believes each replica holds) itself and forwards the rest.

A replica that dies before a request's first byte came back costs nothing: the request is sent once more, to
another replica (``retried``). One that dies mid-stream ends that stream with an error event whose ``code`` is
``replica_failed`` (``retryable``: send it again); a non-streamed request has no first byte before its answer,
so it is always retried. Ray Serve starts a new replica in the dead one's place, and the router forgets what the
dead one held.
"""

# No ``from __future__ import annotations``: Serve rebinds the routes, and FastAPI must still resolve their hints.
import asyncio
import json
import logging
import math
import os
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CollectorRegistry
from prometheus_client import Counter as PromCounter
from prometheus_client import Gauge as PromGauge
from ray import serve
from ray.exceptions import ActorUnavailableError, RayActorError
from ray.serve.config import AutoscalingConfig, RequestRouterConfig
from ray.serve.handle import DeploymentHandle

from ..defaults import MAX_ACTIVE, MAX_QUEUE
from ..server.door import bearer_matches, cors_headers, key_refused, needs_key, parse, read_body
from ..server.limits import BODY_TIMEOUT_S
from ..server.protocol import APIError
from .asgi import Head, call
from .keys import KeySpec, RequestKeys
from .metrics import render, texts_of
from .router import SegmentAffinityRouter, routers
from .routing import BURST, EPSILON, POLICIES, make_policy

log = logging.getLogger(__name__)

REPLICA_FAILED = (RayActorError, ActorUnavailableError)
STATS_PERIOD_S = 1.0  # how often each replica reports its keys and metrics to the router
REPORTED_KEYS = 8192  # a replica reports at most its most recently used keys
APP_OPTIONS = (
    "model_names",
    "default_mode",
    "max_queue",
    "max_active",
    "max_num_batched_tokens",
    "max_body_bytes",
    "queue_timeout_s",
    "body_timeout_s",
    "api_key",
    "allowed_origins",
    "shadow_rate",
)
# Ray Serve's own routers, for comparison (``eval.bench.fleet``): its default, and ``ray.serve.llm``'s prefix router
# (imported by its module path: the public ``ray.serve.llm`` also imports what only its LLM servers need).
RAY_ROUTERS = {
    "power_of_two": "ray.serve._private.request_router.PowerOfTwoChoicesRequestRouter",
    "prefix": "ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router.PrefixCacheAffinityRouter",
}
KEYED = ("/v1/chat/completions", "/v1/completions")  # the routes whose requests carry segments
KEYING_THREADS = 2
KEYED_BODY_BYTES = 1 << 20  # a larger body is routed by load alone (it is past any context anyway)
METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD"]
HOP_BY_HOP = {"content-length", "transfer-encoding", "connection"}


@dataclass(frozen=True)
class ChatText:
    """A chat request's messages, as Ray's prefix router reads them from a routed call's arguments."""

    messages: Any


@dataclass(frozen=True)
class PromptText:
    """A completion request's prompt (or "" for a body that is not one), read the same way. A class of its own:
    Ray's router takes ``messages`` whenever the argument has that attribute, even None."""

    prompt: Any


def request_text(body: bytes) -> ChatText | PromptText:
    """What Ray's prefix router matches of a request body: a chat's messages, or a completion's prompt."""
    try:
        parsed = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return PromptText("")
    if isinstance(parsed, dict) and parsed.get("messages") is not None:
        return ChatText(parsed["messages"])
    return PromptText(parsed.get("prompt", "") if isinstance(parsed, dict) else "")


def default_autoscaling(max_replicas: int, max_active: int = MAX_ACTIVE) -> dict[str, Any]:
    """Ray Serve's autoscaling for a fleet of at most ``max_replicas``: one replica kept, a new one added once
    replicas average more than half a decode batch (``max_active``) in flight, so a replica is added before
    requests queue behind a full batch."""
    return {
        "min_replicas": 1,
        "max_replicas": max_replicas,
        "target_ongoing_requests": max(1, max_active // 2),
    }


class EngineReplica:
    """One engine and the server's app on it; Ray Serve runs ``replicas`` of them."""

    def __init__(
        self,
        model: str | None,
        engine_options: Mapping[str, Any],
        app_options: Mapping[str, Any],
        threads: int | None = None,
    ) -> None:
        import torch

        from ..engine import Engine
        from ..server.app import create_app

        if threads:
            torch.set_num_threads(threads)
        self.engine = Engine.from_pretrained(model, **engine_options)
        self.app = create_app(self.engine, **app_options)
        self.app.state.worker.start()  # the app's lifespan does this under uvicorn; nothing runs it here
        self.replica = serve.get_replica_context().replica_id.unique_id
        self.reports = 0

    async def handle(
        self,
        method: str,
        path: str,
        query: str,
        headers: list[tuple[str, str]],
        body: bytes,
        text: ChatText | PromptText | None = None,
        keys: Any = (),
    ) -> AsyncIterator[Head | bytes]:
        """The app's response to one request: its head (with this replica's id added), then its body. ``text`` and
        ``keys`` are for the router, which reads them from the call."""
        async for part in call(self.app, method, path, query, headers, body):
            if isinstance(part, dict):
                part["headers"].append(("x-hypic-replica", self.replica))
            yield part

    def describe(self) -> dict[str, Any]:
        """What the ingress needs to compute the keys this replica files segments under."""
        return {
            "fingerprint": self.engine.fingerprint,
            "dtype": str(self.engine.model.dtype),
            "min_cached_tokens": self.engine.min_cached_tokens,
            "replica": self.replica,
            "pid": os.getpid(),
        }

    def record_routing_stats(self) -> dict[str, Any]:
        """Ray Serve hands this to the ingress's router every ``STATS_PERIOD_S``."""
        self.reports += 1
        keys = self.engine.segment_store.memory_keys()[-REPORTED_KEYS:]
        return {
            "seq": self.reports,
            "keys": keys,
            "metrics": self.app.state.metrics.render().decode(),
            "replica": self.replica,
            "pid": os.getpid(),
        }

    def __del__(self) -> None:
        worker = getattr(getattr(getattr(self, "app", None), "state", None), "worker", None)
        if worker is not None:
            worker.stop()


fleet_api = FastAPI(title="hypic-rag fleet", docs_url=None, redoc_url=None, openapi_url=None)


@serve.ingress(fleet_api)
class Ingress:
    """The fleet's one HTTP entry: keys each chat request, forwards it, merges what comes back."""

    def __init__(
        self,
        replicas: DeploymentHandle,
        checkpoint: str,
        default_mode: str = "hypic",
        max_body_bytes: int = 8 << 20,
        api_key: str | None = None,
        send_text: bool = False,
        body_timeout_s: float = BODY_TIMEOUT_S,
        allowed_origins: tuple[str, ...] = (),
    ) -> None:
        self.replicas, self.checkpoint, self.default_mode = replicas, checkpoint, default_mode
        self.max_body_bytes, self.api_key, self.send_text = max_body_bytes, api_key, send_text
        self.body_timeout_s, self.allowed_origins = body_timeout_s, tuple(allowed_origins)
        # parsing and tokenizing a body for its keys, off the event loop, a few at a time
        self.keying = ThreadPoolExecutor(KEYING_THREADS, thread_name_prefix="hypic-keys")
        self.keys: RequestKeys | None = None
        self.keys_ready = asyncio.Lock()
        self.registry = CollectorRegistry()
        self.outcomes = PromCounter(
            "hypic_fleet_requests",
            "Requests by outcome: answered, retried (on another replica), broken (mid-stream), failed",
            ["outcome"],
            registry=self.registry,
        )
        self.routed = PromGauge(
            "hypic_fleet_routed", "Requests routed to each replica, by why it ranked first", ["replica", "reason"]
        )
        self.believed = PromGauge("hypic_fleet_believed_keys", "Segment keys believed held, by replica", ["replica"])
        self.inflight = PromGauge("hypic_fleet_inflight", "Requests in flight, by replica", ["replica"])
        for gauge in (self.routed, self.believed, self.inflight):
            self.registry.register(gauge)
        self.counts: Counter[str] = Counter()

    async def _request_keys(self, path: str, body: bytes) -> list[str]:
        """The segment keys of a keyed route's request, parsed and tokenized on the keying threads. No keys for a body
        the replica will refuse (not JSON, nested too deep: it answers the 400 or 415 itself), nor for one past
        ``KEYED_BODY_BYTES``: such a body is routed by load alone, and cannot hold the threads back for the others."""
        if path not in KEYED:
            return []
        async with self.keys_ready:
            if self.keys is None:
                described = await self.replicas.describe.remote()
                self.keys = RequestKeys(self.checkpoint, KeySpec.of(described), self.default_mode)
        keys = self.keys
        chat = path == "/v1/chat/completions"

        def work() -> list[str]:
            if len(body) > KEYED_BODY_BYTES:
                return []
            try:
                parsed = parse(body)
            except APIError:
                return []
            if not isinstance(parsed, dict):
                return []
            return keys.of_body(parsed) if chat else keys.of_completion_body(parsed)

        return await asyncio.get_running_loop().run_in_executor(self.keying, work)

    def _text(self, body: bytes) -> ChatText | PromptText | None:
        """The request's messages or prompt for a router that reads text (Ray's prefix router), else None."""
        if not self.send_text:
            return None
        return request_text(body)

    def _authorised(self, headers: Mapping[str, str]) -> bool:
        if self.api_key is None:
            return True
        return bearer_matches(headers.get("authorization", "").encode("latin-1"), self.api_key.encode())

    def _router(self) -> SegmentAffinityRouter | None:
        found = routers()
        if not found:
            return None
        found[0].refresh()
        return found[0]

    @fleet_api.get("/metrics")
    async def metrics(self) -> Response:
        router = self._router()
        if router is not None:
            for (replica, reason), n in router.reasons.items():
                self.routed.labels(replica, reason).set(n)
            for replica in router.reports:
                self.believed.labels(replica).set(router.policy.believed(replica))
                self.inflight.labels(replica).set(router.inflight.get(replica, 0))
        texts = texts_of(router.reports) if router is not None else {}
        return Response(render(texts, self.registry), media_type="text/plain; version=0.0.4; charset=utf-8")

    @fleet_api.get("/fleet")
    async def fleet(self, request: Request) -> JSONResponse:
        """What the router believes: each replica's pid, keys reported and believed, requests in flight."""
        if not self._authorised(request.headers):
            return JSONResponse({"error": {"message": "a valid API key is needed"}}, status_code=401)
        router = self._router()
        replicas = []
        for rid, report in sorted((router.reports if router else {}).items()):
            replicas.append(
                {
                    "replica": rid,
                    "pid": report.get("pid"),
                    "reported_keys": len(report.get("keys", ())),
                    "believed_keys": router.policy.believed(rid),
                    "inflight": router.inflight.get(rid, 0),
                }
            )
        policy = router.policy.name if router else None
        return JSONResponse({"policy": policy, "replicas": replicas, "requests": dict(self.counts)})

    @fleet_api.api_route("/{path:path}", methods=METHODS)
    async def forward(self, request: Request, path: str) -> Response:
        """The single server's front door (``server.door``) first, here: the key before the body, the body within
        its deadline and limit, its JSON parsed and keyed off the event loop; then the request goes to a replica."""
        try:
            if needs_key("/" + path, request.method) and not self._authorised(request.headers):
                raise key_refused()  # before a byte of the body: a caller without the key holds nothing
            body = await read_body(request, self.max_body_bytes, self.body_timeout_s)
            keys = await self._request_keys("/" + path, body)
        except APIError as exc:
            cors = cors_headers(request.headers.get("origin"), self.allowed_origins)
            return JSONResponse(exc.body(), status_code=exc.status, headers={**exc.headers, **cors})
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP]
        args = (request.method, "/" + path, request.url.query, headers, body, self._text(body))
        for attempt in range(2):
            stream = self.replicas.options(stream=True).handle.remote(*args, keys=keys)
            try:
                head = await stream.__anext__()
            except REPLICA_FAILED as exc:
                log.warning("a replica failed before answering (%s); %s", type(exc).__name__, ("retrying", "")[attempt])
                self._count("retried" if attempt == 0 else "failed")
                continue
            response = StreamingResponse(self._relay(stream, head), status_code=head["status"])
            response.raw_headers = [
                (k.encode("latin-1"), v.encode("latin-1")) for k, v in head["headers"] if k.lower() not in HOP_BY_HOP
            ]
            return response
        body_out = {
            "error": {
                "message": "no replica could answer: the one chosen failed, and so did the retry; try again",
                "type": "server_error",
                "code": "replica_failed",
            }
        }
        return JSONResponse(body_out, status_code=503, headers={"Retry-After": "1"})

    async def _relay(self, stream: Any, head: Head) -> AsyncIterator[bytes]:
        finished = False
        sse = any(k.lower() == "content-type" and "text/event-stream" in v for k, v in head["headers"])
        try:
            async for chunk in stream:
                yield chunk
            finished = True
            self._count("answered")
        except REPLICA_FAILED as exc:
            finished = True
            self._count("broken")
            if sse:
                error = {
                    "message": f"the replica serving this stream failed ({type(exc).__name__}); send the request again",
                    "type": "server_error",
                    "code": "replica_failed",
                    "retryable": True,
                }
                yield f"data: {json.dumps({'error': error})}\n\n".encode()
                yield b"data: [DONE]\n\n"
        finally:
            if not finished:
                stream.cancel()  # the client went away: the replica's app hears it and stops generating

    def _count(self, outcome: str) -> None:
        self.counts[outcome] += 1
        self.outcomes.labels(outcome).inc()


def build_app(
    model: str | None = None,
    *,
    replicas: int = 2,
    autoscaling: Mapping[str, Any] | None = None,
    policy: str = "affinity",
    epsilon: float = EPSILON,
    burst: float = BURST,
    threads: int | None = None,
    replica_cpus: float = 1.0,
    stats_period_s: float = STATS_PERIOD_S,
    name: str | None = None,
    default_mode: str = "hypic",
    max_queue: int = MAX_QUEUE,
    max_active: int = MAX_ACTIVE,
    api_key: str | None = None,
    **options: Any,
) -> serve.Application:
    """The fleet as a ``serve.run``-able application: ``replicas`` engines of ``model`` (None: the bundled
    model), or as many as ``autoscaling`` (Ray Serve's ``AutoscalingConfig`` fields; ``default_autoscaling``
    gives ours) asks for. ``policy``: ``affinity`` (``routing.py``), ``round_robin`` or ``random``, or one of Ray
    Serve's routers to compare with (``power_of_two``, its default; ``prefix``, ``ray.serve.llm``'s prefix-cache
    affinity; ``/metrics`` and ``/fleet`` then lack what only ours reports); ``threads``:
    each replica's torch threads; ``options``: the server's (``create_app``) and the engine's
    (``Engine.from_pretrained``: ``cache_url`` for the shared Redis tier the fleet falls back on, ...)."""
    from ..hub import resolve_checkpoint

    if policy not in POLICIES and policy not in RAY_ROUTERS:
        known = ", ".join((*POLICIES, *RAY_ROUTERS))
        raise ValueError(f"unknown routing policy {policy!r}; expected one of {known}")
    if policy in POLICIES:
        make_policy(policy, epsilon, burst=burst)  # its slacks refused here, not in the router at the first request
    if replicas < 1 and autoscaling is None:
        raise ValueError(f"replicas must be >= 1, got {replicas}")
    if not stats_period_s > 0 or not math.isfinite(stats_period_s):
        raise ValueError(f"stats_period_s must be a positive number of seconds, got {stats_period_s}")
    checkpoint = str(resolve_checkpoint(model, options.pop("revision", None)))
    app_options = {k: options.pop(k) for k in APP_OPTIONS if k in options}
    app_options.update(default_mode=default_mode, max_queue=max_queue, max_active=max_active, api_key=api_key)
    app_options["model_names"] = [name or model or "hypic-default"]
    if api_key is not None and not api_key:
        raise ValueError("api_key must not be empty (leave it None for no key)")
    scaling: dict[str, Any] = {}
    if autoscaling is not None:
        scaling["autoscaling_config"] = AutoscalingConfig(**autoscaling)
    else:
        scaling["num_replicas"] = replicas
    ours = f"{SegmentAffinityRouter.__module__}.{SegmentAffinityRouter.__qualname__}"
    router = RequestRouterConfig(
        # by import path, so the router is this module's class (and registers where the ingress can read it)
        request_router_class=RAY_ROUTERS.get(policy, ours),
        request_router_kwargs={"policy": policy, "epsilon": epsilon, "burst": burst}
        if policy not in RAY_ROUTERS
        else {},
        request_routing_stats_period_s=stats_period_s,
        request_routing_stats_timeout_s=max(30.0, 10 * stats_period_s),
    )
    engine_replica = serve.deployment(
        EngineReplica,
        name="EngineReplica",
        # the server's own queue answers 429 past max_queue, as one process does; Serve must not hold requests first
        max_ongoing_requests=max_queue + max_active,
        ray_actor_options={"num_cpus": replica_cpus},
        request_router_config=router,
        health_check_period_s=5,
        **scaling,
    )
    ingress = serve.deployment(Ingress, name="Ingress", max_ongoing_requests=4096, ray_actor_options={"num_cpus": 0})
    return ingress.bind(
        engine_replica.bind(model, options, app_options, threads),
        checkpoint,
        default_mode,
        app_options.get("max_body_bytes", 8 << 20),
        api_key,
        policy == "prefix",
        app_options.get("body_timeout_s", BODY_TIMEOUT_S),
        tuple(app_options.get("allowed_origins") or ()),
    )


def app_builder(args: Mapping[str, Any]) -> serve.Application:
    """``build_app`` for a Serve config file (``import_path: hypic_rag.fleet.deployment:app_builder``), its
    ``args`` being ``build_app``'s keywords (``model`` among them; the API key from ``$HYPIC_API_KEY`` unless
    given); ``examples/serve_config.yaml`` is one."""
    options = dict(args)
    unknown = sorted(k for k in ("autoscaling_config", "num_replicas") if k in options)
    if unknown:
        raise ValueError(f"{', '.join(unknown)}: give replicas or autoscaling in args instead")
    options.setdefault("api_key", os.environ.get("HYPIC_API_KEY") or None)  # kept out of the file
    return build_app(options.pop("model", None), **options)
