"""The prompt format the bundled model is trained on.

Each segment carries its own wrapper (kind tag and delimiters) inside its text, so a segment's
tokens never depend on its neighbours and it can be cached wherever it appears. The query segment
ends with the answer tag, after which the model writes its answer and then the end tag.
"""

from __future__ import annotations

TAGS = {"system": "sys", "document": "doc", "tool": "tool", "memory": "mem", "turn": "turn", "query": "q"}
ANSWER = "<a>"
END = "</a>"


def wrap(kind: str, text: str) -> str:
    """A segment's full text: ``<doc>...</doc>`` and so on, newline-terminated."""
    if kind not in TAGS:
        raise ValueError(f"unknown segment kind {kind!r}; expected one of {', '.join(TAGS)}")
    tag = TAGS[kind]
    if kind == "query":
        return f"<{tag}>{text}</{tag}>\n{ANSWER}"
    return f"<{tag}>{text}</{tag}>\n"


def answer_text(answer: str) -> str:
    """What follows the query segment in training: the answer and the end tag."""
    return f"{answer}{END}"
