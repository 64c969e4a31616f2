"""The OpenAI chat-completions wire format: requests checked (pydantic) and turned into what ``Engine.start_chat``
takes (messages, tools, ``RequestOptions``), answers and stream chunks built from its output, and the OpenAI error
body.

The request models allow fields they do not name; what becomes of each is the policy in ``fields`` (honoured,
refused with a 400 that names it, accepted as bookkeeping, or ignored and reported back).
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

from ..chat.formats import NONE, ChatFormat
from ..chat.tool_calls import TOOL_CHOICES
from ..options import OPTIONS, SPELLINGS, OptionError, RequestOptions
from ..outputs import GenerationOutput
from ..segments import KINDS
from .fields import FieldError, check_fields, structured_alias
from .limits import finite

_Body = TypeVar("_Body", bound=BaseModel)

ROLES = ("system", "developer", "user", "assistant", "tool")
FIELD = re.compile(r"[a-z_]+(\.[a-z0-9_]+)*")  # a body field an error message may begin with


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
    """The engine's ``ValueError`` (bad input, by the project's rule) as a 400; one that begins with the field it is
    about (``response_format: ...``, ``tools.0.function.parameters: ...``) names it as the error's ``param``."""
    message = str(exc)
    if "past the model's context" in message:
        return APIError(400, message, param="messages", code="context_length_exceeded")
    head = message.split(":", 1)[0]
    return APIError(400, message, param=head if ":" in message and FIELD.fullmatch(head) else None)


# -- requests ---------------------------------------------------------------------------------------------------------


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")
    _ignored: list[str] = PrivateAttr(default_factory=list)  # body fields the policy ignored (``fields``)

    @property
    def ignored_fields(self) -> list[str]:
        return self._ignored


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
    parallel_tool_calls: bool | None = None
    hypic: dict[str, Any] | None = None  # the extension: request options by name, e.g. {"mode": "full", "seam": 4}


def apply_field_policy(request: _Open, data: dict[str, Any]) -> None:
    """``fields``' policy on the body ``request`` was read from: a 400 for a refused field, ``n`` other than 1
    included; the ignored ones kept on the request."""
    n = getattr(request, "n", None)
    if n is not None and n < 1:
        raise APIError(400, f"n must be 1 (one answer per request), got {n}", param="n")
    if n not in (None, 1):
        raise APIError(400, "n > 1 is not supported: ask once per answer", param="n")
    try:
        request._ignored = check_fields(data, frozenset(type(request).model_fields))
    except FieldError as exc:
        raise APIError(400, str(exc), param=exc.field) from None


def validated(model: type[_Body], data: Any) -> _Body:
    """A request body of any route checked against ``model`` (the field policy applied); any problem as a 400
    naming the field."""
    if not isinstance(data, dict):
        raise APIError(400, "the request body must be a JSON object")
    try:
        request = model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise APIError(400, f"{where}: {first['msg']}", param=where) from None
    apply_field_policy(request, data)
    return request


def parse_request(data: Any) -> ChatCompletionRequest:
    """The chat request body checked; any problem as a 400 naming the field."""
    return validated(ChatCompletionRequest, data)


def request_options(request: _Open, default_mode: str, body: dict[str, Any] | None = None) -> RequestOptions:
    """The request's options: each body field that names one (``max_tokens`` and ``max_completion_tokens``, as
    OpenAI spells it, included; vLLM's structured-output fields as ``response_format``), then the ``hypic``
    extension's, over the server's ``default_mode``. A field the body leaves ``null`` is unset. A bad value is a
    400 that names the field. ``body``: the options as the route read them, where it reads some itself."""
    extra = request.model_extra or {}
    if body is None:
        body = {k: v for k, v in extra.items() if SPELLINGS.get(k, k) in OPTIONS}
    try:
        alias = structured_alias(extra)
    except FieldError as exc:
        raise APIError(400, str(exc), param=exc.field) from None
    if alias is not None:
        body["response_format"] = alias
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
    hypic = getattr(request, "hypic", None)
    if hypic is None:
        return options
    try:
        return RequestOptions.from_mapping(hypic, base=options, ignore_none=True)
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


