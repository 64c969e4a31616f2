"""The flood: a Zipf-popular document pool under a stream of one-off documents, the memory tier kept at a tenth of
the pool's bytes, plain LRU against the value policy (TinyLFU admission, GreedyDual-Size-Frequency eviction).

    python -m hypic_rag.eval.bench.flood --json flood.json --plot flood.png
    hypic-rag bench --sweep flood --json flood.json --plot flood.png

Each request is ``per_request`` documents drawn without replacement by Zipf(``zipf``) from a pool of ``pool``,
plus ``novel`` documents never seen before and never seen again (the same ones for both policies), in random
order, then a query; a real engine serves each in ``hypic`` mode, cold misses prefilled in isolation. Both
policies serve the same stream on the same random checkpoint (``TINY_SHAPES``: small enough that thousands of
requests take minutes on a CPU; the entries' layout — per linear layer a state and an operator of fixed size,
per attention layer KV — is the real one's), taking turns request by request, so that a busy machine slows both
alike. A pool document is a hit when its entry is in the memory tier as
its request arrives. Reported per window of ``window`` requests and overall: the pool hit ratio and the mean
TTFT.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hypic_rag import Engine, Segment
from hypic_rag.cache import segment_key
from hypic_rag.testing.synthetic import QWEN3_5_0_8B_SHAPES

from .common import RandomSegments, random_engine, write_report

# Qwen3.5-0.8B's shapes scaled down (3 Gated DeltaNet layers to 1 attention layer, as the published models have):
# small enough that thousands of requests run in minutes.
TINY_SHAPES: dict[str, Any] = {
    **{
        k: v
        for k, v in QWEN3_5_0_8B_SHAPES.items()
        if k not in ("num_hidden_layers", "layer_types", "max_position_embeddings")
    },
    "vocab_size": 4096,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "head_dim": 64,
    "linear_num_key_heads": 4,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 64,
    "linear_value_head_dim": 64,
}
POLICIES = ("lru", "value")


def stream(requests: int, pool: int, per_request: int, novel: int, zipf: float, seed: int) -> list[list[int]]:
    """Each request's documents: pool indices ``0..pool-1`` and, for novel ones, fresh indices from ``pool`` up."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, pool + 1) ** zipf
    weights /= weights.sum()
    out, fresh = [], pool
    for _ in range(requests):
        docs = [int(d) for d in rng.choice(pool, per_request, replace=False, p=weights)]
        docs += range(fresh, fresh + novel)
        fresh += novel
        rng.shuffle(docs)
        out.append(docs)
    return out


