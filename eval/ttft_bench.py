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
from hypic_rag.testing.synthetic import QWEN3_5_0_8B_SHAPES, build_reference_model, hybrid_layer_types

IMPLEMENTATIONS = (*MODES, "transformers")


def _setup(
    layers: int, shapes: dict[str, Any] | None, log: Callable[[str], None], **options: Any
) -> tuple[Engine, Any, int]:
    """A random checkpoint (Qwen3.5-0.8B layer shapes unless ``shapes``), transformers' model of it and
    an engine on it that caches segments of any length; ``options`` go to the engine."""
    shapes = {**(shapes or QWEN3_5_0_8B_SHAPES), "num_hidden_layers": layers, "max_position_embeddings": 262144}
    shapes["layer_types"] = hybrid_layer_types(layers)
    log(f"random qwen3_5_text, hidden {shapes['hidden_size']}, {layers} layers")
    reference = build_reference_model("qwen3_5_text", shapes)
    with tempfile.TemporaryDirectory() as tmp:
        reference.save_pretrained(tmp)
        engine = Engine.from_pretrained(tmp, **{"min_cached_tokens": 1, **options})
    return engine, reference, shapes["vocab_size"]


class Prompts:
    """Random-token segments for one benchmark run (fresh ids for every new segment)."""

    def __init__(self, vocab: int, seed: int = 0) -> None:
        self.gen, self.vocab = torch.Generator().manual_seed(seed), vocab

    def segments(self, n: int, length: int, kind: str = "document") -> list[Segment]:
        return [
            Segment(token_ids=torch.randint(3, self.vocab, (length,), generator=self.gen).tolist(), kind=kind)
            for _ in range(n)
        ]


def reordered(segments: list[Segment]) -> list[Segment]:
    """The same segments in another order, the first one moved (so exact prefix reuse finds nothing)."""
    order = list(range(len(segments)))
    random.Random(0).shuffle(order)
    if len(order) > 1 and order[0] == 0:
        order = order[1:] + order[:1]
    return [segments[i] for i in order]


def measure(
    engine: Engine,
    reference: Any,
    docs: list[Segment],
    query: Segment,
    mode: str,
    warm: list[Segment] | None,
    repeats: int,
    seam: int | float | None = None,
) -> dict[str, Any]:
    """Best-of-``repeats`` TTFT of one mode; ``warm`` segments are cached by an earlier request first."""
    ids = torch.tensor([[i for s in [*docs, query] for i in s.token_ids]])
    best, stats = float("inf"), {}
    for _ in range(repeats):
        if mode == "transformers":
            with torch.inference_mode():
                start = time.perf_counter()
                int(reference(ids, logits_to_keep=1, use_cache=False).logits[0, -1].argmax())
                t = time.perf_counter() - start
            stats = {"hit_segments": 0, "recomputed_tokens": ids.shape[1]}
        else:
            engine.clear_cache()
            if warm and mode in ("prefix", "pic", "hypic"):
                engine.generate(warm, query, mode=mode, max_new_tokens=1, seam=seam)
            out = engine.generate(docs, query, mode=mode, max_new_tokens=1, seam=seam)
            t, stats = out.ttft_s, out.stats
        best = min(best, t)
    return {
        "mode": mode,
        "ttft_s": best,
        "prompt_tokens": ids.shape[1],
        "segments": len(docs),
        "hit_ratio": stats.get("hit_segments", 0) / len(docs),
        "recomputed_tokens": stats.get("recomputed_tokens", ids.shape[1]),
        "cache_bytes": stats.get("cache_bytes", 0),
    }


def _check(modes: Sequence[str]) -> None:
    unknown = [m for m in modes if m not in IMPLEMENTATIONS]
    if unknown or "full" not in modes:
        raise ValueError(f"modes must include 'full' and come from {', '.join(IMPLEMENTATIONS)}; got {list(modes)}")


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
    _check(modes)
    if min(segments, segment_tokens, query_tokens, repeats, layers) < 1:
        raise ValueError("segments, segment_tokens, query_tokens, repeats and layers must be >= 1")
    engine, reference, vocab = _setup(layers, shapes, log)
    log(f"{segments} segments x {segment_tokens} tokens + {query_tokens}-token query, warm and reordered")
    prompts = Prompts(vocab)
    docs = prompts.segments(segments, segment_tokens)
    query = prompts.segments(1, query_tokens, "query")[0]
    results = []
    for mode in modes:
        row = measure(engine, reference, docs, query, mode, reordered(docs), repeats)
        results.append(row)
        log(f"  {mode:<13} TTFT {row['ttft_s']:8.3f}s  hit ratio {row['hit_ratio']:.2f}")
    speedup = _speedup(results)
    log("speedup over full: " + ", ".join(f"{m} {v:.2f}x" for m, v in speedup.items()))
    return {"benchmark": "ttft", "threads": torch.get_num_threads(), "results": results, "speedup": speedup}


def _speedup(rows: list[dict[str, Any]]) -> dict[str, float]:
    full = next(r["ttft_s"] for r in rows if r["mode"] == "full")
    return {r["mode"]: full / r["ttft_s"] for r in rows if r["mode"] != "full"}
