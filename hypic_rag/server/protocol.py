"""The OpenAI chat-completions wire format: requests checked (pydantic) and turned into what ``Engine.start_chat``
takes (messages, tools, ``RequestOptions``), answers and stream chunks built from its output, and the OpenAI error
body.

The request models allow fields they do not name (clients send ``user``, ``metadata``, ``store`` ...), but a field
that asks for what the engine cannot do (``n > 1``, log-probabilities, penalties, a JSON response format) is
refused with a 400 that names it, never silently ignored.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..chat.tool_calls import TOOL_CHOICES
from ..options import OPTIONS, SPELLINGS, OptionError, RequestOptions
from ..outputs import GenerationOutput
from ..segments import KINDS
from .limits import finite

ROLES = ("system", "developer", "user", "assistant", "tool")


class APIError(Exception):
    """An answer other than 200: its status, and OpenAI's error body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def from_value_error(exc: ValueError) -> APIError:
    """The engine's ``ValueError`` (bad input, by the project's rule) as a 400."""
    message = str(exc)
    code = "context_length_exceeded" if "past the model's context" in message else None
    return APIError(400, message, param="messages" if code else None, code=code)


# -- requests ---------------------------------------------------------------------------------------------------------


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class Message(_Open):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class StreamOptions(_Open):
    include_usage: bool = False


class ChatCompletionRequest(_Open):
    """What a request asks, besides its options: those (``temperature``, ``max_tokens``, ...) are the body's other
    fields, read by ``request_options``."""

    model: str
    messages: list[Message] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int | None = None
    hypic: dict[str, Any] | None = None  # the extension: request options by name, e.g. {"mode": "full", "seam": 4}


def parse_request(data: Any) -> ChatCompletionRequest:
    """The request body checked; any problem as a 400 naming the field."""
    if not isinstance(data, dict):
        raise APIError(400, "the request body must be a JSON object")
    try:
        request = ChatCompletionRequest.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise APIError(400, f"{where}: {first['msg']}", param=where) from None
    extra = request.model_extra or {}
    if request.n not in (None, 1):
        raise APIError(400, "n > 1 is not supported: ask once per answer", param="n")
    for name, harmless in (("logprobs", (None, False)), ("top_logprobs", (None, 0))):
        if extra.get(name) not in harmless:
            raise APIError(400, f"{name} is not supported", param=name)
    for name in ("frequency_penalty", "presence_penalty"):
        if extra.get(name) not in (None, 0, 0.0):
            raise APIError(400, f"{name} is not supported (only 0)", param=name)
    if extra.get("logit_bias"):
        raise APIError(400, "logit_bias is not supported", param="logit_bias")
    response_format = extra.get("response_format")
    if response_format not in (None, {"type": "text"}):
        raise APIError(400, "response_format other than text is not supported", param="response_format")
    return request


def request_options(request: ChatCompletionRequest, default_mode: str) -> RequestOptions:
    """The request's options: each body field that names one (``max_tokens`` and ``max_completion_tokens``, as
    OpenAI spells it, included), then the ``hypic`` extension's, over the server's ``default_mode``. A field the
    body leaves ``null`` is unset. A bad value is a 400 that names the field."""
    body = {k: v for k, v in (request.model_extra or {}).items() if SPELLINGS.get(k, k) in OPTIONS}
    stop = body.get("stop")
    if isinstance(stop, str):
        body["stop"] = [stop]
    if isinstance(body.get("stop"), list) and (len(body["stop"]) > 4 or not all(body["stop"])):
        raise APIError(400, "stop takes up to 4 non-empty strings", param="stop")
    temperature = body.get("temperature")
    if isinstance(temperature, int | float) and not isinstance(temperature, bool) and temperature > 2:
        raise APIError(400, f"temperature must be in [0, 2] (OpenAI's range), got {temperature}", param="temperature")
    try:
        options = RequestOptions.from_mapping(body, base=RequestOptions(mode=default_mode), ignore_none=True)
    except OptionError as exc:
        raise APIError(400, str(exc), param=exc.option) from None
    if request.hypic is None:
        return options
    try:
        return RequestOptions.from_mapping(request.hypic, base=options, ignore_none=True)
    except OptionError as exc:
        raise APIError(400, f"hypic.{exc.option}: {exc}", param=f"hypic.{exc.option}") from None


def _part(part: dict[str, Any], where: str) -> dict[str, Any]:
    """A content part as the engine takes it: text, with a kind from ``hypic`` or, for a part marked with
    Anthropic-style ``cache_control``, ``document``."""
    if part.get("type") != "text" or not isinstance(part.get("text"), str):
        raise APIError(400, f"{where}: only text parts {{'type': 'text', 'text': ...}} are supported", param=where)
    out: dict[str, Any] = {"type": "text", "text": part["text"]}
    meta = part.get("hypic")
    if meta is not None:
        kind = meta.get("kind") if isinstance(meta, dict) else None
        if kind not in KINDS:
            raise APIError(400, f"{where}.hypic.kind must be one of {', '.join(KINDS)}, got {kind!r}", param=where)
        out["hypic"] = {"kind": kind}
    elif part.get("cache_control") is not None:
        out["hypic"] = {"kind": "document"}
    return out


