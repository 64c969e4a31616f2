"""Each supported model family side by side: parity with transformers, bytes per cached token, fidelity.

    python -m hypic_rag.eval.bench.families --json families.json

For every family (``FAMILIES``):

1. **Parity**: the largest |logit difference| between ``full`` and transformers' own model on a tiny random
   checkpoint (``testing.synthetic``), batch 2 x 512, fp32.
2. **Bytes per cached token** at 256 and 1,024 tokens: one segment's entry and its remainder after an
   8-token seam, on a random checkpoint with the family's published layer shapes (3 linear layers, 1
   attention layer; a small vocabulary and FFN, which entries do not depend on), split into what the
   linear layers keep (end states, operators, conv tails) and what attention keeps (K and V).
3. **Fidelity**: mean KL(full ‖ mode) at the end of the prompt for ``pic`` and ``hypic`` (variant B, seam 8)
   on a random 8-layer model of the family (hidden 256), 4 prompts of 8 random segments x 128 tokens + 16.
   Random weights give nearly flat next-token distributions; read the KL as the size of the composition
   error, not as answer quality.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from hypic_rag import Engine
from hypic_rag.fidelity import kl_divergence
from hypic_rag.model import load_model
from hypic_rag.testing.parity import load_reference, logits_max_diff
from hypic_rag.testing.synthetic import QWEN3_5_0_8B_SHAPES, TINY_NEMOTRON_H, build_checkpoint, hybrid_layer_types

from .common import RandomSegments
from .measure import bytes_per_token

# Published per-layer shapes; vocabulary and FFN cut down (entries do not depend on them).
SHAPES: dict[str, dict[str, Any]] = {
    "qwen3_5_text": {
        **QWEN3_5_0_8B_SHAPES,
        "vocab_size": 4096,
        "intermediate_size": 256,
        "layer_types": ["linear_attention"] * 3 + ["full_attention"],
    },
    "nemotron_h": {
        **TINY_NEMOTRON_H,
        "vocab_size": 4096,
        "hidden_size": 4480,
        "intermediate_size": 256,
        "layers_block_type": ["linear_attention"] * 3 + ["full_attention"],
        "num_attention_heads": 40,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "mamba_num_heads": 128,
        "mamba_head_dim": 80,
        "ssm_state_size": 128,
        "n_groups": 8,
        "max_position_embeddings": 8192,
    },
}
SHAPE_NOTES = {
    "qwen3_5_text": "Qwen3.5-0.8B: Gated DeltaNet 16 x 128 x 128, attention 2 kv heads x 256",
    "nemotron_h": "Nemotron-H 9B-class: Mamba2 128 heads x 80 x state 128, attention 8 kv heads x 128",
}
FIDELITY: dict[str, dict[str, Any]] = {
    "qwen3_5_text": {
        "vocab_size": 2048,
        "hidden_size": 256,
        "intermediate_size": 768,
        "num_hidden_layers": 8,
        "layer_types": hybrid_layer_types(8),
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "linear_num_key_heads": 4,
        "linear_num_value_heads": 8,
        "linear_key_head_dim": 32,
        "linear_value_head_dim": 32,
        "max_position_embeddings": 8192,
    },
    "nemotron_h": {
        "vocab_size": 2048,
        "hidden_size": 256,
        "intermediate_size": 768,
        "layers_block_type": ["linear_attention", "mlp"] * 3 + ["full_attention", "mlp"],
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "mamba_num_heads": 16,
        "mamba_head_dim": 32,
        "ssm_state_size": 32,
        "n_groups": 2,
        "max_position_embeddings": 8192,
    },
}
FAMILIES = tuple(SHAPES)


def _model(kind: str, shapes: dict[str, Any]):
    with tempfile.TemporaryDirectory() as tmp:
        build_checkpoint(kind, tmp, shapes)
        return load_model(tmp)


def parity(kind: str) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        build_checkpoint(kind, tmp)
        ours, reference = load_model(tmp), load_reference(tmp)
    ids = torch.randint(3, ours.config.vocab_size, (2, 512), generator=torch.Generator().manual_seed(1))
    return logits_max_diff(ours, reference, ids)


def fidelity(kind: str, prompts: int = 4) -> dict[str, float]:
    engine = Engine(_model(kind, FIDELITY[kind]), seam_variant="B")
    segments = RandomSegments(FIDELITY[kind]["vocab_size"], seed=1)
    kls: dict[str, list[float]] = {"pic": [], "hypic": []}
    for _ in range(prompts):
        segs, q = segments.segments(8, 128), segments.segment(16)
        full = engine.prompt_logits(segs, q, mode="full")
        for mode in kls:
            kls[mode].append(kl_divergence(full, engine.prompt_logits(segs, q, mode=mode, seam=8)))
    return {mode: sum(v) / len(v) for mode, v in kls.items()}


def run(families: tuple[str, ...] = FAMILIES, log: Callable[[str], None] = print) -> dict[str, Any]:
    torch.set_num_threads(1)
    rows = []
    for kind in families:
        row: dict[str, Any] = {"family": kind, "shapes": SHAPE_NOTES[kind], "parity_max_abs": parity(kind)}
        row["bytes"] = bytes_per_token(_model(kind, SHAPES[kind]), [256, 1024])
        row["kl"] = fidelity(kind)
        rows.append(row)
        per = ", ".join(f"{r['tokens']}: {r['bytes_per_token'] / 1024:.1f} KiB/token" for r in row["bytes"])
        log(
            f"{kind}: parity {row['parity_max_abs']:.1e}; {per}; "
            f"KL pic {row['kl']['pic']:.2e}, hypic {row['kl']['hypic']:.2e}"
        )
    return {"benchmark": "families", "threads": 1, "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    chosen = tuple(f for f in args.families.split(",") if f)
    unknown = [f for f in chosen if f not in FAMILIES]
    if unknown:
        raise SystemExit(f"unknown families {unknown}; expected some of {', '.join(FAMILIES)}")
    report = run(chosen)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
