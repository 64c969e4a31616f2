"""The policy for a request body's fields, one table for every route (docs/serving.md, "Request fields").

- A field we implement is honoured: the routes' own (``model``, ``messages``/``prompt``, ``tools``, ...) and
  every request option (``hypic_rag.options``: ``temperature``, ``max_tokens``, ``presence_penalty``,
  ``response_format``, ``logprobs``, ...), by OpenAI's name or the engine's.
- vLLM's structured-output fields are aliases of ``response_format``: ``guided_json``, ``guided_regex``,
  ``guided_choice`` and ``structured_outputs`` with ``json``, ``json_object``, ``regex`` or ``choice``.
- A field OpenAI's or vLLM's API defines that changes the answer and that we do not implement is a 400 naming
  it, unless it holds its neutral value (``null``, or what leaves the answer as it is).
- A field that asks nothing of the answer (``user``, ``metadata``, ``store``, ...) is accepted.
- Any other field is ignored, as vLLM ignores it, and named in the answer's ``X-Hypic-Ignored-Fields`` header
  and its ``hypic.ignored_fields``: a client can see it had no effect.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

from ..options import OPTIONS, SPELLINGS

# Fields that leave the answer as it is: bookkeeping, or how a hosted service bills and stores it.
NO_EFFECT = frozenset(
    {"user", "metadata", "store", "service_tier", "safety_identifier", "prompt_cache_key", "request_id", "priority"}
)

# Known fields we do not implement, with the values that ask for nothing (refused otherwise).
_NULL: tuple[Any, ...] = (None,)
REFUSED: dict[str, tuple[Any, ...]] = {
    # OpenAI
    "logit_bias": (None, {}),
    "functions": (None, []),  # the legacy form of tools: send tools
    "function_call": (None, "none", "auto"),
    "audio": _NULL,
    "modalities": (None, ["text"]),
    "prediction": _NULL,
    "web_search_options": _NULL,
    "reasoning_effort": _NULL,
    "verbosity": _NULL,
    "suffix": (None, ""),
    "best_of": (None, 1),
    # vLLM
    "use_beam_search": (None, False),
    "length_penalty": (None, 1, 1.0),
    "min_tokens": (None, 0),
    "ignore_eos": (None, False),
    "skip_special_tokens": (None, True),
    "spaces_between_special_tokens": (None, True),
    "include_stop_str_in_output": (None, False),
    "prompt_logprobs": _NULL,
    "allowed_token_ids": _NULL,
    "bad_words": (None, []),
    "logits_processors": _NULL,
    "truncate_prompt_tokens": _NULL,
    "return_tokens_as_token_ids": (None, False),
    "add_generation_prompt": (None, True),
    "continue_final_message": (None, False),
    "add_special_tokens": (None, False),
    "documents": _NULL,
    "chat_template": _NULL,
    "mm_processor_kwargs": _NULL,
    "guided_grammar": _NULL,
    "guided_decoding_backend": _NULL,
    "guided_whitespace_pattern": _NULL,
    "structural_tag": _NULL,
    "echo": (None, False),
}

ALIASES = ("guided_json", "guided_regex", "guided_choice", "structured_outputs")
_STRUCTURED_KEYS = {"json", "json_object", "regex", "choice"}


class FieldError(ValueError):
    """A body field the policy refuses; ``field`` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def is_option(name: str) -> bool:
    return SPELLINGS.get(name, name) in OPTIONS


def check_fields(body: Mapping[str, Any], own: frozenset[str]) -> list[str]:
    """Apply the policy to ``body``, whose route reads the fields ``own`` (besides the options): a
    ``FieldError`` for a refused one, else the names of the fields that are ignored."""
    ignored = []
    for name, value in body.items():
        if name in own or is_option(name) or name in NO_EFFECT or name in ALIASES:
            continue
        if name in REFUSED:
            if not any(value == neutral and type(value) is type(neutral) for neutral in REFUSED[name]):
                hint = ": send tools and tool_choice" if name in ("functions", "function_call") else ""
                raise FieldError(name, f"{name} is not supported{hint}")
            continue
        ignored.append(name)
    return sorted(ignored)


def structured_alias(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """The ``response_format`` that vLLM's structured-output fields in ``body`` ask for, or None; a
    ``FieldError`` for two that disagree or a kind we do not implement."""
    found: list[tuple[str, dict[str, Any]]] = []
    if body.get("guided_json") is not None:
        found.append(("guided_json", _json_format(body["guided_json"], "guided_json")))
    if body.get("guided_regex") is not None:
        found.append(("guided_regex", {"type": "regex", "regex": body["guided_regex"]}))
    if body.get("guided_choice") is not None:
        found.append(("guided_choice", {"type": "choice", "choice": body["guided_choice"]}))
    spec = body.get("structured_outputs")
    if spec is not None:
        if not isinstance(spec, Mapping):
            raise FieldError("structured_outputs", "structured_outputs must be an object")
        given = {k for k, v in spec.items() if v not in (None, False)}
        unknown = sorted(given - _STRUCTURED_KEYS - {"disable_any_whitespace", "disable_additional_properties"})
        if unknown:
            raise FieldError("structured_outputs", f"structured_outputs.{unknown[0]} is not supported")
        kinds = sorted(given & _STRUCTURED_KEYS)
        if len(kinds) > 1:
            raise FieldError("structured_outputs", f"structured_outputs sets both {kinds[0]} and {kinds[1]}")
        if kinds:
            kind = kinds[0]
            if kind == "json":
                made = _json_format(spec["json"], "structured_outputs.json")
            elif kind == "json_object":
                made = {"type": "json_object"}
            else:
                made = {"type": kind, kind: spec[kind]}
            found.append(("structured_outputs", made))
    if found and body.get("response_format") not in (None, {"type": "text"}):
        found.insert(0, ("response_format", {}))
    if len(found) > 1:
        raise FieldError(found[1][0], f"{found[0][0]} and {found[1][0]} both ask for the answer's format")
    return found[0][1] if found else None


def _json_format(schema: Any, where: str) -> dict[str, Any]:
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError:
            raise FieldError(where, f"{where} is not a JSON schema") from None
    if not isinstance(schema, Mapping):
        raise FieldError(where, f"{where} must be a JSON schema object")
    return {"type": "json_schema", "json_schema": {"name": None, "schema": dict(schema)}}


# The ignored fields' header: names as a client sent them may hold any character, and a header value may not
# (CR/LF would split the response, non-latin-1 fails to encode), so each is percent-encoded outside printable
# ASCII, and the list is cut to a bounded length (the body's ``hypic.ignored_fields`` lists them all, as sent).
HEADER_SAFE = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) not in "%,")
IGNORED_HEADER_CHARS = 1024


def ignored_header_value(names: Sequence[str]) -> str:
    """The header value naming ``names``: each percent-encoded outside printable ASCII, at most
    ``IGNORED_HEADER_CHARS`` characters, ending in how many more there were when cut."""
    shown: list[str] = []
    used = 0
    for i, name in enumerate(names):
        safe = quote(name, safe=HEADER_SAFE + " ")
        last = i == len(names) - 1
        room = IGNORED_HEADER_CHARS - used - (0 if last else len(f", ... ({len(names) - i - 1} more)"))
        if len(safe) > room:
            shown.append(f"... ({len(names) - i} more)")
            break
        shown.append(safe)
        used += len(safe) + 2
    return ", ".join(shown)
