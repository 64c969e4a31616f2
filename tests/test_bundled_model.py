"""The bundled default model: the file the README names, loadable by both runtimes with matching logits."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import torch

from hypic_rag import Engine
from hypic_rag.engine import default_model_path
from hypic_rag.eval.data import make
from hypic_rag.testing.parity import assert_matches_transformers

README = Path(__file__).resolve().parents[1] / "README.md"


def test_checkpoint_matches_the_readme_hash_and_size_budget():
    weights = default_model_path() / "model.safetensors"
    stated = re.search(r"model\.safetensors` sha256 `([0-9a-f]{64})`", README.read_text())
    assert stated, "the README must give the bundled checkpoint's sha256"
    assert hashlib.sha256(weights.read_bytes()).hexdigest() == stated.group(1)
    assert sum(f.stat().st_size for f in default_model_path().iterdir()) <= 30 * 2**20


def test_loads_in_both_runtimes_with_matching_logits():
    engine = Engine.from_pretrained()
    ex = make("single_doc", 1, 4)[0]
    ids = [i for s in ex.segments for i in engine.encode(s.text)]
    assert_matches_transformers(engine.model, default_model_path(), torch.tensor([ids]))
    assert engine.eos_token_ids == (engine.tokenizer.token_to_id("</a>"),)
    layers = engine.config.layer_types
    assert layers.count("linear_attention") == 3 * layers.count("full_attention") > 0  # real hybrids' 3 : 1


def test_chains_two_facts_through_its_reasoning():
    """``multi_hop`` (a person's company, then where it is headquartered) is what v3 could not do: 12 of 60
    second hops right, every other another company's HQ city. v4 learnt it from dense sentence drills."""
    engine = Engine.from_pretrained()
    examples = make("multi_hop", 12, 7)
    for mode in ("full", "hypic"):
        outs = [engine.chat(ex.messages, max_new_tokens=40, mode=mode) for ex in examples]
        right = [out.text.strip() == ex.answers[0] for out, ex in zip(outs, examples, strict=True)]
        seen = [(out.reasoning, out.text, ex.answers[0]) for out, ex in zip(outs, examples, strict=True)]
        assert sum(right) >= 10, (mode, seen)
        for out, ex, ok in zip(outs, examples, right, strict=True):
            assert not ok or out.reasoning.strip() == ex.meta["reasoning"][ex.query]  # right by the chain, not a guess