def _joined(parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Text parts with a newline between neighbours, as vLLM joins a message's parts; put on the side of a part
    without a kind, so that a document's text (its cache entry) is the same wherever it stands."""
    out = [dict(p) for p in parts]
    for left, right in zip(out, out[1:], strict=False):
        if "hypic" not in right:
            right["text"] = "\n" + right["text"]
        elif "hypic" not in left:
            left["text"] += "\n"
    return out


def engine_messages(
    request: ChatCompletionRequest, chat_format: ChatFormat = NONE, segmentation: str = "auto"
) -> list[dict[str, Any]]:
    """The messages as ``Engine.chat`` takes them: ``developer`` is ``system``, parts carry their kinds and are
    joined as vLLM joins them, tool calls' arguments are objects; then written as ``chat_format``'s model reads
    them (``ChatFormat.prepare_messages``: the bundled model's tool results normalised), as the integrations
    write them. Empty user content is refused."""
    out = []
    for i, message in enumerate(request.messages):
        where = f"messages.{i}"
        item: dict[str, Any] = {"role": "system" if message.role == "developer" else message.role}
        content = message.content
        if isinstance(content, list):
            content = _joined([_part(p, f"{where}.content.{j}") for j, p in enumerate(content)])
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
    try:
        return chat_format.prepare_messages(out, segmentation)
    except ValueError as exc:
        raise APIError(400, str(exc), param="messages") from None


def _tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    for i, tool in enumerate(tools or ()):
        function = tool.get("function")
        if tool.get("type", "function") != "function" or not isinstance(function, dict):
            raise APIError(400, f"tools.{i}: only function tools are supported", param=f"tools.{i}")
        if not isinstance(function.get("name"), str) or not function["name"]:
            raise APIError(400, f"tools.{i}: function.name is required", param=f"tools.{i}")
        if function.get("parameters") is not None and not isinstance(function["parameters"], dict):
            where = f"tools.{i}.function.parameters"
            raise APIError(400, f"{where} must be a JSON schema object", param=where)
    return tools or None


def engine_arguments(
    request: ChatCompletionRequest, default_mode: str, chat_format: ChatFormat = NONE
) -> dict[str, Any]:
    """``Engine.start_chat``'s arguments for this request: its messages, tools, tool choice and options."""
    choice = request.tool_choice
    if isinstance(choice, str) and choice not in TOOL_CHOICES:
        raise APIError(400, "tool_choice must be auto, none, required or a named function", param="tool_choice")
    parallel = request.parallel_tool_calls
    options = request_options(request, default_mode)
    return {
        "messages": engine_messages(request, chat_format, options.segmentation),
        "tools": _tools(request.tools),
        "tool_choice": choice,
        "parallel_tool_calls": True if parallel is None else parallel,
        "options": options,
    }


# -- answers ----------------------------------------------------------------------------------------------------------


def completion_id() -> str:
    return "chatcmpl-" + uuid.uuid4().hex[:24]


def finish_reason(out: GenerationOutput) -> str:
    if out.tool_calls:
        return "tool_calls"
    return "stop" if out.finish_reason == "stop" else "length"


def unique_call_ids(out: GenerationOutput) -> GenerationOutput:
    """``out`` with a fresh id for each call, as OpenAI gives: the engine's are stable per prompt, so two requests
    with the same prompt would get the same ids."""
    for call in [*out.tool_calls, *([out.partial_call] if out.partial_call else [])]:
        call["id"] = "call_" + uuid.uuid4().hex[:24]
    return out


TokenBytes = Callable[[int], bytes]


def _token(token: int, logprob: float, token_bytes: TokenBytes) -> dict[str, Any]:
    raw = token_bytes(token)
    return {"token": raw.decode("utf-8", errors="replace"), "logprob": logprob, "bytes": list(raw)}


def chat_logprobs(out: GenerationOutput, token_bytes: TokenBytes) -> dict[str, Any] | None:
    """OpenAI's ``choices[].logprobs`` of a chat answer (``{"content": [...]}``), or None when not asked for."""
    if out.logprobs is None:
        return None
    content = []
    for entry in out.logprobs:
        item = _token(entry.token, entry.logprob, token_bytes)
        item["top_logprobs"] = [_token(i, lp, token_bytes) for i, lp in entry.top]
        content.append(item)
    return {"content": content}


def wire_tool_calls(out: GenerationOutput, *, streamed: bool = False) -> list[dict[str, Any]]:
    """The answer's calls as OpenAI writes them; a call ``max_new_tokens`` cut comes last, its arguments the text
    written so far (not valid JSON), as OpenAI's API returns one."""
    calls = []
    written = [(c, json.dumps(c["arguments"], ensure_ascii=False)) for c in out.tool_calls]
    if out.partial_call is not None:
        written.append((out.partial_call, out.partial_call["arguments"]))
    for i, (call, arguments) in enumerate(written):
        item: dict[str, Any] = {
            "id": call["id"],
            "type": "function",
            "function": {"name": call["name"], "arguments": arguments},
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
        # prefix_tokens (ours): of cached_tokens, those restored whole from a kept state (an earlier turn's)
        "prompt_tokens_details": {
            "cached_tokens": int(out.stats.get("cached_tokens", 0)),
            "prefix_tokens": int(out.stats.get("prefix_tokens", 0)),
        },
    }


def completion(
    out: GenerationOutput, model: str, request_id: str, token_bytes: TokenBytes | None = None
) -> dict[str, Any]:
    calls = bool(out.tool_calls or out.partial_call)
    message: dict[str, Any] = {"role": "assistant", "content": out.text if out.text or not calls else None}
    if calls:
        message["tool_calls"] = wire_tool_calls(out)
    if out.reasoning:
        message["reasoning_content"] = out.reasoning
    return {
        "id": request_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": finish_reason(out),
                "logprobs": chat_logprobs(out, token_bytes) if token_bytes is not None else None,
            }
        ],
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
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": request_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": logprobs}],
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
