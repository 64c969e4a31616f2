"""Our top-level ``kernels/`` folder never stands in for Hugging Face's ``kernels`` distribution, the import name
transformers probes and imports: Python run from the repository root (``python -c``, ``-m``) puts the folder on
``sys.path`` first, where a regular package would win. Each check runs a fresh interpreter there."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]


def _run_at_root(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_kernels_at_the_repository_root_is_the_distribution_or_absent():
    out = json.loads(
        _run_at_root(
            "import importlib.metadata as m, json, kernels\n"
            "try:\n    version = m.version('kernels')\nexcept m.PackageNotFoundError:\n    version = None\n"
            "print(json.dumps([getattr(kernels, '__file__', None), version]))"
        )
    )
    where, version = out
    if version is None:  # not installed: an empty module, no file, which transformers reads as absent
        assert where is None
    else:  # installed: the distribution's own files
        assert where is not None and not Path(where).resolve().is_relative_to(ROOT / "kernels"), where


def test_transformers_builds_a_model_from_the_repository_root():
    out = _run_at_root(
        "from transformers import LlamaConfig, LlamaForCausalLM\n"
        "from transformers.utils.import_utils import is_kernels_available\n"
        "import hypic_rag.kernels as ours\n"
        "config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,"
        " num_key_value_heads=2, vocab_size=100)\n"
        "LlamaForCausalLM(config)\n"
        "import kernels\n"
        "print(callable(ours.transition), kernels is not ours)"
    )
    assert out.split() == ["True", "True"]
