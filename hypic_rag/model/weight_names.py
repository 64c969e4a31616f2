"""The ways checkpoints lay out the same tensors differently, for families' ``map_weights``: experts stored
one module each (stacked here into the runtime's ``gate_up_proj [E, 2I, H]`` and ``down_proj [E, H, I]``),
projections kept apart that the runtime fuses, decay tables the runtime recomputes.

Each helper edits ``tensors`` in place and raises a ``ValueError`` naming the tensor it cannot map.
"""

from __future__ import annotations

import re

import torch

from .config import HybridConfig


def expert_groups(
    tensors: dict[str, torch.Tensor], config: HybridConfig, pattern: re.Pattern[str], parts: tuple[str, ...]
) -> dict[str, list[dict[str, torch.Tensor]]]:
    """Experts stored one module each: the tensors ``pattern`` matches (groups: prefix, expert, part) are
    taken out and checked (experts 0..E-1, each with all of ``parts``); per prefix, the experts in order."""
    found: dict[str, dict[int, dict[str, torch.Tensor]]] = {}
    for name in [n for n in tensors if pattern.match(n)]:
        m = pattern.match(name)
        assert m is not None
        found.setdefault(m.group(1), {}).setdefault(int(m.group(2)), {})[m.group(3)] = tensors.pop(name)
    groups = {}
    for prefix, experts in found.items():
        ids = sorted(experts)
        if ids != list(range(config.num_experts)):
            raise ValueError(f"{prefix} holds experts {ids[:5]}..., expected 0..{config.num_experts - 1}")
        for e in ids:
            absent = set(parts) - experts[e].keys()
            if absent:
                raise ValueError(f"missing weight {prefix}.{e}.{sorted(absent)[0]}.weight")
        groups[prefix] = [experts[e] for e in ids]
    return groups


def stack_experts(tensors: dict[str, torch.Tensor], config: HybridConfig, ffn: str = "mlp") -> None:
    """Gated experts stored one module each as ``model.layers.N.{ffn}.experts.E.{gate,up,down}_proj``."""
    pattern = re.compile(rf"^(model\.layers\.\d+\.{ffn}\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
    for prefix, experts in expert_groups(tensors, config, pattern, ("gate_proj", "up_proj", "down_proj")).items():
        tensors[prefix + ".gate_up_proj"] = torch.stack([torch.cat((x["gate_proj"], x["up_proj"])) for x in experts])
        tensors[prefix + ".down_proj"] = torch.stack([x["down_proj"] for x in experts])


def merge_expert_modules(tensors: dict[str, torch.Tensor], config: HybridConfig, old: str, new: str) -> None:
    """Experts stored one module each as ``w1`` (gate), ``w3`` (up), ``w2`` (down) under ``old`` (Mixtral's
    and DeepSeek's ``block_sparse_moe``), stacked into ``new.experts``; the rest of ``old`` renamed to ``new``."""
    pattern = re.compile(rf"^(model\.layers\.\d+)\.{old}\.experts\.(\d+)\.(w1|w2|w3)\.weight$")
    for layer, experts in expert_groups(tensors, config, pattern, ("w1", "w2", "w3")).items():
        tensors[f"{layer}.{new}.experts.gate_up_proj"] = torch.stack([torch.cat((x["w1"], x["w3"])) for x in experts])
        tensors[f"{layer}.{new}.experts.down_proj"] = torch.stack([x["w2"] for x in experts])
    for name in [n for n in tensors if f".{old}." in n]:
        tensors[name.replace(f".{old}.", f".{new}.")] = tensors.pop(name)


def fuse_qkv_convs(tensors: dict[str, torch.Tensor], module: str) -> None:
    """One short conv each for q, k and v (``{module}.q_conv1d``, ...) concatenated into the one depthwise
    ``{module}.conv1d`` the runtime runs."""
    for name in [n for n in tensors if n.endswith(f".{module}.q_conv1d.weight")]:
        prefix = name[: -len("q_conv1d.weight")]
        parts = [tensors.pop(prefix + f"{p}_conv1d.weight", None) for p in "qkv"]
        if any(p is None for p in parts):
            raise ValueError(f"{prefix}: q_conv1d, k_conv1d and v_conv1d must all be present")
        tensors[prefix + "conv1d.weight"] = torch.cat(parts)


def drop(tensors: dict[str, torch.Tensor], *last_parts: str) -> None:
    """Tables a checkpoint stores that the runtime recomputes (decay slopes, RoPE frequencies)."""
    for name in [n for n in tensors if n.rsplit(".", 1)[-1] in last_parts]:
        del tensors[name]
