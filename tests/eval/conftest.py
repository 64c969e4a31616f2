from __future__ import annotations

import argparse

import pytest

from hypic_rag.eval.train.train import TRAIN_MIX


def _args(out) -> argparse.Namespace:
    return argparse.Namespace(
        out=str(out), steps=3, seed=0, examples=30, eval_examples=2, eval_every=3, vocab=400, hidden=64,
        layers="linear_attention,full_attention", max_len=640, batch=2, lr=3e-3, warmup=2, questions=2,
        context_loss=0.3, threads=0, device="cpu", attn_head_dim=32, curriculum=0.0, recall=0.25,
        init=None, grow=False, drills=0, drill_spaces=False, mix=",".join(TRAIN_MIX), broad_recall=False,
        phrase_recall=True, conv_kernel=4, sentences=0.0, sentence_lists=False,
    )  # fmt: skip


@pytest.fixture(scope="session")
def train_args():
    """``train_args(out)`` -> the training script's arguments for a 3-step run of a tiny model into ``out``."""
    return _args
