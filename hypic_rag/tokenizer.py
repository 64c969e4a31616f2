"""The tokenizer of a checkpoint directory (its end-of-sequence ids are in ``generation_config``).

We read ``tokenizer.json`` with the ``tokenizers`` library rather than transformers' AutoTokenizer:
it is the same fast tokenizer, without importing transformers at run time.
"""

from __future__ import annotations

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
