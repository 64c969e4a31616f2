"""The peer benchmark's bandwidth figures (eval/bench/peer.py): what a decode step reads, and its rate."""

from __future__ import annotations

import torch

from hypic_rag.eval.bench import peer
from hypic_rag.eval.bench.common import layer_shapes, random_model
from hypic_rag.eval.bench.peer import bandwidths, read_bandwidth, step_bytes
from hypic_rag.model.linear import Linear

SMALL = {"hidden_size": 64, "intermediate_size": 128, "vocab_size": 512, "num_attention_heads": 2}


def test_a_step_reads_every_weight_but_the_embedding_table_unless_the_head_shares_it():
    model = random_model(layer_shapes(2, None, **SMALL, tie_word_embeddings=False))
    every = sum(p.numel() * 4 for p in model.parameters())
    table = 512 * 64 * 4
    assert step_bytes(model) == every - table  # one row of the table a sequence, not all of it
    projections = sum(m.weight.numel() for m in model.modules() if isinstance(m, Linear))
    rows = sum(m.weight.shape[0] for m in model.modules() if isinstance(m, Linear))
    assert step_bytes(model, "int8") == every - table - 3 * projections + 4 * rows  # a byte a weight, a scale a row
    assert step_bytes(model, "q8_0") == int(every - table - projections * (4 - 34 / 32))
    model.lm_head.weight = next(m for m in model.modules() if isinstance(m, torch.nn.Embedding)).weight
    assert step_bytes(model) == sum(p.numel() * 4 for p in model.parameters())  # the head reads it whole


def test_a_steps_rate_is_its_bytes_over_the_seconds_of_one_token_of_each_sequence(monkeypatch):
    speeds = {1: {"decode_tokens_per_s": 10.0}, 4: {"decode_tokens_per_s": 20.0}}
    assert bandwidths(speeds, 3_000_000_000) == {"1": 30e9, "4": 15e9}
    # the machine's rate is the buffer's bytes over the fastest of its reads (a clock that answers 0, 2, 2, 2.5,
    # 2.5, 3.5: reads of 2, 0.5 and 1 s), not a timing the test depends on
    ticks = iter([0.0, 2.0, 2.0, 2.5, 2.5, 3.5])
    monkeypatch.setattr(peer.time, "perf_counter", lambda: next(ticks))
    assert read_bandwidth(1, size=1 << 20, repeats=3) == (1 << 20) / 0.5