def _tool_call(call: Any, where: str) -> dict[str, Any]:
    """An assistant's earlier call, with its JSON-string arguments read back into an object (templates such
    as Qwen3.5's iterate over them)."""
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise APIError(400, f"{where}: a tool call needs function.name", param=where)
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            raise APIError(400, f"{where}: function.arguments is not valid JSON", param=where) from None
    if not isinstance(arguments, dict):
        raise APIError(400, f"{where}: function.arguments must be a JSON object", param=where)
    return {**call, "type": "function", "function": {"name": function["name"], "arguments": arguments}}


def engine_messages(request: ChatCompletionRequest) -> list[dict[str, Any]]:
    """The messages as ``Engine.chat`` takes them: ``developer`` is ``system``, parts carry their kinds, tool
    calls' arguments are objects. Empty user content is refused."""
    out = []
    for i, message in enumerate(request.messages):
        where = f"messages.{i}"
        item: dict[str, Any] = {"role": "system" if message.role == "developer" else message.role}
        content = message.content
        if isinstance(content, list):
            content = [_part(p, f"{where}.content.{j}") for j, p in enumerate(content)]
        text = "".join(p["text"] for p in content) if isinstance(content, list) else content
        if message.role != "assistant" and (not content or (isinstance(text, str) and not text.strip())):
            if message.role != "tool" or content is None:
                raise APIError(400, f"{where}: a {message.role} message needs content", param=where)
        item["content"] = content
        if message.name is not None:
            item["name"] = message.name
        if message.tool_calls:
            if message.role != "assistant":
                raise APIError(400, f"{where}: only assistant messages carry tool_calls", param=where)
            item["tool_calls"] = [_tool_call(c, f"{where}.tool_calls.{j}") for j, c in enumerate(message.tool_calls)]
        elif message.role == "assistant" and content is None:
            raise APIError(400, f"{where}: an assistant message needs content or tool_calls", param=where)
        if message.tool_call_id is not None:
            item["tool_call_id"] = message.tool_call_id
        out.append(item)
    return out


def _tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    for i, tool in enumerate(tools or ()):
        function = tool.get("function")
        if tool.get("type", "function") != "function" or not isinstance(function, dict):
            raise APIError(400, f"tools.{i}: only function tools are supported", param=f"tools.{i}")
        if not isinstance(function.get("name"), str) or not function["name"]:
            raise APIError(400, f"tools.{i}: function.name is required", param=f"tools.{i}")
    return tools or None


def engine_arguments(request: ChatCompletionRequest, default_mode: str) -> dict[str, Any]:
    """``Engine.start_chat``'s arguments for this request: its messages, tools, tool choice and options."""
    choice = request.tool_choice
    if isinstance(choice, str) and choice not in TOOL_CHOICES:
        raise APIError(400, "tool_choice must be auto, none, required or a named function", param="tool_choice")
    return {
        "messages": engine_messages(request),
        "tools": _tools(request.tools),
        "tool_choice": choice,
        "options": request_options(request, default_mode),
    }


# -- answers ----------------------------------------------------------------------------------------------------------


def completion_id() -> str:
    return "chatcmpl-" + uuid.uuid4().hex[:24]


def finish_reason(out: GenerationOutput) -> str:
    if out.tool_calls:
        return "tool_calls"
    return "stop" if out.finish_reason == "stop" else "length"


def wire_tool_calls(out: GenerationOutput, *, streamed: bool = False) -> list[dict[str, Any]]:
    calls = []
    for i, call in enumerate(out.tool_calls):
        item: dict[str, Any] = {
            "id": call["id"],
            "type": "function",
            "function": {"name": call["name"], "arguments": json.dumps(call["arguments"], ensure_ascii=False)},
        }
        calls.append({"index": i, **item} if streamed else item)
    return calls


def usage(out: GenerationOutput) -> dict[str, Any]:
    prompt = int(out.stats.get("prompt_tokens", 0))
    generated = len(out.token_ids)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": generated,
        "total_tokens": prompt + generated,
        "prompt_tokens_details": {"cached_tokens": int(out.stats.get("cached_tokens", 0))},
    }


def completion(out: GenerationOutput, model: str, request_id: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": out.text if out.text or not out.tool_calls else None}
    if out.tool_calls:
        message["tool_calls"] = wire_tool_calls(out)
    if out.reasoning:
        message["reasoning_content"] = out.reasoning
    return {
        "id": request_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason(out), "logprobs": None}],
        "usage": usage(out),
        "hypic": {**out.stats, "ttft_s": out.ttft_s},
    }


def chunk(
    request_id: str,
    model: str,
    created: int,
    delta: dict[str, Any],
    finish: str | None = None,
    *,
    include_usage: bool = False,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": request_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
    }
    if include_usage:
        body["usage"] = None
    return body


def usage_chunk(request_id: str, model: str, created: int, out: GenerationOutput) -> dict[str, Any]:
    return {
        "id": request_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [],
        "usage": usage(out),
        "hypic": {**out.stats, "ttft_s": out.ttft_s},
    }


def sse(data: dict[str, Any] | str) -> bytes:
    text = data if isinstance(data, str) else json.dumps(finite(data), ensure_ascii=False, allow_nan=False)
    return f"data: {text}\n\n".encode()
