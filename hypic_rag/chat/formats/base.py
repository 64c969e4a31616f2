"""What a chat format is: how one family of chat templates writes tool calls into an answer, how the engine
makes an answer begin with a call, and what a framework's messages must look like for its model.

The base class is the format of templates that take no tools: the whole answer (after its reasoning) is
content. Each other format is a module of this package (``detect`` picks one from a template's source); the
engine, the server's stream and the integrations ask the format, never branch on its name.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from .partial import CallSoFar

Calls = list[tuple[str, dict]]  # (name, arguments) in the order the answer wrote them


class ChatFormat:
    """A template family's tool-call format; this base writes none."""

    name = "none"
    call_tags: tuple[str, ...] = ()  # tags that open a call inside an answer: the content before one is final
    call_is_whole_answer = False  # a call, when there is one, is the whole answer (nothing streams before it)

    def matches(self, template_source: str) -> bool:
        """Whether a chat template's source renders this format (``detect`` asks in order)."""
        return False

    def split_calls(self, body: str, tools: Sequence[dict] | None) -> tuple[str, Calls]:
        """The content and the calls of an answer with its reasoning split off. A call that does not parse
        stays in the content verbatim: the caller sees what the model wrote instead of losing it."""
        return body, []

    def call_opening(self, name: str | None) -> str:
        """The text an answer is made to begin with so that it calls a tool (``name``, or any for None), in
        this format: what ``tool_choice`` ``"required"`` or a named function forces."""
        raise ValueError("this chat template has no tool-call format, so tool_choice cannot require a call")

    def cut_call(self, body: str) -> tuple[str, str | None, str] | None:
        """An answer cut (``max_new_tokens``) inside a call it began: the content before the call, the call's name
        as far as it was written (None before it), and its arguments' text so far; None when no call began."""
        return None

    def calls_so_far(self, body: str, tools: Sequence[dict] | None) -> list[CallSoFar]:
        """The calls an unfinished answer (its reasoning split off) has begun, in order, each as far as it is
        written (``partial``): what a stream may send of them before the answer is done."""
        return []

    def may_become_call(self, text: str) -> bool:
        """Whether an answer that begins with ``text`` (its reasoning split off) may still turn out to be a call
        written as the whole answer, so that none of it can be shown as content yet."""
        return False

    def prepare_messages(
        self, messages: Sequence[Mapping[str, Any]], segmentation: str = "auto"
    ) -> list[dict[str, Any]]:
        """OpenAI-style messages as a framework wrote them, in the form this format's model reads: as they are,
        but for the bundled model, which was trained on a normalised form (and whose template can cut flat text
        only where parts say so: ``segmentation`` is the request's)."""
        return [dict(m) for m in messages]

    def __repr__(self) -> str:
        return f"<chat format {self.name}>"


NONE = ChatFormat()


def format_tool_result(result: Any, *, ensure_ascii: bool = False) -> str:
    """A tool result as one canonical text, whatever JSON spacing the framework used.

    JSON objects and arrays (given as such, as JSON text, or as the Python literal that ``str()`` of a dict or
    list writes, as LlamaIndex's ``FunctionTool`` sends it) become compact JSON with sorted keys, the form the
    bundled model was trained on (``bundled.format_call`` and ``tool_step``), so the same result is the same
    tokens whichever way and wherever it arrived (in process or over HTTP), and its cache entry is found again.
    Other text is kept as written: a JSON scalar has no spacing to normalise and re-dumping would rewrite numbers
    such as ``1e5``; a Python literal past ``LITERAL_CHARS`` stays text (reading one is not free). None, booleans
    and numbers are written as JSON; other objects via ``str()``. Pass ``ensure_ascii=True`` to escape non-ASCII
    as the bundled model's training data did; real checkpoints read the characters themselves.
    """
    if isinstance(result, str):
        stripped = result.strip()
        if not stripped.startswith(("{", "[")):
            return result
        try:
            value = json.loads(stripped)
        except ValueError:
            value = _literal(stripped)
            if value is None:
                return result
        return _dump(value, ensure_ascii)
    if result is None or isinstance(result, dict | list | tuple | bool | int | float):
        return _dump(result, ensure_ascii)
    return str(result)


LITERAL_CHARS = 1 << 16  # the longest tool result read as a Python literal


def _literal(text: str) -> dict | list | tuple | None:
    """A dict, list or tuple written as a Python literal, or None for anything else."""
    if len(text) > LITERAL_CHARS:
        return None
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    return value if isinstance(value, dict | list | tuple) else None


def _dump(value: Any, ensure_ascii: bool) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=ensure_ascii, default=str)


_NAME = re.compile(r'"name"\s*:\s*"((?:[^"\\]|\\.)*)')
_ARGUMENTS = re.compile(r'"arguments"\s*:\s*')


def json_call_parts(call: str) -> tuple[str | None, str]:
    """The name (as far as written) and the arguments' text so far of a JSON call cut short: the arguments whole
    when their value is complete, else everything written of them."""
    name = _NAME.search(call)
    args = _ARGUMENTS.search(call)
    text = ""
    if args is not None:
        rest = call[args.end() :]
        try:
            value, _ = json.JSONDecoder().raw_decode(rest)
            text = json.dumps(value, ensure_ascii=False)
        except ValueError:
            text = rest
    return (name.group(1) if name else None), text