def run(
    requests: int = 3000,
    pool: int = 500,
    per_request: int = 4,
    novel: int = 2,
    zipf: float = 0.9,
    budget_share: float = 0.1,
    doc_tokens: int = 32,
    query_tokens: int = 8,
    layers: int = 4,
    window: int = 100,
    seed: int = 0,
    policies: tuple[str, ...] = POLICIES,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    if not 0 < budget_share <= 1 or min(requests, pool, per_request, doc_tokens, query_tokens, window) < 1:
        raise ValueError("the flood needs positive sizes and a budget share in (0, 1]")
    if per_request > pool:
        raise ValueError(f"{per_request} documents per request from a pool of {pool}")
    probe: Engine = random_engine(layers, TINY_SHAPES, log)[0]
    random = RandomSegments(probe.config.vocab_size, seed=seed + 1)
    docs = stream(requests, pool, per_request, novel, zipf, seed)
    texts: dict[int, Segment] = {}

    def doc(i: int) -> Segment:
        if i not in texts:
            texts[i] = random.segment(doc_tokens)
        return texts[i]

    query = random.segment(query_tokens, "query")
    probe.generate([doc(0), doc(1)], query, max_new_tokens=1)  # one document's entry and remainder, measured
    per_doc = probe.memory.used // 2
    probe.clear_cache()
    budget = int(budget_share * pool * per_doc)
    log(f"{requests} requests, {per_request} of {pool} documents (Zipf {zipf}) + {novel} new each; ")
    log(f"  {per_doc / 2**20:.2f} MiB per document, memory tier {budget / 2**20:.1f} MiB ({budget_share:.0%} of pool)")
    serving = {
        policy: Engine(
            probe.model, fingerprint=probe.fingerprint, min_cached_tokens=1, memory_bytes=budget, cache_policy=policy
        )
        for policy in policies
    }
    keys = {i: segment_key(probe.segment_ids(doc(i)), probe.fingerprint, probe.model.dtype) for i in range(pool)}
    hits: dict[str, list[float]] = {policy: [] for policy in policies}
    ttfts: dict[str, list[float]] = {policy: [] for policy in policies}
    for n, request in enumerate(docs):
        pooled = [i for i in request if i < pool]
        # the policies take turns on each request, first one then the other, so that a busy machine slows both
        for policy in policies if n % 2 == 0 else policies[::-1]:
            engine = serving[policy]
            hits[policy].append(sum(keys[i] in engine.segment_store for i in pooled) / len(pooled))
            ttfts[policy].append(engine.generate([doc(i) for i in request], query, max_new_tokens=1).ttft_s)
        if (n + 1) % window == 0:
            for policy in policies:
                log(
                    f"  {policy:<5} {n + 1:>5}: pool hit ratio {np.mean(hits[policy][-window:]):.3f}, "
                    f"mean TTFT {1e3 * np.mean(ttfts[policy][-window:]):.1f} ms"
                )
    results: dict[str, Any] = {}
    for policy, engine in serving.items():
        stats = engine.segment_store.stats()
        h, t = hits[policy], ttfts[policy]
        results[policy] = {
            "pool_hit_ratio": float(np.mean(h)),
            "mean_ttft_s": float(np.mean(t)),
            "windows": {
                "pool_hit_ratio": [float(np.mean(h[s : s + window])) for s in range(0, requests, window)],
                "mean_ttft_s": [float(np.mean(t[s : s + window])) for s in range(0, requests, window)],
            },
            "refused": stats["refused"],
            "evicted": stats["evicted"],
            "memory_bytes": stats["memory_bytes"],
        }
    if "lru" in results and "value" in results:
        results["value_over_lru"] = {
            "pool_hit_ratio": results["value"]["pool_hit_ratio"] / results["lru"]["pool_hit_ratio"],
            "mean_ttft": results["value"]["mean_ttft_s"] / results["lru"]["mean_ttft_s"],
        }
        log(
            f"  value / lru: pool hit ratio {results['value_over_lru']['pool_hit_ratio']:.2f}x, "
            f"mean TTFT {results['value_over_lru']['mean_ttft']:.2f}x"
        )
    return {
        "benchmark": "flood",
        "requests": requests,
        "pool": pool,
        "per_request": per_request,
        "novel": novel,
        "zipf": zipf,
        "budget_share": budget_share,
        "budget_bytes": budget,
        "bytes_per_document": per_doc,
        "doc_tokens": doc_tokens,
        "query_tokens": query_tokens,
        "layers": layers,
        "shapes": {k: v for k, v in TINY_SHAPES.items() if isinstance(v, int)},
        "window": window,
        "seed": seed,
        "threads": torch.get_num_threads(),
        "results": results,
    }


def plot(report: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (hit, ttft) = plt.subplots(1, 2, figsize=(11, 4))
    window = report["window"]
    for policy, row in report["results"].items():
        if policy not in POLICIES:
            continue
        x = [window * (i + 1) for i in range(len(row["windows"]["pool_hit_ratio"]))]
        label = f"{policy} ({row['pool_hit_ratio']:.2f} overall)"
        hit.plot(x, row["windows"]["pool_hit_ratio"], label=label)
        ttft.plot(
            x, [1e3 * t for t in row["windows"]["mean_ttft_s"]], label=f"{policy} ({1e3 * row['mean_ttft_s']:.1f} ms)"
        )
    hit.set(xlabel="requests", ylabel=f"pool hit ratio (per {window} requests)", ylim=(0, 1))
    ttft.set(xlabel="requests", ylabel=f"mean TTFT, ms (per {window} requests)")
    ttft.set_ylim(bottom=0)
    fig.suptitle(
        f"Flood: {report['per_request']} of {report['pool']} docs (Zipf {report['zipf']}) + {report['novel']} new per "
        f"request, memory {report['budget_share']:.0%} of the pool"
    )
    for ax in (hit, ttft):
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--pool", type=int, default=500)
    parser.add_argument("--doc-tokens", type=int, default=32)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--plot", type=Path, default=None)
    args = parser.parse_args(argv)
    report = run(args.requests, args.pool, doc_tokens=args.doc_tokens, layers=args.layers, seed=args.seed)
    if args.json:
        write_report(report, args.json, "flood")
    if args.plot:
        print(f"wrote {plot(report, args.plot)}")


if __name__ == "__main__":
    main()
