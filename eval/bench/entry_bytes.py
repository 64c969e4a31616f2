"""Bytes per cached token by segment length and ``entry_dtype``, against dense entries, and what the remainder adds.

    python -m hypic_rag.eval.bench.entry_bytes --json bench-entry-bytes.json

One random checkpoint on Qwen3.5-0.8B layer shapes (``layers`` decoder layers, three Gated DeltaNet to one
attention); per length, one segment prefilled in isolation with the remainder an 8-token seam leaves (what a
cold ``hypic`` request stores), kept as a store of each ``entry_dtype`` keeps it. Entries keep a short segment's
Gated DeltaNet layers as their tokens where that is smaller than their dense ``b`` and ``p`` (``form``), and
then derive every remainder from them; ``dense`` is the same segment with every layer dense (``b``, ``p`` and a
stored remainder), in the same dtype, and ``dense_over_entry`` how many times larger that is. ``remainder_share``
is the stored remainder's part of the bytes (0 where it is derived). Where a segment keeps its tokens,
``apply_over_dense`` is what carrying one state past it costs against the dense ``P S + B`` (one linear layer,
the best of ``repeats`` timings each, side by side): the price of the smaller entry, paid once per hit; and
``warm_over_dense`` the same for a whole warm ``hypic`` request's assembly and first forward (``assemble_fused``:
``SEGMENTS`` cached segments of that length, each with its seam, and a 16-token query).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from hypic_rag.assembly import assemble_fused
from hypic_rag.cache.entry import ENTRY_DTYPES, CachedSegment, LinearTokens
from hypic_rag.entries import prefill_isolated
from hypic_rag.plan import Prompt, plan_request

from .common import best_of, layer_shapes, random_model, timed, write_report

LENGTHS = (16, 32, 64, 96, 128, 256, 1024, 4096)
SEGMENTS = 8


def _stored(made: CachedSegment, dtype: torch.dtype) -> tuple[int, int]:
    """The bytes a store of ``dtype`` keeps for the segment, and its stored remainder's part of them."""
    rest = made.remainder
    held = rest.nbytes_as(dtype) if rest is not None and not rest.derived else 0
    return made.nbytes_as(dtype), held


def _best(fn: Callable[[], object], repeats: int) -> float:
    return best_of(repeats, lambda: timed(fn))[0]


def _apply_ratio(made: CachedSegment, dense: CachedSegment, repeats: int) -> float:
    """Seconds to carry a state past the segment's first linear layer kept as tokens, over dense ``P S + B``."""
    layer = next(iter(made.entry.linear))
    kept, full = made.entry.linear[layer].operator(), dense.entry.linear[layer]
    s = torch.randn_like(full.b)
    with torch.inference_mode():
        return _best(lambda: kept.apply(s), repeats) / _best(lambda: torch.baddbmm(full.b, full.p, s), repeats)


def _warm_ratio(model: Any, n: int, seam: int, repeats: int) -> float:
    """Seconds of a warm request's ``assemble_fused`` with entries as kept, over the same with dense entries."""
    segments = [[3 + (i * n + j) % 8000 for j in range(n)] for i in range(SEGMENTS)]
    prompt = Prompt(segments, list(range(5, 21)))
    plan = plan_request(
        prompt, seam=seam, default_seam=seam, variant="B", min_cached_tokens=1, key=lambda ids: str(hash(tuple(ids)))
    )
    widths = [seg.record_remainder for seg in plan.segments]
    seconds = []
    for compact in (True, False):
        made = prefill_isolated(model, segments, widths, compact=compact)
        pairs = zip(made, plan.segments, strict=True)
        cached = [CachedSegment(m.entry, m.remainder if seg.remainder else None) for m, seg in pairs]
        with torch.inference_mode():
            seconds.append(_best(lambda cached=cached: assemble_fused(model, model.new_state(), plan, cached), repeats))
    return seconds[0] / seconds[1]


def run(
    lengths: tuple[int, ...] = LENGTHS,
    layers: int = 4,
    seam: int = 8,
    repeats: int = 20,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    # the vocabulary adds nothing to an entry: a small one keeps the random checkpoint quick to build
    model = random_model(layer_shapes(layers, max_position_embeddings=8192, vocab_size=8192))
    rows = []
    for n in lengths:
        ids = [3 + i % 8000 for i in range(n)]
        made = prefill_isolated(model, [ids], [seam])[0]
        dense = prefill_isolated(model, [ids], [seam], compact=False)[0]
        tokens = all(isinstance(e, LinearTokens) for e in made.entry.linear.values())
        row: dict[str, Any] = {"tokens": n, "form": "tokens" if tokens else "dense"}
        for name, dtype in ENTRY_DTYPES.items():
            held, rest = _stored(made, dtype)
            base = _stored(dense, dtype)[0]
            row[name] = {
                "bytes": held,
                "bytes_per_token": held / n,
                "remainder_bytes": rest,
                "dense_bytes": base,
                "dense_bytes_per_token": base / n,
                "dense_over_entry": base / held,
            }
        row["remainder_share"] = row["float32"]["remainder_bytes"] / row["float32"]["bytes"]
        if tokens:
            row["apply_over_dense"] = _apply_ratio(made, dense, repeats)
            row["warm_over_dense"] = _warm_ratio(model, n, seam, max(1, repeats // 2))
        rows.append(row)
        cells = "  ".join(
            f"{name} {row[name]['bytes_per_token'] / 1024:8.1f} KiB ({row[name]['dense_over_entry']:.2f}x)"
            for name in ENTRY_DTYPES
        )
        cost = ""
        if tokens:
            cost = f"; applied in {row['apply_over_dense']:.2f}x dense's time, warm {row['warm_over_dense']:.2f}x"
        log(f"  {n:>5} tokens ({row['form']}): per token {cells}; remainder {row['remainder_share']:.0%}{cost}")
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
        write_report(report, args.json, "entry_bytes")


if __name__ == "__main__":
    main()
