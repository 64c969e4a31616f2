"""``hypic-rag bench --sweep NAME``: TTFT of each mode across one dimension, measured side by side.

- ``length``: total context tokens (8 segments, a 64-token query), warm and reordered.
- ``segments``: segment count at a fixed total.
- ``hits``: the fraction of segments an earlier request cached (0, 50, 90, 100%); the rest are new.
- ``seam``: hypic's seam width at a fixed prompt.
- ``cold``: nothing cached; hypic's segment-parallel prefill against sequential (in-context) prefill.
- ``memory``: bytes a cached segment takes per token, by segment length.

Every point measures all its modes in the same process, one after another, so read ratios.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from .common import RandomSegments, check_modes, measure, random_engine, reordered, speedup

DEFAULTS: dict[str, list[float]] = {
    "length": [1024, 2048, 4096, 8192, 16384, 32768],
    "segments": [2, 4, 8, 16, 32],
    "hits": [0.0, 0.5, 0.9, 1.0],
    "seam": [0, 4, 8, 16, 32, 64],
    "cold": [0.0],
    "memory": [64, 256, 1024, 4096],
}
SWEEPS = tuple(DEFAULTS)


def sweep(
    name: str,
    values: Sequence[float] | None = None,
    modes: Sequence[str] = ("full", "prefix", "hypic", "transformers"),
    total_tokens: int = 8192,
    query_tokens: int = 64,
    layers: int = 4,
    repeats: int = 1,
    shapes: dict[str, Any] | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    if name not in DEFAULTS:
        raise ValueError(f"unknown sweep {name!r}; expected one of {', '.join(SWEEPS)}")
    check_modes(modes)
    values = list(values or DEFAULTS[name])
    if name == "hits" and not all(0 <= v <= 1 for v in values):
        raise ValueError("hit ratios must lie in [0, 1]")
    engine, reference, vocab = random_engine(layers, shapes, log)
    prompts = RandomSegments(vocab)
    points = []
    for value in values:
        if name == "length":
            docs, warm_of = prompts.segments(8, max(1, int(value) // 8)), reordered
        elif name == "segments":
            docs, warm_of = prompts.segments(int(value), max(1, total_tokens // int(value))), reordered
        elif name == "hits":
            docs = prompts.segments(10, total_tokens // 10)
            cached = round(value * len(docs))

            def warm_of(d: list, c: int = cached) -> list | None:
                return reordered(d[:c]) if c else None

        elif name == "seam":
            docs, warm_of = prompts.segments(8, total_tokens // 8), reordered
        elif name == "cold":
            docs, warm_of = prompts.segments(8, total_tokens // 8), lambda d: None
        else:  # memory
            docs, warm_of = prompts.segments(1, int(value)), lambda d: d
        query = prompts.segment(query_tokens, "query")
        rows = _point(name, value, engine, reference, docs, query, warm_of(docs), modes, repeats)
        point = {"x": value, "results": rows}
        if name != "memory":
            point["speedup"] = speedup({r["mode"]: r["ttft_s"] for r in rows})
        points.append(point)
        log(
            f"  {name}={value:g}: "
            + "  ".join(
                f"{r['mode']} {r['ttft_s']:.3f}s" + (f" {r['bytes_per_token']:.0f} B/tok" if name == "memory" else "")
                for r in rows
            )
        )
    return {"benchmark": f"ttft-{name}", "layers": layers, "threads": torch.get_num_threads(), "points": points}


def _point(
    name: str,
    value: float,
    engine: Any,
    reference: Any,
    docs: list,
    query: Any,
    warm: list | None,
    modes: Sequence[str],
    repeats: int,
) -> list[dict[str, Any]]:
    if name == "seam":
        full = measure(engine, reference, docs, query, "full", None, repeats)
        hypic = measure(engine, reference, docs, query, "hypic", warm, repeats, seam=int(value))
        return [full, hypic]
    if name == "cold":
        rows = [measure(engine, reference, docs, query, "full", None, repeats)]
        for policy, label in (("parallel", "hypic-parallel"), ("exact", "hypic-sequential")):
            engine.cold_policy = policy
            row = measure(engine, reference, docs, query, "hypic", None, repeats)
            rows.append({**row, "mode": label})
        engine.cold_policy = "parallel"
        return rows
    if name == "memory":
        row = measure(engine, reference, docs, query, "hypic", warm, 1)
        tokens = len(docs[0].token_ids)
        # What the store holds for the one cached segment: its entry and the remainder it recorded.
        held = engine.segment_store.stats()["memory_bytes"]
        return [{**row, "segment_tokens": tokens, "cache_bytes": held, "bytes_per_token": held / tokens}]
    return [measure(engine, reference, docs, query, m, warm, repeats) for m in modes]


def plot(report: dict[str, Any], path: str | Path) -> Path:
    """TTFT by mode against the swept value (bytes per token for ``memory``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    name = report["benchmark"].removeprefix("ttft-")
    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    modes = [r["mode"] for r in report["points"][0]["results"]]
    key = "bytes_per_token" if name == "memory" else "ttft_s"
    for mode in modes:
        xs = [p["x"] for p in report["points"]]
        ys = [next(r[key] for r in p["results"] if r["mode"] == mode) for p in report["points"]]
        ax.plot(xs, ys, marker="o", label=mode)
    ax.set_xlabel({"length": "context tokens", "segments": "segments", "hits": "hit ratio"}.get(name, name))
    ax.set_ylabel("bytes per cached token" if name == "memory" else "TTFT (s)")
    if name in ("length", "memory"):
        ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.legend(fontsize=8)
    ax.set_title(f"{report['layers']} layers, {report['threads']} threads")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
