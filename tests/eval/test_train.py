"""The training script: reproducible from one command, and its checkpoint serves in both runtimes."""

from __future__ import annotations

import argparse

import torch
from safetensors.torch import load_file

from hypic_rag import Engine
from hypic_rag.eval.train import SPECIALS, run
from hypic_rag.model.parity import load_reference, logits_max_diff


def _args(out) -> argparse.Namespace:
    return argparse.Namespace(
        out=str(out), steps=3, seed=0, examples=30, eval_examples=2, eval_every=3, vocab=400, hidden=64,
        layers="linear_attention,full_attention", max_len=640, batch=2, lr=3e-3, warmup=2, questions=2,
        context_loss=0.3, threads=0, attn_head_dim=32, curriculum=0.0,
    )  # fmt: skip


def test_training_is_reproducible_and_the_checkpoint_loads_everywhere(tmp_path):
    report = run(_args(tmp_path / "a"))
    run(_args(tmp_path / "b"))
    a, b = load_file(tmp_path / "a" / "model.safetensors"), load_file(tmp_path / "b" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert [r["step"] for r in report["curves"]] == [3]
    engine = Engine.from_pretrained(tmp_path / "a")
    assert all(len(engine.encode(tag)) == 1 for tag in SPECIALS)
    assert engine.eos_token_ids == (engine.tokenizer.token_to_id("</a>"),)
    ids = torch.randint(0, engine.config.vocab_size, (1, 40), generator=torch.Generator().manual_seed(0))
    assert logits_max_diff(engine.model, load_reference(tmp_path / "a"), ids) < 1e-4
