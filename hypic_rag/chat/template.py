"""Render a checkpoint's own chat template, exactly as ``transformers`` would.

A real checkpoint defines its prompt format in a Jinja chat template. The engine must produce the same prompt text
as ``transformers.PreTrainedTokenizerBase.apply_chat_template(..., tokenize=False)``, byte for byte, or cached
segments and the model's expectations drift apart. transformers is only a test and benchmark dependency here, so
we render with jinja2 ourselves and reproduce its semantics: the same sandboxed environment and options
(``trim_blocks``, ``lstrip_blocks``, loop controls, the ``{% generation %}`` block), the same globals
(``raise_exception``, ``strftime_now``, ``dict``, ``namespace``) and ``tojson`` filter, the same variables
(``messages``, ``tools``, ``documents``, ``add_generation_prompt``, the special tokens, extra keyword arguments),
the same preparation of the inputs (``None`` fields dropped, reasoning fields aliased, plain data only), and the
same rules for finding a template in a checkpoint and picking one of several named templates.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
import numpy as np
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.parser import Parser
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace

__all__ = ["ChatTemplate"]

TEMPLATE_FILE = "chat_template.jinja"
"""The default template, stored on its own; it takes priority over the one in the tokenizer config."""
TEMPLATE_DIR = "additional_chat_templates"
"""Named templates, one ``NAME.jinja`` file each, next to ``chat_template.jinja``."""
CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_MAP_FILE = "special_tokens_map.json"

_STANDARD_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
# Names a message's reasoning comes under; templates read the first one (gpt-oss ones read "thinking").
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
# Arguments that apply_chat_template consumes itself instead of passing them to the template. We implement none
# of them, and passing one on as a template variable would render something transformers does not.
_UNSUPPORTED_KWARGS = frozenset(
    {
        "chat_template",
        "continue_final_message",
        "tokenize",
        "sanitize_control_tokens",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
    }
)


class ChatTemplate:
    """A checkpoint's chat template (or its named templates) with the special tokens it may refer to.

    ``source`` is one template, or a mapping of names to templates as in ``tokenizer_config.json``'s list form.
    ``origin`` names where it came from in error messages. Every template is compiled here, so a broken one fails
    when the checkpoint is loaded rather than on the first request.
    """

    def __init__(
        self,
        source: str | Mapping[str, str],
        special_tokens: Mapping[str, str] | None = None,
        *,
        origin: str | Mapping[str, str] = "chat template",
    ) -> None:
        if isinstance(source, str):
            self._templates = {"default": source}
        elif isinstance(source, Mapping) and source and all(isinstance(s, str) for s in source.values()):
            self._templates = {str(name): text for name, text in source.items()}
        else:
            raise ValueError(f"{origin}: a chat template must be a string or a non-empty mapping of name to string")
        if isinstance(origin, str):
            single = len(self._templates) == 1 and "default" in self._templates
            self._origins = {name: origin if single else f"{origin} (template {name!r})" for name in self._templates}
        else:
            self._origins = {name: origin.get(name, f"chat template {name!r}") for name in self._templates}
        self.special_tokens: dict[str, str] = dict(special_tokens or {})
        for name, text in self._templates.items():
            _compile_checked(text, self._origins[name])

    @property
    def templates(self) -> dict[str, str]:
        """The template sources by name; a single template is named ``"default"``."""
        return dict(self._templates)

    @classmethod
    def from_checkpoint(cls, path: str | os.PathLike[str]) -> ChatTemplate | None:
        """The chat template of the checkpoint at ``path``, found where transformers looks; None when it has none.

        ``chat_template.jinja`` and ``additional_chat_templates/*.jinja`` take priority over
        ``tokenizer_config.json``'s ``chat_template`` (a string, or a list of ``{"name", "template"}``). The special
        tokens come from ``tokenizer_config.json`` (and the legacy ``special_tokens_map.json``).
        """
        root = Path(path)
        config = _read_json(root / CONFIG_FILE)
        templates: dict[str, str] = {}
        origins: dict[str, str] = {}
        default_file = root / TEMPLATE_FILE
        if default_file.is_file():
            templates["default"] = _read_text(default_file)
            origins["default"] = str(default_file)
        named_dir = root / TEMPLATE_DIR
        if named_dir.is_dir():
            for file in sorted(named_dir.glob("*.jinja")):
                name = file.name.removesuffix(".jinja")
                templates[name] = _read_text(file)
                origins[name] = str(file)
        if not templates:
            templates, origins = _templates_from_config(config, root / CONFIG_FILE)
        if not templates:
            return None
        return cls(templates, _special_tokens(config, root), origin=origins)

    def source_for(self, tools: Sequence[Any] | None = None) -> str:
        """The template a call with ``tools`` uses: ``"tool_use"`` when tools are given (even an empty list) and it
        exists, else ``"default"`` -- transformers' rule, which checkpoints with named templates rely on."""
        return self._templates[self._select(tools)]

    def _select(self, tools: Sequence[Any] | None) -> str:
        if tools is not None and "tool_use" in self._templates:
            return "tool_use"
        if "default" in self._templates:
            return "default"
        raise ValueError(
            f"{self._origins[next(iter(self._templates))]}: the checkpoint has several chat templates and no "
            f"'default' one; available templates are {sorted(self._templates)}"
        )

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        **kwargs: Any,
    ) -> str:
        """The prompt text ``apply_chat_template(messages, tools=tools, documents=documents,
        add_generation_prompt=add_generation_prompt, tokenize=False, **kwargs)`` gives for this checkpoint.

        ``kwargs`` become template variables (e.g. ``enable_thinking``) and override special tokens of the same
        name. The caller's messages are never modified. Raises ValueError for a template's ``raise_exception`` (with
        its message) and for inputs transformers would reject.
        """
        unsupported = sorted(_UNSUPPORTED_KWARGS.intersection(kwargs))
        if unsupported:
            raise ValueError(f"unsupported apply_chat_template arguments: {unsupported}")
        name = self._select(tools)
        origin = self._origins[name]
        chat = _prepare_messages(messages)
        template_tools = _prepare_tools(tools)
        template_documents = _prepare_documents(documents)
        variables = _plain({**self.special_tokens, **kwargs})
        compiled = _compile_checked(self._templates[name], origin)
        try:
            return compiled.render(
                messages=chat,
                tools=template_tools,
                documents=template_documents,
                add_generation_prompt=add_generation_prompt,
                **variables,
            )
        except _RaisedByTemplate as error:
            raise ValueError(str(error)) from error
        except jinja2.TemplateError as error:
            raise ValueError(f"{origin}: rendering failed: {error}") from error

    def __repr__(self) -> str:
        return f"ChatTemplate(templates={sorted(self._templates)}, special_tokens={sorted(self.special_tokens)})"


# --- the Jinja environment ---------------------------------------------------------------------------------------


class _RaisedByTemplate(jinja2.TemplateError):
    """What ``raise_exception`` raises, so that render can tell the template's own errors from jinja's."""


class _GenerationBlock(Extension):
    """``{% generation %}...{% endgeneration %}``: renders its body. transformers uses the block to mark the
    assistant's tokens for training masks; a template using it must still compile and render the same."""

    tags = {"generation"}

    def parse(self, parser: Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Callable[[], str]) -> str:
        return caller()


class _DictFactory:
    """The template's ``dict``: builds dicts, without handing the ``dict`` type itself to untrusted code."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


def _check_namespace_name(name: object) -> None:
    if isinstance(name, str) and name.startswith("_"):
        raise jinja2.exceptions.SecurityError(
            f"chat templates cannot store underscore-prefixed attributes on a namespace, got {name!r}"
        )


class _GuardedNamespace(Namespace):
    """The template's ``namespace``: refuses underscore names, which could reach Python internals."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        # jinja's signature, so that namespace(self=...) still works
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _check_namespace_name(name)
        Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _check_namespace_name(name)
        Namespace.__setitem__(self, name, value)


def _raise_exception(message: str) -> None:
    raise _RaisedByTemplate(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | str | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    """Plain ``json.dumps``: jinja's own ``tojson`` escapes ``<``, ``>``, ``&`` and ``'`` for HTML, which would
    change the prompt."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationBlock, loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _DictFactory()
    env.globals["namespace"] = _GuardedNamespace
    return env


_ENV = _environment()


@lru_cache(maxsize=64)
def _compile(source: str) -> jinja2.Template:
    """Compiled once per source: compiling is far slower than rendering, and a server renders every request."""
    return _ENV.from_string(source)


def _compile_checked(source: str, origin: str) -> jinja2.Template:
    try:
        return _compile(source)
    except jinja2.TemplateSyntaxError as error:
        raise ValueError(f"{origin}: chat template does not compile: line {error.lineno}: {error.message}") from error


# --- inputs --------------------------------------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    """``value`` rebuilt from plain JSON-like data, as transformers gives templates: subclasses of str/int/float
    (enums, numpy scalars) become the base type, mappings dicts, dataclasses and pydantic models their fields, and
    any other object an inert ``"<TypeName>"`` string, so the sandbox never sees an object with unknown methods."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_plain(item) for item in value)
    if isinstance(value, np.generic):
        return _plain(value.item())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: _plain(getattr(value, field.name)) for field in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):
        return _plain(value.model_dump())
    return f"<{type(value).__name__}>"


def _prepare_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages as the template sees them: plain dicts without ``None`` fields (OpenAI clients send
    ``"content": null`` beside tool calls, which templates handle only as a missing key), with the reasoning
    copied under ``reasoning_content`` and ``thinking``."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise TypeError(f"messages should be a list of dicts, got {type(messages).__name__}")
    if not messages:
        raise ValueError("cannot apply a chat template to an empty conversation; give at least one message")
    chat = []
    for message in messages:
        plain = _plain(message)
        if not isinstance(plain, dict):
            raise TypeError(f"chat messages should be dicts, dataclasses or pydantic models, got {message!r}")
        plain = {key: value for key, value in plain.items() if value is not None}
        reasoning = next((plain[key] for key in _REASONING_FIELDS if key in plain), None)
        if reasoning is not None:
            # Same key order as transformers: "thinking" first unless the message has it, its own value kept.
            plain = {"thinking": reasoning, **plain, "reasoning_content": reasoning}
        chat.append(plain)
    return chat


def _prepare_tools(tools: Sequence[Any] | None) -> list[Any] | None:
    """OpenAI-format tool dicts pass through unchanged (no wrapping); an empty list stays an empty list."""
    if tools is None:
        return None
    if isinstance(tools, (str, bytes, Mapping)) or not isinstance(tools, Sequence):
        raise ValueError(f"tools should be a list of JSON schema dicts, got {type(tools).__name__}")
    for tool in tools:
        if not isinstance(tool, dict):
            raise ValueError(f"each tool should be a JSON schema dict, got {type(tool).__name__}: {tool!r}")
    return _plain(list(tools))


def _prepare_documents(documents: Sequence[Any] | None) -> Any:
    if documents is None:
        return None
    for document in documents:
        if not isinstance(document, dict):
            raise TypeError("documents should be a list of dicts with 'title' and 'text' keys")
    return _plain(documents)


# --- checkpoint files ----------------------------------------------------------------------------------------------


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"{path}: cannot read the chat template: {error}") from error


def _read_json(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``; empty when the file is absent."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: not readable JSON: {error}") from error
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _templates_from_config(config: Mapping[str, Any], path: Path) -> tuple[dict[str, str], dict[str, str]]:
    entry = config.get("chat_template")
    if entry is None:
        return {}, {}
    if isinstance(entry, str):
        return {"default": entry}, {"default": f"{path} (chat_template)"}
    if isinstance(entry, list):
        templates = {}
        for item in entry:
            if not (isinstance(item, Mapping) and isinstance(item.get("name"), str)):
                raise ValueError(f"{path}: each chat_template entry needs a 'name' and a 'template', got {item!r}")
            if not isinstance(item.get("template"), str):
                raise ValueError(f"{path}: chat_template {item['name']!r} has no template string")
            templates[item["name"]] = item["template"]
    elif isinstance(entry, Mapping) and all(isinstance(t, str) for t in entry.values()):
        templates = dict(entry)
    else:
        raise ValueError(f"{path}: chat_template should be a string or a list of {{name, template}} entries")
    return templates, {name: f"{path} (chat_template {name!r})" for name in templates}


def _token_text(value: Any) -> str | None:
    """A special token as configs store it: a string, or a serialised AddedToken ``{"content": ...}``."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _special_tokens(config: Mapping[str, Any], root: Path) -> dict[str, str]:
    """The named special tokens transformers passes to templates: the standard seven, any other ``*_token`` entry
    holding a token (e.g. ``image_token``) and the names in an ``extra_special_tokens`` mapping. A config without
    ``added_tokens_decoder`` is an old one, whose ``special_tokens_map.json`` overrides it."""
    merged = dict(config)
    if "added_tokens_decoder" not in config:
        for key, value in _read_json(root / SPECIAL_TOKENS_MAP_FILE).items():
            if key in ("extra_special_tokens", "additional_special_tokens") and isinstance(value, list):
                continue  # unnamed tokens: templates never see them
            if key == "extra_special_tokens" and isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
                value = {**merged[key], **value}
            merged[key] = value
    extra = merged.get("extra_special_tokens") or merged.get("additional_special_tokens")
    tokens: dict[str, str] = {}
    for key, value in merged.items():
        if key in _STANDARD_TOKENS or key.endswith("_token"):
            text = _token_text(value)
            if text is not None:
                tokens[key] = text
    if isinstance(extra, Mapping):
        for key, value in extra.items():
            text = _token_text(value)
            if text is not None:
                tokens[str(key)] = text
    return tokens
