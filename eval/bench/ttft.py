"""``hypic-rag bench``: TTFT of each mode, and of transformers' own forward, on one checkpoint in one run.

The standard case: a random-weight checkpoint with the layer shapes of Qwen3.5-0.8B (4 layers, 3
linear : 1 full); a warm prompt of 8 documents x 1k tokens plus a 64-token query, where warm means
every document was cached by an earlier request with the documents in another order (as in RAG
traffic, so exact prefix reuse stops at the first document that moved; the timed prompt itself is
never repeated). Speedup is the TTFT of ``full`` over each mode's, both measured here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from .common import RandomSegments, check_modes, measure, random_engine, reordered, speedup


def run(
    segments: int = 8,
    segment_tokens: int = 1024,
    query_tokens: int = 64,
    modes: Sequence[str] = ("full", "prefix", "hypic", "transformers"),
    repeats: int = 2,
    layers: int = 4,
    log: Callable[[str], None] = print,
    shapes: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The bench JSON (docs/benchmarks.md); ``shapes`` replaces the Qwen3.5-0.8B layer shapes (tests use tiny ones)."""
    check_modes(modes)
    if min(segments, segment_tokens, query_tokens, repeats, layers) < 1:
        raise ValueError("segments, segment_tokens, query_tokens, repeats and layers must be >= 1")
    engine, reference, vocab = random_engine(layers, shapes, log)
    log(f"{segments} segments x {segment_tokens} tokens + {query_tokens}-token query, warm and reordered")
    prompts = RandomSegments(vocab)
    docs = prompts.segments(segments, segment_tokens)
    query = prompts.segment(query_tokens, "query")
    results = []
    for mode in modes:
        row = measure(engine, reference, docs, query, mode, reordered(docs), repeats)
        results.append(row)
        log(f"  {mode:<13} TTFT {row['ttft_s']:8.3f}s  hit ratio {row['hit_ratio']:.2f}")
    gain = speedup({r["mode"]: r["ttft_s"] for r in results})
    log("speedup over full: " + ", ".join(f"{m} {v:.2f}x" for m, v in gain.items()))
    return {"benchmark": "ttft", "threads": torch.get_num_threads(), "results": results, "speedup": gain}
