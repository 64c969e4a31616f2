"""Bytes per cached token by segment length and ``entry_dtype``, and how much of it the remainder repeats.

    python -m hypic_rag.eval.bench.entry_bytes --json bench-entry-bytes.json

One random checkpoint on Qwen3.5-0.8B layer shapes (``layers`` decoder layers, three Gated DeltaNet to one
attention); per length, one segment prefilled in isolation with the remainder an 8-token seam leaves (what a
cold ``hypic`` request stores), kept as a store of each ``entry_dtype`` keeps it. Entries keep a short segment's
Gated DeltaNet operators in WY form (``2 L + 1 < K``); ``float32_all_dense`` is the entry before that form, every
operator dense ``[H, K, K]``. The remainder holds, per linear layer, a state and an operator over the tokens after
the seam: ``remainder_share`` is its part of a segment's bytes.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from hypic_rag.cache.entry import ENTRY_DTYPES
from hypic_rag.entries import prefill_isolated

from .common import layer_shapes, random_model

LENGTHS = (16, 64, 256, 1024, 4096)


def run(
    lengths: tuple[int, ...] = LENGTHS, layers: int = 4, seam: int = 8, log: Callable[[str], None] = print
) -> dict[str, Any]:
    model = random_model(layer_shapes(layers, max_position_embeddings=8192))
    rows = []
    for n in lengths:
        made = prefill_isolated(model, [list(range(3, 3 + n))], [seam])[0]
        dense = prefill_isolated(model, [list(range(3, 3 + n))], [seam], wy=False)[0]
        row: dict[str, Any] = {
            "tokens": n,
            "float32_all_dense": {"bytes": dense.nbytes, "bytes_per_token": dense.nbytes / n},
        }
        for name, dtype in ENTRY_DTYPES.items():
            entry, rest = made.entry.nbytes_as(dtype), made.remainder.nbytes_as(dtype)
            ops = [*made.entry.linear.values(), *made.remainder.linear.values()]
            operators = sum(e.p.numel() for e in ops) * dtype.itemsize
            row[name] = {
                "bytes": entry + rest,
                "bytes_per_token": (entry + rest) / n,
                "remainder_bytes": rest,
                "operator_bytes": operators,
            }
        row["remainder_share"] = row["float32"]["remainder_bytes"] / row["float32"]["bytes"]
        rows.append(row)
        log(f"  {n:>5} tokens: dense operators, float32: {row['float32_all_dense']['bytes_per_token'] / 1024:.1f} KiB")
        cells = "  ".join(f"{name} {row[name]['bytes_per_token'] / 1024:9.1f} KiB" for name in ENTRY_DTYPES)
        log(f"  {n:>5} tokens: per token {cells}; remainder {row['remainder_share']:.0%} of the bytes")
    return {
        "benchmark": "entry_bytes",
        "layers": layers,
        "linear_layers": len(made.entry.linear),
        "attention_layers": len(made.entry.attention),
        "seam": seam,
        "model_dtype": str(model.dtype).removeprefix("torch."),
        "threads": torch.get_num_threads(),
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    report = run(layers=args.layers)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
