"""Fixtures for the chat tests: tiny tokenizer checkpoints that transformers can load, to compare against."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hypic_rag.testing.synthetic import TEMPLATES as SYNTHETIC_TEMPLATES

TEMPLATES = SYNTHETIC_TEMPLATES
SPECIAL_TOKENS = ["<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]


@pytest.fixture(scope="session")
def template_source() -> Callable[[str], str]:
    """``template_source(name)`` -> the text of ``hypic_rag/testing/templates/NAME.jinja`` (qwen3, qwen3_5, chatml)."""
    return lambda name: (TEMPLATES / f"{name}.jinja").read_text(encoding="utf-8")


def _write_tokenizer(directory: Path) -> None:
    """A word-level tokenizer.json: the chat tests render text only, so any tokenizer transformers loads will do."""
    from tokenizers import AddedToken, Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS + ["hello", "world"])}
    tokenizer = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = Whitespace()
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in SPECIAL_TOKENS])
    tokenizer.save(str(directory / "tokenizer.json"))


@pytest.fixture
def make_checkpoint(tmp_path: Path) -> Callable[..., Path]:
    """``make_checkpoint(chat_template=..., jinja=None, config=None, files=None)`` -> a tokenizer directory.

    ``chat_template`` goes into tokenizer_config.json (a string or a list of named templates, omitted when None),
    ``jinja`` into chat_template.jinja, ``config`` overrides the config's other entries (a value of None removes the
    key), and ``files`` maps further relative paths to their text.
    """
    count = 0

    def make(
        chat_template: str | list[dict[str, str]] | None = None,
        *,
        jinja: str | None = None,
        config: dict[str, Any] | None = None,
        files: dict[str, str] | None = None,
    ) -> Path:
        nonlocal count
        count += 1
        directory = tmp_path / f"checkpoint{count}"
        directory.mkdir()
        _write_tokenizer(directory)
        settings: dict[str, Any] = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>",
            "unk_token": "<unk>",
            "bos_token": None,
        }
        if chat_template is not None:
            settings["chat_template"] = chat_template
        for key, value in (config or {}).items():
            if value is None:
                settings.pop(key, None)
            else:
                settings[key] = value
        (directory / "tokenizer_config.json").write_text(json.dumps(settings, indent=2), encoding="utf-8")
        if jinja is not None:
            (directory / "chat_template.jinja").write_text(jinja, encoding="utf-8")
        for relative, text in (files or {}).items():
            (directory / relative).parent.mkdir(parents=True, exist_ok=True)
            (directory / relative).write_text(text, encoding="utf-8")
        return directory

    return make


@pytest.fixture(scope="session")
def reference_tokenizer() -> Callable[[Path], Any]:
    """``reference_tokenizer(path)`` -> transformers' tokenizer for the directory, the reference we match."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    return lambda path: AutoTokenizer.from_pretrained(str(path))
