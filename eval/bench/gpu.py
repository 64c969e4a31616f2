"""One prepared run for a single GPU (sized to fit 8 minutes on an H200), every figure side by side:

    python -m hypic_rag.eval.bench.gpu --json bench-gpu.json

1. **Kernels on the device**: each Triton kernel against the torch reference on the same inputs (their largest
   difference, and both times; ``bench.kernels``).
2. **TTFT in bf16** at 16k, 32k and 64k tokens (segments of 2k, reordered after a warming request, a 64-token
   query) for ``full``, ``prefix`` and ``hypic``, and transformers' own forward on the same weights, on the
   Qwen3.5-0.8B layer shapes with 8 layers.
3. **Decode tokens/s by batch size** 1..32 in bf16 (``bench.batching``), against one request alone.

A section that would start after ``budget_s`` is skipped and says so, so the run ends in time whatever the
device. ``--device cpu --small`` runs the same code on tiny shapes (CI does; ``TRITON_INTERPRET=1`` runs the
kernels interpreted), and its times mean nothing.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from hypic_rag import Engine
from hypic_rag.testing.synthetic import TINY

from . import batching, kernels
from .common import RandomSegments, layer_shapes, random_checkpoint, reordered, write_report

MODES = ("full", "prefix", "hypic", "transformers")


def ttft(device: torch.device, small: bool, repeats: int, log: Callable[[str], None]) -> list[dict[str, Any]]:
    """Best-of-``repeats`` TTFT of each mode at each length, documents warm and reordered."""
    shapes = dict(TINY, max_position_embeddings=4096) if small else layer_shapes(8, max_position_embeddings=131072)
    dtype = torch.float32 if small else torch.bfloat16
    seg_len, lengths = (32, [128, 256]) if small else (2048, [16384, 32768, 65536])
    rows: list[dict[str, Any]] = []
    with random_checkpoint(shapes) as (reference, path):
        engine = Engine.from_pretrained(path, device=str(device), dtype=dtype, min_cached_tokens=1)
        reference = reference.to(device=device, dtype=dtype).eval()
        prompts = RandomSegments(shapes["vocab_size"], seed=1)
        query = prompts.segment(64, "query")
        for n in lengths:
            docs = prompts.segments(n // seg_len, seg_len)
            ids = torch.tensor([[i for s in [*docs, query] for i in s.token_ids]], device=device)
            times: dict[str, float] = {}
            for mode in MODES:
                best = float("inf")
                for _ in range(repeats):
                    if mode == "transformers":
                        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
                        with torch.inference_mode():
                            sync()
                            start = time.perf_counter()
                            reference(ids, logits_to_keep=1, use_cache=False)
                            sync()
                        best = min(best, time.perf_counter() - start)
                        continue
                    engine.clear_cache()
                    if mode != "full":
                        engine.generate(reordered(docs), query, mode=mode, max_new_tokens=1)
                    best = min(best, engine.generate(docs, query, mode=mode, max_new_tokens=1).ttft_s)
                times[mode] = best
            rows.append({"prompt_tokens": ids.shape[1], **{f"{m}_ttft_s": t for m, t in times.items()}})
            log(f"  {ids.shape[1]:>6} tokens: " + "  ".join(f"{m} {t:.3f}s" for m, t in times.items()))
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return rows


def run(
    device: str = "cuda",
    small: bool = False,
    repeats: int = 2,
    budget_s: float = 420.0,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("no CUDA device: this script is for a GPU (use --device cpu --small to check it runs)")
    began = time.perf_counter()
    report: dict[str, Any] = {
        "benchmark": "gpu",
        "device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
        "skipped": [],
    }
    sections: list[tuple[str, Callable[[], Any]]] = [
        ("kernels", lambda: kernels.kernels(dev, small, repeats, log)),
        ("ttft", lambda: ttft(dev, small, repeats, log)),
        (
            "decode",
            lambda: batching.run(
                layers=[2] if small else [4],
                batches=[1, 2, 4] if small else list(batching.BATCHES),
                prompt_tokens=8 if small else 512,
                steps=2 if small else 16,
                repeats=1 if small else repeats,
                log=log,
                shapes=TINY if small else None,
                device=dev,
                dtype=torch.float32 if small else torch.bfloat16,
            ),
        ),
    ]
    for name, section in sections:
        if time.perf_counter() - began > budget_s:
            report["skipped"].append(name)
            log(f"{name}: skipped, past the {budget_s:.0f} s budget")
            continue
        log(f"{name} on {dev}:")
        report[name] = section()
    report["wall_s"] = time.perf_counter() - began
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--small", action="store_true", help="tiny shapes, to check the script runs")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--budget-s", type=float, default=420.0, help="start no section after this many seconds")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    report = run(args.device, args.small, args.repeats, args.budget_s)
    if args.json:
        write_report(report, args.json, "gpu")


if __name__ == "__main__":
    main()
