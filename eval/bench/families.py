"""Each supported model family side by side: parity with transformers, bytes per cached token, fidelity.

    python -m hypic_rag.eval.bench.families --json families.json

For every family (``FAMILIES``):

1. **Parity**: the largest |logit difference| between ``full`` and transformers' own model on a tiny random
   checkpoint (``testing.synthetic``), batch 2 x 512, fp32.
2. **Bytes per cached token** at 256 and 1,024 tokens: one segment's entry and its remainder after an
   8-token seam, on our runtime's random-weight model with the family's published layer shapes (3 linear
   layers, 1 attention layer; a small vocabulary and FFN, which entries do not depend on), split into what
   the linear layers keep (end states, operators, conv tails) and what attention keeps (K and V).
3. **Fidelity**: mean KL(full ‖ mode) at the end of the prompt for ``pic`` and ``hypic`` (variant B, seam 8)
   on a random 8-layer model of the family (hidden 256, 3 linear : 1 attention), 4 prompts of 8 random
   segments x 128 tokens + 16.
   Random weights give nearly flat next-token distributions; read the KL as the size of the composition
   error, not as answer quality.
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from hypic_rag import Engine
from hypic_rag.fidelity import kl_divergence
from hypic_rag.model import HybridModel, load_model
from hypic_rag.model.families import read_config
from hypic_rag.testing.parity import load_reference, logits_max_diff
from hypic_rag.testing.synthetic import QWEN3_5_0_8B_SHAPES, build_checkpoint, hybrid_layer_types, randomize

from .common import RandomSegments, write_report
from .measure import bytes_per_token

# Per-layer shapes of published configurations (transformers' config defaults, which follow a released
# checkpoint of each family, or the release's own config.json), 4 layers: 3 linear, 1 attention (Falcon-H1:
# 4 hybrid layers). Vocabulary and FFN are cut down: entries do not depend on them.
_SMALL = {"vocab_size": 4096, "intermediate_size": 256, "max_position_embeddings": 8192}
_LAYERS = ["linear_attention"] * 3 + ["full_attention"]
SHAPES: dict[str, dict[str, Any]] = {
    "qwen3_5_text": {"model_type": "qwen3_5_text", **QWEN3_5_0_8B_SHAPES, **_SMALL, "layer_types": _LAYERS},
    "nemotron_h": {"model_type": "nemotron_h", **_SMALL, "layers_block_type": _LAYERS},
    "granitemoehybrid": {"model_type": "granitemoehybrid", **_SMALL, "layer_types": _LAYERS, "num_hidden_layers": 4,
                         "num_local_experts": 0, "shared_intermediate_size": 256},
    "bamba": {"model_type": "bamba", **_SMALL, "num_hidden_layers": 4, "attn_layer_indices": [3]},
    "lfm2": {"model_type": "lfm2", **_SMALL, "num_hidden_layers": 4, "layer_types": ["conv"] * 3 + ["full_attention"]},
    "minimax": {"model_type": "minimax", **_SMALL, "num_hidden_layers": 4, "layer_types": _LAYERS,
                "num_local_experts": 2},
    "kimi_linear": {"model_type": "kimi_linear", **_SMALL, "num_hidden_layers": 4, "layer_types": _LAYERS,
                    "num_experts": 8, "moe_intermediate_size": 64},
    "olmo_hybrid": {"model_type": "olmo_hybrid", **_SMALL, "num_hidden_layers": 4, "layer_types": _LAYERS},
    "falcon_h1": {"model_type": "falcon_h1", **_SMALL, "num_hidden_layers": 4},
    "bailing_moe_linear": {"model_type": "bailing_moe_linear", **_SMALL, "num_hidden_layers": 4,
                           "layer_group_size": 4, "num_experts": 8, "n_group": 1, "topk_group": 1},
    "jamba": {"model_type": "jamba", **_SMALL, "num_hidden_layers": 4, "attn_layer_period": 4,
              "attn_layer_offset": 3, "num_experts": 2},
    "bailing_hybrid": {"model_type": "bailing_hybrid", **_SMALL, "num_hidden_layers": 4, "layer_group_size": 4,
                       "num_experts": 8, "n_group": 1, "topk_group": 1, "moe_intermediate_size": 64},
    "zamba2": {"model_type": "zamba2", **_SMALL, "num_hidden_layers": 4,
               "layers_block_type": ["mamba"] * 3 + ["hybrid"]},
}  # fmt: skip
SHAPE_NOTES = {
    "qwen3_5_text": "Qwen3.5-0.8B: Gated DeltaNet 16 heads, K = V = 128; attention 2 kv heads x 256",
    "nemotron_h": "Nemotron-H (transformers' defaults): Mamba2 128 heads x 64 x state 128; attention 8 kv x 128",
    "granitemoehybrid": "Granite-4.0-H (defaults): Mamba2 128 heads x 64 x state 256; attention 32 kv x 128",
    "bamba": "Bamba (defaults): Mamba2 128 heads x 64 x state 256; attention 8 kv x 128",
    "lfm2": "LFM2 (defaults): short conv over 2,560 channels, 2 past inputs; attention 8 kv x 80",
    "minimax": "MiniMax (defaults): Lightning 32 heads x 128 x 128; attention 8 kv x 128",
    "kimi_linear": "Kimi Linear (defaults): KDA 32 heads x 128 x 128; MLA 32 heads x K 192 (V padded)",
    "olmo_hybrid": "OLMo hybrid (defaults): Gated DeltaNet 30 heads, K 96, V 192; attention 30 kv x 128",
    "falcon_h1": "Falcon-H1 (defaults): Mamba2 128 heads x 8 x state 256 and attention 8 kv x 128 in each layer",
    "bailing_moe_linear": "Ring-mini-linear-2.0: Lightning 16 heads x 128 x 128; attention 4 kv x 128",
    "jamba": "Jamba (defaults): Mamba1 8,192 channels x state 16; attention 8 kv x 128",
    "bailing_hybrid": "Ling 3.0 (defaults): KDA 32 heads x 128 x 128; MLA 32 heads x K 192 (V padded)",
    "zamba2": "Zamba2 (defaults): Mamba2 8 heads x 640 x state 64; shared attention 32 kv x 160 at the hybrid layer",
}
_FIDELITY_BASE = {"vocab_size": 2048, "hidden_size": 256, "intermediate_size": 512, "max_position_embeddings": 8192,
                  "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 2}  # fmt: skip
_FID_LAYERS = hybrid_layer_types(8)
FIDELITY: dict[str, dict[str, Any]] = {
    "qwen3_5_text": {"model_type": "qwen3_5_text", **_FIDELITY_BASE, "layer_types": _FID_LAYERS, "head_dim": 32,
                     "linear_num_key_heads": 4, "linear_num_value_heads": 8, "linear_key_head_dim": 32,
                     "linear_value_head_dim": 32},
    "nemotron_h": {"model_type": "nemotron_h", **_FIDELITY_BASE, "head_dim": 32, "layers_block_type": _FID_LAYERS,
                   "mamba_num_heads": 8, "mamba_head_dim": 32, "ssm_state_size": 32, "n_groups": 2},
    "granitemoehybrid": {"model_type": "granitemoehybrid", **_FIDELITY_BASE, "layer_types": _FID_LAYERS,
                         "num_local_experts": 0, "shared_intermediate_size": 512, "mamba_n_heads": 8,
                         "mamba_d_head": 64, "mamba_d_state": 32, "mamba_n_groups": 2,
                         "position_embedding_type": "rope"},
    "bamba": {"model_type": "bamba", **_FIDELITY_BASE, "attn_layer_indices": [3, 7], "mamba_n_heads": 8,
              "mamba_d_head": 64, "mamba_d_state": 32, "mamba_n_groups": 2},
    "lfm2": {"model_type": "lfm2", **_FIDELITY_BASE, "layer_types": ["conv" if t == "linear_attention" else t
                                                                     for t in _FID_LAYERS]},
    "minimax": {"model_type": "minimax", **_FIDELITY_BASE, "layer_types": _FID_LAYERS, "head_dim": 32,
                "num_local_experts": 4},
    "kimi_linear": {"model_type": "kimi_linear", **_FIDELITY_BASE, "layer_types": _FID_LAYERS, "num_experts": 8,
                    "moe_intermediate_size": 64, "kv_lora_rank": 64, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16,
                    "v_head_dim": 32, "linear_attn_config": {"num_heads": 8, "head_dim": 32}},
    "olmo_hybrid": {"model_type": "olmo_hybrid", **_FIDELITY_BASE, "layer_types": _FID_LAYERS,
                    "linear_num_key_heads": 4, "linear_num_value_heads": 8, "linear_key_head_dim": 32,
                    "linear_value_head_dim": 32},
    "falcon_h1": {"model_type": "falcon_h1", **_FIDELITY_BASE, "head_dim": 32, "mamba_d_ssm": 256,
                  "mamba_n_heads": 8, "mamba_d_head": 32, "mamba_d_state": 32, "mamba_n_groups": 2},
    "bailing_moe_linear": {"model_type": "bailing_moe_linear", **_FIDELITY_BASE, "layer_group_size": 4,
                           "head_dim": 32, "num_experts": 8, "n_group": 2, "topk_group": 1, "group_norm_size": 2},
    "jamba": {"model_type": "jamba", **_FIDELITY_BASE, "attn_layer_period": 4, "attn_layer_offset": 3,
              "num_experts": 4, "mamba_d_state": 16},
    "bailing_hybrid": {"model_type": "bailing_hybrid", **_FIDELITY_BASE, "layer_group_size": 4, "head_dim": 32,
                       "num_experts": 8, "n_group": 2, "topk_group": 1, "moe_intermediate_size": 64,
                       "kv_lora_rank": 64, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32},
    "zamba2": {"model_type": "zamba2", **_FIDELITY_BASE, "num_key_value_heads": 8, "n_mamba_heads": 8,
               "mamba_d_state": 32, "mamba_ngroups": 2, "use_mem_rope": True, "num_mem_blocks": 2,
               "use_shared_attention_adapter": True, "adapter_rank": 16,
               "layers_block_type": ["hybrid" if t == "full_attention" else "mamba" for t in _FID_LAYERS]},
}  # fmt: skip
FAMILIES = tuple(SHAPES)
# The tiny checkpoint each family's parity is measured on; Ring-linear has no transformers class (see tests).
_PARITY_KIND = {k: k for k in FAMILIES if k != "bailing_moe_linear"}


def _model(config: dict[str, Any], seed: int = 0) -> HybridModel:
    """Our runtime's model of ``config`` with random weights at ``randomize``'s scales (no checkpoint)."""
    model = HybridModel(read_config(config))
    randomize(model, seed)
    return model.eval().requires_grad_(False)


def parity(kind: str) -> float | None:
    if kind not in _PARITY_KIND:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        build_checkpoint(kind, tmp)
        ours, reference = load_model(tmp), load_reference(tmp)
    ids = torch.randint(3, ours.config.vocab_size, (2, 512), generator=torch.Generator().manual_seed(1))
    return logits_max_diff(ours, reference, ids)


def fidelity(kind: str, prompts: int = 4) -> dict[str, float]:
    engine = Engine(_model(FIDELITY[kind]), seam_variant="B")
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
        row["bytes"] = bytes_per_token(_model(SHAPES[kind]), [256, 1024])
        row["kl"] = fidelity(kind)
        rows.append(row)
        per = ", ".join(f"{r['tokens']}: {r['bytes_per_token'] / 1024:.1f} KiB/token" for r in row["bytes"])
        par = row["parity_max_abs"]
        log(
            f"{kind}: parity {'oracle' if par is None else f'{par:.1e}'}; {per}; "
            f"KL pic {row['kl']['pic']:.2e}, hypic {row['kl']['hypic']:.2e}"
        )
    return {"benchmark": "families", "threads": 1, "rows": rows}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    chosen = tuple(f for f in args.families.split(",") if f)
    unknown = [f for f in chosen if f not in FAMILIES]
    if unknown:
        raise SystemExit(f"unknown families {unknown}; expected some of {', '.join(FAMILIES)}")
    report = run(chosen)
    if args.json:
        write_report(report, args.json, "families")


if __name__ == "__main__":
    main()
