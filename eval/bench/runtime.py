"""Prefill speed of the hypic-rag runtime against transformers' forward on the same checkpoint.

Both run in one process on one random-weight checkpoint with the layer shapes of a published
Qwen3.5 model (fewer layers), interleaved per repeat, and only the ratio is reported as the result:
absolute times on a shared machine are noise.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from hypic_rag.model import load_model

from .common import layer_shapes, random_checkpoint, speedup, timed


def run(
    lengths: Sequence[int] = (4096, 16384),
    layers: int = 4,
    repeats: int = 3,
    seed: int = 0,
    log: Callable[[str], None] = print,
    shapes: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Best-of-``repeats`` prefill time of each implementation at each length, and their ratio.

    ``shapes`` replaces the Qwen3.5-0.8B layer shapes (tests use tiny ones)."""
    if layers < 1:
        raise ValueError("layers must be >= 1")
    shapes = layer_shapes(layers, shapes)
    log(f"building a random qwen3_5_text checkpoint with {layers} layers (hidden {shapes['hidden_size']})")
    with random_checkpoint(shapes, seed) as (reference, path):
        ours = load_model(path)
    results: list[dict[str, Any]] = []
    ratios: dict[str, float] = {}
    gen = torch.Generator().manual_seed(seed)
    with torch.inference_mode():
        for n in lengths:
            ids = torch.randint(0, shapes["vocab_size"], (1, n), generator=gen)
            best = {"transformers": float("inf"), "hypic-rag": float("inf")}
            for r in range(repeats):
                # Alternate which goes first, so neither always runs on a freshly freed heap.
                if r % 2:
                    t_our, our_logits = timed(lambda x=ids: ours(x, logits_to_keep=1))
                t_ref, ref_logits = timed(lambda x=ids: reference(x, logits_to_keep=1, use_cache=False).logits)
                if not r % 2:
                    t_our, our_logits = timed(lambda x=ids: ours(x, logits_to_keep=1))
                best["transformers"] = min(best["transformers"], t_ref)
                best["hypic-rag"] = min(best["hypic-rag"], t_our)
                log(f"  {n} tokens, repeat {r + 1}/{repeats}: transformers {t_ref:.2f}s, hypic-rag {t_our:.2f}s")
            diff = float((ref_logits.float() - our_logits.float()).abs().max())
            for impl, t in best.items():
                results.append({"impl": impl, "prompt_tokens": n, "prefill_s": t, "layers": layers})
            ratios[str(n)] = speedup(best, base="transformers")["hypic-rag"]
            log(f"{n} tokens: transformers/hypic-rag = {ratios[str(n)]:.2f}x (max |logit diff| {diff:.1e})")
            results[-1]["max_abs_logit_diff"] = diff
    return {
        "benchmark": "runtime_prefill",
        "config": shapes,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "results": results,
        "speedup_vs_transformers": ratios,
    }
