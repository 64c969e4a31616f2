"""The tokenizer of a checkpoint directory (its end-of-sequence ids are in ``generation_config``).

We read ``tokenizer.json`` with the ``tokenizers`` library rather than transformers' AutoTokenizer:
it is the same fast tokenizer, without importing transformers at run time.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from tokenizers import Tokenizer


def load_tokenizer(path: Path) -> Tokenizer | None:
    file = path / "tokenizer.json"
    if not file.is_file():
        return None
    try:
        return Tokenizer.from_file(str(file))
    except Exception as exc:  # tokenizers raises a bare Exception on a malformed file
        raise ValueError(f"cannot read tokenizer {file}: {exc}") from exc


def control_tokens(tokenizer: Tokenizer) -> dict[str, int]:
    """The tokenizer's added tokens (special or not: ``<|im_end|>``, ``<tool_call>``, ``</q>``), text to id: the
    ids a template's structure is made of, which text from a caller must never produce."""
    return {token.content: i for i, token in tokenizer.get_added_tokens_decoder().items()}


_PLAIN: dict[int, tuple[Tokenizer, Tokenizer]] = {}  # id(tokenizer) -> (tokenizer, its copy without added tokens)


def _plain(tokenizer: Tokenizer) -> Tokenizer:
    """``tokenizer`` without its added tokens: text spelling one is split as any other text (what transformers'
    ``split_special_tokens`` does, for added tokens that are not marked special too)."""
    known = _PLAIN.get(id(tokenizer))
    if known is None:
        data = json.loads(tokenizer.to_str())
        data["added_tokens"] = []
        known = _PLAIN[id(tokenizer)] = (tokenizer, Tokenizer.from_str(json.dumps(data)))
    return known[1]


def literal_ids(tokenizer: Tokenizer, text: str, literal: Sequence[tuple[int, int]]) -> list[int] | None:
    """The ids of ``text`` when a control token overlaps one of the character spans ``literal`` (text a caller
    wrote), with each such token split as plain text and every other one kept; None when none does, so that
    ``text`` is tokenized as ever. Added tokens are cut out before the model tokenizes the rest, so the text
    between two kept control tokens is tokenized by the copy without added tokens exactly as it would be."""
    encoding = tokenizer.encode(text, add_special_tokens=False)
    controls = set(tokenizer.get_added_tokens_decoder())

    def forged(start: int, end: int) -> bool:
        return any(start < b and a < end for a, b in literal)

    kept = [
        (i, start, end)
        for i, (start, end) in zip(encoding.ids, encoding.offsets, strict=True)
        if i in controls and not forged(start, end)
    ]
    if sum(i in controls for i in encoding.ids) == len(kept):
        return None
    plain, ids, at = _plain(tokenizer), [], 0
    for i, start, end in kept:
        ids += plain.encode(text[at:start], add_special_tokens=False).ids if start > at else []
        ids.append(i)
        at = end
    ids += plain.encode(text[at:], add_special_tokens=False).ids if at < len(text) else []
    return ids
