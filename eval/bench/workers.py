"""Cold prefill fanned out over Ray workers: TTFT of a cold request with its misses prefilled in process, or
on 1 and 2 Ray actors (one torch thread each).

    python -m hypic_rag.eval.bench.workers --json workers.json

A random checkpoint (Qwen3.5-0.8B layer shapes, ``layers`` decoder layers), ``segments`` fresh documents of
``segment_tokens`` random tokens per trial (all miss), best of ``repeats``. The in-process policy is measured
with 1 torch thread and with as many as the machine has, and the ideal for this machine is the 1-thread time
over its core count.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from hypic_rag import Engine

from .common import RandomSegments, best_of, layer_shapes, random_checkpoint, write_report


def run(
    segments: int = 8,
    segment_tokens: int = 1024,
    query_tokens: int = 64,
    layers: int = 4,
    repeats: int = 2,
    workers: tuple[int, ...] = (1, 2),
    log: Callable[[str], None] = print,
    shapes: dict[str, Any] | None = None,
) -> dict[str, Any]:
    import ray

    cores = os.cpu_count() or 1
    random = RandomSegments((shapes or {}).get("vocab_size", 248320), seed=5)

    def cold(engine: Engine) -> Callable[[], tuple[float, dict]]:
        def trial() -> tuple[float, dict]:
            docs = random.segments(segments, segment_tokens)
            out = engine.generate(docs, random.segment(query_tokens, "query"), max_new_tokens=1)
            assert out.stats["miss_segments"] == segments
            return out.ttft_s, out.stats

        return trial

    results: dict[str, float] = {}
    config = layer_shapes(layers, shapes, max_position_embeddings=262144)
    log(f"random qwen3_5_text, hidden {config['hidden_size']}, {layers} layers; {segments} x {segment_tokens} cold")
    with random_checkpoint(config) as (_, path):
        local = Engine.from_pretrained(path, min_cached_tokens=1)
        threads = torch.get_num_threads()
        for n in sorted({1, cores}):
            torch.set_num_threads(n)
            cold(local)()  # warm-up
            results[f"in_process_{n}_threads"] = best_of(repeats, cold(local))[0]
            log(f"  in process, {n} thread(s): {results[f'in_process_{n}_threads']:.2f}s")
        torch.set_num_threads(1)
        for n in workers:
            engine = Engine.from_pretrained(path, min_cached_tokens=1, prefill_workers=n)
            cold(engine)()
            results[f"ray_{n}_workers"] = best_of(repeats, cold(engine))[0]
            log(f"  Ray, {n} worker(s): {results[f'ray_{n}_workers']:.2f}s")
            engine.prefill_pool.close()
        torch.set_num_threads(threads)
        ray.shutdown()
    base = results["in_process_1_threads"]
    results["ideal"] = base / cores
    log(f"  ideal on {cores} cores: {results['ideal']:.2f}s")
    return {
        "benchmark": "workers",
        "segments": segments,
        "segment_tokens": segment_tokens,
        "layers": layers,
        "cores": cores,
        "ttft_s": results,
        "speedup_vs_in_process_1_thread": {k: base / v for k, v in results.items()},
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--segments", type=int, default=8)
    parser.add_argument("--segment-tokens", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    report = run(args.segments, args.segment_tokens, 64, args.layers, args.repeats)
    if args.json:
        write_report(report, args.json, "workers")


if __name__ == "__main__":
    main()
