"""The tail of a streamed text that may still begin a tag (a stop string, a tool-call or reasoning tag): what a
stream holds back until the next characters say. One home for the decoder's stop strings and the chat streams."""

from __future__ import annotations

from collections.abc import Sequence


def partial_suffix(text: str, tags: Sequence[str]) -> int:
    """Length of the longest tail of ``text`` that is a proper prefix of one of ``tags``: what a stream holds
    back until it knows whether a tag (a stop string, a tool-call tag) begins there. Only the last ``len(tag) - 1``
    characters are read, and each candidate start is one where the tag's first character sits, so the work per
    call is bounded by the tags' lengths, not the text's."""
    best = 0
    for tag in tags:
        if len(tag) < 2:
            continue
        tail = text[-(len(tag) - 1) :]
        at = tail.find(tag[0])
        while 0 <= at < len(tail) - best:  # the earliest start is the longest tail
            if tag.startswith(tail[at:]):
                best = len(tail) - at
                break
            at = tail.find(tag[0], at + 1)
    return best
