"""Tokenizer and end-of-sequence ids from a checkpoint directory.

We read ``tokenizer.json`` with the ``tokenizers`` library rather than transformers' AutoTokenizer:
it is the same fast tokenizer, without importing transformers at run time.
"""

from __future__ import annotations

import json
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


def eos_token_ids(path: Path, config_eos: tuple[int, ...]) -> tuple[int, ...]:
    """EOS ids of ``generation_config.json`` and ``config.json`` together."""
    ids = list(config_eos)
    gen = path / "generation_config.json"
    if gen.is_file():
        try:
            eos = json.loads(gen.read_text()).get("eos_token_id")
        except json.JSONDecodeError as exc:
            raise ValueError(f"{gen} is not valid JSON: {exc}") from exc
        for i in eos if isinstance(eos, list) else [] if eos is None else [eos]:
            if int(i) not in ids:
                ids.append(int(i))
    return tuple(ids)
