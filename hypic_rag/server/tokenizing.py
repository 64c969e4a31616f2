"""``POST /tokenize`` and ``POST /detokenize``, as vLLM's and llama.cpp's servers offer them: a client counts a
prompt's tokens before it sends it.

A chat body (``messages``, with ``tools``, ``tool_choice`` and the ``hypic`` options a chat request takes) is
prepared exactly as ``/v1/chat/completions`` would prepare it (template, segments, a forced call's opening), and
a ``prompt`` as ``/v1/completions`` cuts and tokenizes one; the ids are the ones the model would run. Both run
on the server's preparing threads, within their deadline, never on the engine's.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from fastapi import FastAPI, Request
from pydantic import StrictInt

from ..engine import Engine
from .completions import prompt_segments
from .protocol import APIError, _Open, engine_arguments, parse_request, validated

CHAT_ONLY = ("tools", "tool_choice", "parallel_tool_calls", "chat_template_kwargs")


class DetokenizeRequest(_Open):
    model: str | None = None
    tokens: list[StrictInt]  # true is not token 1


def tokenize_body(data: Any, model: str) -> tuple[str, Any]:
    """``("messages", chat request)`` or ``("prompt", text)`` of a ``/tokenize`` body; one of the two, else a 400.
    ``model``: the name a body without one is read under."""
    if not isinstance(data, dict):
        raise APIError(400, "the request body must be a JSON object")
    given = [field for field in ("messages", "prompt") if data.get(field) is not None]
    if len(given) != 1:
        raise APIError(400, "give messages (tokenized as a chat request) or prompt (as a completion), one of them")
    if given == ["messages"]:
        return "messages", parse_request({"model": model, **data})
    prompt = data["prompt"]
    if not isinstance(prompt, str) or not prompt:
        raise APIError(400, "prompt must be a non-empty string", param="prompt")
    chat_only = sorted(k for k in CHAT_ONLY if data.get(k) is not None)
    if chat_only:
        raise APIError(400, f"a prompt has no chat template: {', '.join(chat_only)} apply to messages only")
    return "prompt", prompt


def prompt_ids(engine: Engine, kind: str, body: Any, default_mode: str) -> list[int]:
    """The ids the model would run for the body ``tokenize_body`` read (a ``ValueError`` where it could not)."""
    if kind == "prompt":
        return engine.build_prompt(*prompt_segments(body)).ids
    arguments = engine_arguments(body, default_mode, engine.chat_format)
    prepared = engine.preparer.chat(
        arguments["messages"],
        arguments["options"],
        arguments["tools"],
        arguments["tool_choice"],
        arguments["parallel_tool_calls"],
        compile=False,  # the ids do not depend on the answer's grammar
    )
    return prepared.prompt.ids


def add_token_routes(app: FastAPI, serving: Any) -> None:
    """The two routes on ``serving`` (``app._Serving``: the engine, the names, the body reader, the threads)."""
    engine: Engine = serving.engine
    context = engine.preparer.context

    @app.post("/tokenize")
    async def tokenize(request: Request) -> dict[str, Any]:
        data = await serving.read_json(request)
        model = data.get("model") if isinstance(data, dict) else None
        if model is not None:
            serving.check_model(model)
        kind, body = tokenize_body(data, serving.names[0])
        ids = await serving.compiled(partial(prompt_ids, engine, kind, body, serving.default_mode))
        return {"count": len(ids), "max_model_len": context, "tokens": ids}

    @app.post("/detokenize")
    async def detokenize(request: Request) -> dict[str, Any]:
        body = validated(DetokenizeRequest, await serving.read_json(request))
        if body.model is not None:
            serving.check_model(body.model)
        vocab = engine.preparer.vocab_size
        if len(body.tokens) > context:
            raise APIError(400, f"tokens holds {len(body.tokens)} ids, over the context of {context}", param="tokens")
        bad = next((t for t in body.tokens if not 0 <= t < vocab), None)
        if bad is not None:
            raise APIError(400, f"token {bad} is outside the vocabulary (0..{vocab - 1})", param="tokens")
        return {"prompt": engine.decode(body.tokens)}
