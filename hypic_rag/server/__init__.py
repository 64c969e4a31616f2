"""``hypic-rag serve``: the OpenAI chat-completions and completions API on the engine (FastAPI + uvicorn), with
Prometheus metrics. Needs the ``server`` extra."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..defaults import MAX_ACTIVE, MAX_NUM_BATCHED_TOKENS, MAX_QUEUE, QUEUE_TIMEOUT_S
from .app import create_app
from .startup import bind, report_tier

__all__ = ["create_app", "serve"]

GRACE_S = 5.0  # after SIGTERM, how long open answers may finish before they are cut and the server exits


def serve(
    model: str | None = None,
    *,
    name: str | None = None,
    host: str = "127.0.0.1",
    port: int = 8000,
    cache_dir: str | None = None,
    cache_url: str | None = None,
    mode: str = "hypic",
    max_queue: int = MAX_QUEUE,
    max_active: int = MAX_ACTIVE,
    max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS,
    queue_timeout_s: float = QUEUE_TIMEOUT_S,
    log_level: str = "info",
    api_key: str | None = None,
    allowed_origins: Sequence[str] = (),
    shadow_rate: float = 0.0,
    **engine_options: Any,
) -> None:
    """Load ``model`` (a checkpoint directory, a hub id, or None for the bundled model) and serve it, as ``name``
    (default: ``model``, or ``hypic-default``), until interrupted. SIGTERM lets open answers run ``GRACE_S``
    seconds, cuts the rest and exits."""
    import uvicorn

    from ..cache.remote import redacted
    from ..engine import Engine

    sock = bind(host, port)  # a busy port is refused before the model loads
    engine = Engine.from_pretrained(model, cache_dir=cache_dir, cache_url=cache_url, **engine_options)
    shown = redacted(cache_url) if cache_url is not None else None
    report_tier(
        shown, lambda: engine.segment_store.check_tiers().get("remote"), engine.segment_store.secret is not None
    )
    names = [name or model or "hypic-default"]
    app = create_app(
        engine,
        model_names=names,
        default_mode=mode,
        max_queue=max_queue,
        max_active=max_active,
        max_num_batched_tokens=max_num_batched_tokens,
        queue_timeout_s=queue_timeout_s,
        api_key=api_key,
        allowed_origins=allowed_origins,
        shadow_rate=shadow_rate,
    )
    print(f"hypic-rag: serving {names[0]!r} ({engine.name}, mode {mode}) on http://{host}:{port}/v1", flush=True)
    config = uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=GRACE_S)
    uvicorn.Server(config).run(sockets=[sock])
