"""Prompt pieces: each segment is tokenized on its own, so its ids do not depend on its neighbours."""

from __future__ import annotations

from dataclasses import dataclass

KINDS = ("system", "document", "tool", "memory", "turn", "query")


def check_unicode(text: str, what: str) -> None:
    """Text a tokenizer can take: a lone surrogate (from a bad decode upstream) is a ValueError, not a crash."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{what} is not valid Unicode: {exc.reason} at position {exc.start}") from None


@dataclass(frozen=True)
class Segment:
    """One recurring piece of a prompt: give exactly one of ``text`` and ``token_ids``."""

    text: str | None = None
    token_ids: tuple[int, ...] | None = None
    kind: str = "document"
    cache: bool = True  # False: always run in context (template glue), whatever its length

    def __init__(
        self,
        text: str | None = None,
        *,
        token_ids: list[int] | tuple[int, ...] | None = None,
        kind: str = "document",
        cache: bool = True,
    ) -> None:
        if (text is None) == (token_ids is None):
            raise ValueError("a Segment needs exactly one of text and token_ids")
        if text is not None and not isinstance(text, str):
            raise ValueError(f"Segment text must be a str, got {type(text).__name__}")
        if text is not None:
            check_unicode(text, "Segment text")
        if kind not in KINDS:
            raise ValueError(f"unknown segment kind {kind!r}; expected one of {', '.join(KINDS)}")
        ids = None
        if token_ids is not None:
            if not isinstance(token_ids, (list, tuple)):
                raise ValueError(f"Segment token_ids must be a list of ints, got {type(token_ids).__name__}")
            if not all(isinstance(i, int) and not isinstance(i, bool) for i in token_ids):
                raise ValueError("Segment token_ids must be a list of ints")
            ids = tuple(token_ids)
        object.__setattr__(self, "text", text)
        object.__setattr__(self, "token_ids", ids)
        if not isinstance(cache, bool):
            raise ValueError(f"Segment cache must be True or False, got {cache!r}")
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "cache", cache)


def as_query(query: str | Segment) -> Segment:
    if isinstance(query, Segment):
        return query
    if isinstance(query, str):
        return Segment(query, kind="query")
    raise ValueError(f"query must be a str or a Segment, got {type(query).__name__}")
