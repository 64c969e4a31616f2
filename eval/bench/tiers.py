"""A warm ``hypic`` request served from each cache tier: memory, the local disk, and a Redis server on loopback.

    python -m hypic_rag.eval.bench.tiers --json tiers.json

One random checkpoint (Qwen3.5-0.8B layer shapes, ``layers`` decoder layers), ``segments`` documents of
``segment_tokens`` random tokens and a query. The documents are made once (memory, disk and Redis then all hold
them); each measurement then empties the memory tier and detaches the tiers it is not about, so that every entry
comes from the one tier measured; the best of ``repeats``. ``full`` on the same prompt is the reference. The
read rate is the entries' bytes over the time a tier adds to a memory hit: fetching, checking and decoding them.
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from hypic_rag import Engine
from hypic_rag.testing.redis import RedisServer

from .common import RandomSegments, best_of, random_engine, reordered, write_report


def run(
    segments: int = 4,
    segment_tokens: int = 1024,
    query_tokens: int = 64,
    layers: int = 2,
    repeats: int = 3,
    log: Callable[[str], None] = print,
    shapes: dict[str, Any] | None = None,
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp, RedisServer(Path(tmp) / "redis", maxmemory="2gb") as redis:
        # the segment tiers serve the warm request, not the state the first one kept in memory
        kwargs = {"cache_dir": Path(tmp) / "disk", "cache_url": redis.url, "keep_states": False}
        engine: Engine = random_engine(layers, shapes, log, **kwargs)[0]
        store = engine.segment_store
        disk, remote = store.disk, store.remote
        assert disk is not None and remote is not None
        random = RandomSegments(engine.config.vocab_size, seed=3)
        docs, query = random.segments(segments, segment_tokens), random.segment(query_tokens, "query")
        warm = reordered(docs)
        engine.generate(docs, query, max_new_tokens=1)  # made once: memory, disk and Redis hold them
        remote.flush()

        def trial(tier: str) -> Callable[[], tuple[float, dict]]:
            def once() -> tuple[float, dict]:
                if tier != "memory":
                    engine.memory.clear()
                store.disk, store.remote = (disk if tier == "disk" else None), (remote if tier == "remote" else None)
                out = engine.generate(warm, query, max_new_tokens=1)
                store.disk, store.remote = disk, remote
                return out.ttft_s, out.stats

            return once

        results: dict[str, Any] = {}
        full, _ = best_of(repeats, lambda: (engine.generate(warm, query, mode="full", max_new_tokens=1).ttft_s, {}))
        results["full"] = {"ttft_s": full}
        log(f"  full           TTFT {full:.3f}s")
        for tier in ("memory", "disk", "remote"):
            ttft, stats = best_of(repeats, trial(tier))
            assert stats["hit_segments"] == segments and stats[f"{tier}_hits"] > 0, stats
            results[tier] = {"ttft_s": ttft, "entry_bytes": stats["cache_bytes"], "speedup_vs_full": full / ttft}
        base = results["memory"]["ttft_s"]
        for tier in ("disk", "remote"):
            extra = results[tier]["ttft_s"] - base
            results[tier]["read_bytes_per_s"] = results[tier]["entry_bytes"] / extra if extra > 0 else float("inf")
        for tier in ("memory", "disk", "remote"):
            row = results[tier]
            rate = f", {row['read_bytes_per_s'] / 2**20:.0f} MiB/s read" if "read_bytes_per_s" in row else ""
            log(
                f"  hypic {tier:<8} TTFT {row['ttft_s']:.3f}s ({row['speedup_vs_full']:.1f}x full), "
                f"{row['entry_bytes'] / 2**20:.1f} MiB of entries{rate}"
            )
    return {
        "benchmark": "tiers",
        "segments": segments,
        "segment_tokens": segment_tokens,
        "query_tokens": query_tokens,
        "layers": layers,
        "threads": torch.get_num_threads(),
        "results": results,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--segments", type=int, default=4)
    parser.add_argument("--segment-tokens", type=int, default=1024)
    parser.add_argument("--query-tokens", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    report = run(args.segments, args.segment_tokens, args.query_tokens, args.layers, args.repeats)
    if args.json:
        write_report(report, args.json, "tiers")


if __name__ == "__main__":
    main()
