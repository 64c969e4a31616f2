"""The legacy completions wire format (``POST /v1/completions``): a prompt string (or token ids, or a list of
either, one answer each) continued as it is, with no chat template, through ``Engine.start``.

The prompt is cut where a chat prompt's plain content is cut (``segmentation.flat_units``: paragraphs are
segments, header lines and blank lines glue, the last paragraph the query), so that documents pasted into a
flat prompt are cached and found again in any order, as in a chat request.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from pydantic import StrictInt

from ..chat.segmentation import flat_prompt
from ..options import OPTIONS, SPELLINGS
from ..outputs import GenerationOutput
from ..segments import Segment
from .protocol import APIError, StreamOptions, TokenBytes, _Open, request_options, usage, validated

Prompt = str | list[int]


class CompletionRequest(_Open):
    """A completions request besides its options (the body's other fields, as for chat)."""

    model: str
    prompt: str | list[str] | list[StrictInt] | list[list[StrictInt]]  # true is not token 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int | None = None
    logprobs: int | None = None  # the legacy form: this many alternatives per token
    hypic: dict[str, Any] | None = None


def parse_completion_request(data: Any) -> CompletionRequest:
    """The body checked (``fields``' policy applied); any problem as a 400 naming the field."""
    return validated(CompletionRequest, data)


def prompts(request: CompletionRequest, most: int) -> list[Prompt]:
    """Each prompt the request holds: a string, a list of strings, token ids, or a list of token id lists; at
    most ``most`` (the queue's room: each prompt is a job, and a request that could never fit is a 400, not a
    429 a client would retry forever)."""
    given = request.prompt
    if isinstance(given, str) or (given and all(isinstance(i, int) for i in given)):
        items: list[Any] = [given]
    else:
        items = list(given)
    if not items or any(not p for p in items):
        raise APIError(400, "prompt must be a non-empty string or token list (or a list of them)", param="prompt")
    if len(items) > most:
        raise APIError(400, f"prompt holds {len(items)} prompts; one request takes up to {most}", param="prompt")
    return items


def prompt_segments(prompt: Prompt) -> tuple[list[Segment], Segment]:
    """The segments and the query of one prompt: token ids as the query, text cut at its paragraphs."""
    if not isinstance(prompt, str):
        return [], Segment(token_ids=list(prompt), kind="query", cache=False)
    return flat_prompt(prompt)


def completion_arguments(request: CompletionRequest, prompt: Prompt, default_mode: str) -> dict[str, Any]:
    """``Engine.start``'s arguments for one of the request's prompts."""
    body = {k: v for k, v in (request.model_extra or {}).items() if SPELLINGS.get(k, k) in OPTIONS}
    if request.logprobs is not None:
        if not 0 <= request.logprobs <= 20:
            raise APIError(400, f"logprobs must be in [0, 20], got {request.logprobs}", param="logprobs")
        body.update(logprobs=True, top_logprobs=request.logprobs)
    segments, query = prompt_segments(prompt)
    return {"segments": segments, "query": query, "options": request_options(request, default_mode, body)}


def completion_id() -> str:
    return "cmpl-" + uuid.uuid4().hex[:24]


def _finish(out: GenerationOutput) -> str:
    return "stop" if out.finish_reason == "stop" else "length"


def text_logprobs(out: GenerationOutput, token_bytes: TokenBytes) -> dict[str, Any] | None:
    """The legacy ``logprobs`` object: tokens, their log-probabilities, the alternatives and text offsets."""
    if out.logprobs is None:
        return None
    tokens, offsets, offset = [], [], 0
    for entry in out.logprobs:
        text = token_bytes(entry.token).decode("utf-8", errors="replace")
        tokens.append(text)
        offsets.append(offset)
        offset += len(text)
    return {
        "tokens": tokens,
        "token_logprobs": [e.logprob for e in out.logprobs],
        "top_logprobs": [
            {token_bytes(i).decode("utf-8", errors="replace"): lp for i, lp in e.top} for e in out.logprobs
        ],
        "text_offset": offsets,
    }


def choice(index: int, out: GenerationOutput, token_bytes: TokenBytes) -> dict[str, Any]:
    return {
        "index": index,
        "text": out.text or "",
        "finish_reason": _finish(out),
        "logprobs": text_logprobs(out, token_bytes),
    }


def text_completion(
    outs: list[GenerationOutput], model: str, request_id: str, token_bytes: TokenBytes
) -> dict[str, Any]:
    """The answer to a request: one choice per prompt, the usage summed over them."""
    totals = [usage(out) for out in outs]
    summed = {key: sum(u[key] for u in totals) for key in ("prompt_tokens", "completion_tokens", "total_tokens")}
    details = ("cached_tokens", "prefix_tokens")
    summed["prompt_tokens_details"] = {k: sum(u["prompt_tokens_details"][k] for u in totals) for k in details}
    return {
        "id": request_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice(i, out, token_bytes) for i, out in enumerate(outs)],
        "usage": summed,
        "hypic": [{**out.stats, "ttft_s": out.ttft_s} for out in outs],
    }


def text_chunk(
    request_id: str,
    model: str,
    created: int,
    index: int,
    text: str,
    finish: str | None = None,
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "id": request_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"index": index, "text": text, "finish_reason": finish, "logprobs": logprobs}],
    }
