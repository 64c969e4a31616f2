"""``hypic-rag bench``: TTFT of each mode, and of transformers' own forward, on one checkpoint in one run.

The standard case: a random-weight checkpoint with the layer shapes of Qwen3.5-0.8B (4 layers, 3
linear : 1 full); a warm prompt of 8 documents x 1k tokens plus a 64-token query, where warm means
every document was cached by an earlier request with the documents in another order (as in RAG
traffic, so exact prefix reuse stops at the first document that moved; the timed prompt itself is
never repeated). Speedup is the TTFT of ``full`` over each mode's, both measured here.
"""

from __future__ import annotations

import random
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from hypic_rag import Engine, Segment
from hypic_rag.engine import MODES
from hypic_rag.model.synthetic import QWEN3_5_0_8B_SHAPES, build_reference_model, hybrid_layer_types

IMPLEMENTATIONS = (*MODES, "transformers")


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
    """API.md's bench JSON; ``shapes`` replaces the Qwen3.5-0.8B layer shapes (tests use tiny ones)."""
    unknown = [m for m in modes if m not in IMPLEMENTATIONS]
    if unknown or "full" not in modes:
        raise ValueError(f"modes must include 'full' and come from {', '.join(IMPLEMENTATIONS)}; got {list(modes)}")
    if min(segments, segment_tokens, query_tokens, repeats, layers) < 1:
        raise ValueError("segments, segment_tokens, query_tokens, repeats and layers must be >= 1")
    shapes = {**(shapes or QWEN3_5_0_8B_SHAPES), "num_hidden_layers": layers, "max_position_embeddings": 262144}
    shapes["layer_types"] = hybrid_layer_types(layers)
    log(
        f"random qwen3_5_text, hidden {shapes['hidden_size']}, {layers} layers; "
        f"{segments} segments x {segment_tokens} tokens + {query_tokens}-token query"
    )
    reference = build_reference_model("qwen3_5_text", shapes)
    with tempfile.TemporaryDirectory() as tmp:
        reference.save_pretrained(tmp)
        engine = Engine.from_pretrained(tmp)
    gen = torch.Generator().manual_seed(0)
    vocab = shapes["vocab_size"]
    docs = [
        Segment(token_ids=torch.randint(3, vocab, (segment_tokens,), generator=gen).tolist()) for _ in range(segments)
    ]
    query = Segment(token_ids=torch.randint(3, vocab, (query_tokens,), generator=gen).tolist(), kind="query")
    ids = torch.tensor([[i for s in [*docs, query] for i in s.token_ids]])
    order = list(range(segments))
    random.Random(0).shuffle(order)
    if segments > 1 and order[0] == 0:
        order = order[1:] + order[:1]
    earlier = [docs[i] for i in order]
    results = []
    for mode in modes:
        best, stats = float("inf"), {}
        for _ in range(repeats):
            if mode == "transformers":
                with torch.inference_mode():
                    start = time.perf_counter()
                    int(reference(ids, logits_to_keep=1, use_cache=False).logits[0, -1].argmax())
                    t = time.perf_counter() - start
                stats = {"hit_segments": 0}
            else:
                engine.clear_cache()
                if mode in ("prefix", "pic", "hypic"):
                    engine.generate(earlier, query, mode=mode, max_new_tokens=1)  # the earlier request
                out = engine.generate(docs, query, mode=mode, max_new_tokens=1)
                t, stats = out.ttft_s, out.stats
            best = min(best, t)
        row = {
            "mode": mode,
            "ttft_s": best,
            "prompt_tokens": ids.shape[1],
            "segments": segments,
            "hit_ratio": stats.get("hit_segments", 0) / segments,
            "recomputed_tokens": stats.get("recomputed_tokens", ids.shape[1]),
        }
        results.append(row)
        log(f"  {mode:<13} TTFT {best:8.3f}s  hit ratio {row['hit_ratio']:.2f}")
    full = next(r["ttft_s"] for r in results if r["mode"] == "full")
    speedup = {r["mode"]: full / r["ttft_s"] for r in results if r["mode"] != "full"}
    log("speedup over full: " + ", ".join(f"{m} {v:.2f}x" for m, v in speedup.items()))
    return {"benchmark": "ttft", "threads": torch.get_num_threads(), "results": results, "speedup": speedup}
