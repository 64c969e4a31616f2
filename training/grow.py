"""Growing a trained checkpoint wider and deeper without changing what it computes.

The bundled model's retrieval circuit took most of its training to form (docs/training-log.md's drills); a
bigger model trained from scratch would have to form it again. So a grown model starts as the old one:
old weights sit in the first rows and columns of the new ones, every new residual dimension starts at
zero (the embedding's new columns, every output projection's new rows), every new head or MLP unit and
every inserted layer writes nothing (its output projection's columns are zero) while reading through
fresh random weights, so gradients reach it at once. The RMS norms over the hidden size are rescaled by
sqrt(old / new), since the zero dimensions dilute the mean square. Why our own: no library grows
Qwen3.5's gated-DeltaNet layout (q, k and v heads packed in one projection and one conv), and the
mapping is a few index tables.

Head counts grow in the same ratios (value heads per key head, query heads per kv head), so every old
head keeps the key head it read from; the old layer types must be a subsequence of the new ones (new
layers are inserted, in order, where the old sequence has no layer of the new one's type).

The linear layers' causal conv may grow longer: the old taps stay on the newest tokens and the new,
older taps start at zero. With the tokenizer's spaces as tokens of their own, a four-tap conv sees a
word and a half; a key two words before the value it names ("K is headquartered in V") is out of the
reach of even three stacked convs. (Lengthened to eight taps, the bundled model's second hop did not
move in 300 steps: run 16 in docs/training-log.md.)
"""

from __future__ import annotations

import math
from typing import Any

import torch


def _layer_map(old: list[str], new: list[str]) -> dict[int, int]:
    """New layer index -> old layer index; unmapped new layers are inserted."""
    out: dict[int, int] = {}
    k = 0
    for i, kind in enumerate(new):  # earliest match: complete for subsequences
        if k < len(old) and kind == old[k]:
            out[i] = k
            k += 1
    if k != len(old):
        raise ValueError(f"cannot grow layers {old} into {new}: the old layer types must be a subsequence of the new")
    return out


def _same_ratio(name: str, a_old: int, b_old: int, a_new: int, b_new: int) -> None:
    if a_old * b_new != a_new * b_old or a_new < a_old or b_new < b_old:
        raise ValueError(f"cannot grow {name} from {a_old}/{b_old} to {a_new}/{b_new}: counts must grow in ratio")


def _packed(blocks: list[tuple[int, int]]) -> torch.Tensor:
    """Indices in a packed new axis of old entries: ``blocks`` are (old size, new size) pairs laid end to end."""
    parts, start = [], 0
    for old, new in blocks:
        parts.append(torch.arange(start, start + old))
        start += new
    return torch.cat(parts)


def grow(old: torch.nn.Module, new_config: Any, seed: int) -> torch.nn.Module:
    """A model of ``new_config`` (a Qwen3.5 text config) that computes what ``old`` does, up to the
    norms' epsilon; new weights are drawn from ``seed``."""
    from transformers import Qwen3_5ForCausalLM

    oc, nc = old.config, new_config
    for name in ("vocab_size", "head_dim", "linear_key_head_dim", "linear_value_head_dim"):
        if getattr(oc, name) != getattr(nc, name):
            raise ValueError(f"cannot grow {name} from {getattr(oc, name)} to {getattr(nc, name)}")
    if nc.linear_conv_kernel_dim < oc.linear_conv_kernel_dim:
        raise ValueError(
            f"cannot shorten the conv from {oc.linear_conv_kernel_dim} to {nc.linear_conv_kernel_dim} taps"
        )
    taps = oc.linear_conv_kernel_dim
    if nc.hidden_size < oc.hidden_size or nc.intermediate_size < oc.intermediate_size:
        raise ValueError("a grown model cannot be narrower than the old one")
    _same_ratio("attention heads per kv head", oc.num_attention_heads, oc.num_key_value_heads,
                nc.num_attention_heads, nc.num_key_value_heads)  # fmt: skip
    _same_ratio("value heads per key head", oc.linear_num_value_heads, oc.linear_num_key_heads,
                nc.linear_num_value_heads, nc.linear_num_key_heads)  # fmt: skip
    layers = _layer_map(list(oc.layer_types), list(nc.layer_types))
    torch.manual_seed(seed)
    model = Qwen3_5ForCausalLM(nc)
    n, m = oc.hidden_size, nc.hidden_size
    hid = torch.arange(n)
    dk, dv = oc.linear_key_head_dim, oc.linear_value_head_dim
    nk, nv = oc.linear_num_key_heads, oc.linear_num_value_heads
    nk2, nv2 = nc.linear_num_key_heads, nc.linear_num_value_heads
    # Old entries keep the first places of every head-space axis (an attention head's query and gate sit
    # together), except the linear layers' packed q | k | v, where each block grows in place.
    qkv = _packed([(nk * dk, nk2 * dk), (nk * dk, nk2 * dk), (nv * dv, nv2 * dv)])

    def old_places(module: str, count: int) -> torch.Tensor:
        return qkv if module in ("in_proj_qkv", "conv1d") else torch.arange(count)

    reading = {"in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "q_proj", "k_proj", "v_proj", "gate_proj",
               "up_proj"}  # fmt: skip
    writing = {"out_proj", "o_proj", "down_proj"}
    per_head = {"dt_bias", "A_log"}
    scale = math.sqrt(n / m)
    old_params = dict(old.named_parameters())
    with torch.no_grad():
        for name, p in model.named_parameters():
            parts = name.split(".")
            if parts[:2] == ["model", "layers"]:
                i = int(parts[2])
                if i not in layers:
                    if parts[-2] in writing:
                        p.zero_()  # an inserted layer adds nothing until trained
                    continue
                parts[2] = str(layers[i])
            src = old_params[".".join(parts)]
            module = parts[-2] if parts[-1] == "weight" else parts[-1]
            if module == "embed_tokens":
                p.zero_()
                p[:, :n] = src
            elif module == "lm_head":
                p[:, :n] = src  # reads the new dimensions, which start at zero
            elif module in reading:
                p[old_places(module, src.shape[0])[:, None], hid] = src
            elif module in writing:
                p.zero_()
                p[hid[:, None], old_places(module, src.shape[1])] = src
            elif module == "conv1d":
                p.zero_()  # older taps first: the old ones stay on the newest tokens
                p[old_places(module, src.shape[0]), :, -taps:] = src
            elif module in per_head:
                p[old_places(module, src.shape[0])] = src
            elif src.shape == p.shape and p.shape[0] != m:
                p.copy_(src)  # norms over a head's width
            elif p.shape == (m,):
                p.fill_(scale - 1.0)  # a (1 + w) norm over the hidden size
                p[:n] = (1.0 + src) * scale - 1.0
            else:
                raise ValueError(f"no growth rule for {name} {tuple(src.shape)} -> {tuple(p.shape)}")
    return model
