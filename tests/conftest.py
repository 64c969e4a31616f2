from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hypic_rag.model.synthetic import build_checkpoint


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory: pytest.TempPathFactory):
    """``checkpoint(kind)`` -> directory of a saved tiny random checkpoint, built once per session."""
    built: dict[str, Path] = {}

    def get(kind: str) -> Path:
        if kind not in built:
            built[kind] = build_checkpoint(kind, tmp_path_factory.mktemp(kind))
        return built[kind]

    return get


def load_reference(path: Path) -> torch.nn.Module:
    """transformers' own model for a checkpoint, in fp32 on CPU."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def reference():
    return load_reference
