"""Calls an answer has begun, as far as they are written: what a stream can send of a call's arguments before the
call is finished, in OpenAI's delta shape.

A client joins the ``arguments`` fragments of a streamed call and reads the result as the call's arguments, so
what is sent must be a prefix of the final text, which is ``json.dumps(arguments, ensure_ascii=False)`` of the
parsed call. The model's own text is not that (the bundled model writes compact JSON, a Qwen3.5 call writes XML
parameters, a number may be written ``1.50``), so ``json_prefix`` rewrites the JSON written so far into that
canonical form, a token at a time, stopping before anything the rest of the answer could still change: a number
or literal not yet ended, an escape not yet whole. Written here because partial-JSON libraries return a value
(closing what is open), not the canonical text of what is certain.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

_SCALAR = re.compile(r"[-+0-9.eEtrufalsn]+")
_PLAIN = re.compile(r'[^"\\]+')  # a run of a string's characters that are neither a quote nor an escape
_HEX4 = re.compile(r"[0-9a-fA-F]{4}")
_SIMPLE_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


@dataclass(frozen=True)
class CallSoFar:
    """One call as far as it is written: its name once whole (None before), and the canonical prefix of its
    arguments' final text (``""`` where none can be given yet, or where the arguments are not JSON written out)."""

    name: str | None
    arguments: str
    keys: tuple[str, ...] = ()  # the arguments' keys written whole so far (they narrow which tool it calls)
    end: int | None = None  # where the call's text ends, once it is whole


def skip_space(text: str, i: int) -> int:
    """The index of the first character at or after ``i`` that is not whitespace (every scanner of calls uses it)."""
    while i < len(text) and text[i].isspace():
        i += 1
    return i


def canonical_text(text: str) -> str:
    """Characters as ``json.dumps(..., ensure_ascii=False)`` writes them inside a string (each on its own, so a
    prefix's text is a prefix of the whole's)."""
    return json.dumps(text, ensure_ascii=False)[1:-1]


def _string(text: str, i: int) -> tuple[str, str, int | None]:
    """The string whose opening quote is at ``i``: (its canonical text so far, opening quote included; the decoded
    characters; the index after its closing quote, None while it is open). Runs of plain characters are taken
    whole, so a long value costs a few calls, not one a character (a stream re-reads it every token)."""
    out, chars, j = ['"'], [], i + 1
    while j < len(text):
        run = _PLAIN.match(text, j)
        if run is not None:
            chars.append(run.group())
            out.append(canonical_text(run.group()))
            j = run.end()
            continue
        if text[j] == '"':
            out.append('"')
            return "".join(out), "".join(chars), j + 1
        if j + 1 >= len(text):
            break
        kind = text[j + 1]
        if kind in _SIMPLE_ESCAPES:
            decoded, j = _SIMPLE_ESCAPES[kind], j + 2
        elif kind == "u" and _HEX4.fullmatch(text[j + 2 : j + 6]):
            code, j = int(text[j + 2 : j + 6], 16), j + 6
            if 0xD800 <= code < 0xDC00:  # a high surrogate: the character is whole with its low half only
                if len(text) < j + 6:
                    break
                if text[j : j + 2] == "\\u" and _HEX4.fullmatch(text[j + 2 : j + 6]):
                    low = int(text[j + 2 : j + 6], 16)
                    if 0xDC00 <= low < 0xE000:
                        code, j = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00), j + 6
            decoded = chr(code)
        else:
            break  # an escape not yet whole (or not JSON): nothing past it is certain
        chars.append(decoded)
        out.append(canonical_text(decoded))
    return "".join(out), "".join(chars), None


def json_prefix(text: str, i: int = 0, keys: list[str] | None = None) -> tuple[str, int | None]:
    """The canonical text (``json.dumps``'s spacing and escapes) of the JSON value that starts at or after ``i``,
    as far as it is certain, and the index after the value once it is whole (None while it is not). ``keys``
    collects the keys of a top-level object as each is written whole."""
    out: list[str] = []
    depth = 0
    object_top = key_next = False
    while i < len(text):
        ch = text[i]
        if ch.isspace():
            i += 1
            continue
        if ch in "{[":
            depth += 1
            object_top = object_top or (depth == 1 and ch == "{")
            key_next = object_top and depth == 1
            out.append(ch)
            i += 1
        elif ch in "}]":
            depth -= 1
            out.append(ch)
            i += 1
        elif ch == ",":
            key_next = object_top and depth == 1
            out.append(", ")
            i += 1
            continue
        elif ch == ":":
            out.append(": ")
            i += 1
            continue
        elif ch == '"':
            written, decoded, end = _string(text, i)
            out.append(written)
            if end is None:
                return "".join(out), None
            if key_next and depth == 1 and keys is not None:
                keys.append(decoded)
            key_next = False
            i = end
        else:
            match = _SCALAR.match(text, i)
            if match is None or match.end() == len(text):  # not a value, or one that may go on
                return "".join(out), None
            try:
                value = json.loads(match.group())
            except ValueError:
                return "".join(out), None
            out.append(json.dumps(value))
            i = match.end()
        if depth <= 0:
            return "".join(out), i
    return "".join(out), None


def json_call(text: str, i: int = 0) -> CallSoFar | None:
    """A JSON call object (``{"name": ..., "arguments": {...}}``, its keys in either order) that starts at or after
    ``i``, as far as it is written; None before its opening brace."""
    i = skip_space(text, i)
    if i >= len(text) or text[i] != "{":
        return None
    i += 1
    name, arguments, keys = None, "", []
    while True:
        i = skip_space(text, i)
        if i < len(text) and text[i] == "}":
            return CallSoFar(name, arguments, tuple(keys), i + 1)
        if i >= len(text) or text[i] not in ',"':
            return CallSoFar(name, arguments, tuple(keys))
        if text[i] == ",":
            i += 1
            continue
        _, key, end = _string(text, i)
        i = skip_space(text, end) if end is not None else len(text)
        if i >= len(text) or text[i] != ":":
            return CallSoFar(name, arguments, tuple(keys))
        i = skip_space(text, i + 1)
        if i >= len(text):
            return CallSoFar(name, arguments, tuple(keys))
        if key == "name" and text[i] == '"':
            _, written, end = _string(text, i)
            name = written if end is not None else name
        elif key == "arguments" and text[i] == "{":  # string-form arguments are sent whole, at the end
            keys = []
            arguments, end = json_prefix(text, i, keys)
        else:
            _, end = json_prefix(text, i)
        if end is None:
            return CallSoFar(name, arguments, tuple(keys))
        i = end
