"""What the Qwen formats share: calls written in ``<tool_call>`` blocks, scanned out of an answer's text.

A block parser reads from just after its opening tag and returns the calls and where the block ends, or None
when the block does not parse; the block is then kept verbatim, up to its ``</tool_call>`` or the next
``<tool_call>``.
"""

from __future__ import annotations

from collections.abc import Callable

from .base import Calls
from .partial import skip_space

TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"

Parser = Callable[[str, int], "tuple[Calls, int] | None"]


def scan(text: str, block: Parser, bare: tuple[str, Parser] | None = None) -> tuple[str, Calls]:
    """Calls out of ``<tool_call>`` blocks (and out of calls written without one, ``bare``: their opening tag and
    parser); the rest is content."""
    pieces: list[str] = []
    calls: Calls = []
    pos = 0
    while True:
        start = text.find(TOOL_OPEN, pos)
        bare_start = text.find(bare[0], pos) if bare is not None else -1
        if bare is not None and bare_start >= 0 and (start < 0 or bare_start < start):
            found = bare[1](text, bare_start)
            if found is None:  # prose that mentions the tag: content, and look on after it
                pieces.append(text[pos : bare_start + len(bare[0])])
                pos = bare_start + len(bare[0])
                continue
            pieces.append(text[pos:bare_start])
            calls.extend(found[0])
            pos = found[1]
            continue
        if start < 0:
            pieces.append(text[pos:])
            break
        pieces.append(text[pos:start])
        found = block(text, start + len(TOOL_OPEN))
        if found is None:
            end = _malformed_end(text, start)
            pieces.append(text[start:end])
            pos = end
            continue
        calls.extend(found[0])
        pos = found[1]
    return "".join(pieces).strip(), calls


def _malformed_end(text: str, start: int) -> int:
    """Where a block that did not parse ends: after its ``</tool_call>``, at the next ``<tool_call>``, or the end."""
    ends = [len(text)]
    close = text.find(TOOL_CLOSE, start)
    if close >= 0:
        ends.append(close + len(TOOL_CLOSE))
    reopen = text.find(TOOL_OPEN, start + len(TOOL_OPEN))
    if reopen >= 0:
        ends.append(reopen)
    return min(ends)


def block_close(text: str, i: int) -> int | None:
    """The end of a block whose body ended at ``i``: after ``</tool_call>``, or the end of output cut off there."""
    i = skip_space(text, i)
    if text.startswith(TOOL_CLOSE, i):
        return i + len(TOOL_CLOSE)
    return i if i == len(text) else None
