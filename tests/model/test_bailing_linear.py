"""Ring-linear-2.0 has no transformers class: its parity is against an independent oracle written here from
the published architecture (token-by-token Lightning recurrence, naive softmax attention with RoPE per
position, the grouped sigmoid router), reading the checkpoint's tensors by their release names."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import load_file

from hypic_rag import Engine, Segment
from hypic_rag.model import load_model
from hypic_rag.model.families import read_config
from hypic_rag.model.families.bailing_moe_linear import ring_layer_types
from hypic_rag.testing.parity import rounding_bound


def _rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rope(x, pos, rot, theta):
    """Rotate-half RoPE on the first ``rot`` dims of ``x [..., D]`` at integer position ``pos``."""
    inv = 1.0 / theta ** (torch.arange(0, rot, 2, dtype=torch.float32) / rot)
    ang = torch.cat((pos * inv, pos * inv))
    r, rest = x[..., :rot], x[..., rot:]
    half = torch.cat((-r[..., rot // 2 :], r[..., : rot // 2]), -1)
    return torch.cat((r * ang.cos() + half * ang.sin(), rest), -1)


def _slopes(h):
    base = 2 ** (-8 / h)  # a power-of-two head count here
    return torch.tensor([base ** (i + 1) for i in range(h)])


def oracle_logits(path, ids: list[int]) -> torch.Tensor:
    cfg = json.loads((path / "config.json").read_text())
    w = load_file(str(path / "model.safetensors"))
    heads, kv, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    n_layers, eps, rot = cfg["num_hidden_layers"], cfg["rms_norm_eps"], int(d * cfg["partial_rotary_factor"])
    theta, g = cfg["rope_theta"], cfg["layer_group_size"]
    x = w["model.word_embeddings.weight"][ids]
    states: dict[int, torch.Tensor] = {}
    keys: dict[int, list] = {}
    out_rows = []
    for t in range(len(ids)):
        hcur = x[t]
        for i in range(n_layers):
            p = f"model.layers.{i}."
            a = _rms(hcur, w[p + "input_layernorm.weight"], eps)
            qkv = w[p + "attention.query_key_value.weight"] @ a
            if (i + 1) % g:  # Lightning
                q, k, v = (y.view(heads, d) for y in qkv.chunk(3))
                q = _rms(q, w[p + "attention.query_layernorm.weight"], eps)
                k = _rms(k, w[p + "attention.key_layernorm.weight"], eps)
                q, k = _rope(q, t, rot, theta) * d**-0.5, _rope(k, t, rot, theta)
                lam = torch.exp(-_slopes(heads) * (1 - (i - 1) / (n_layers - 1) + 1e-5))
                s = states.get(i, torch.zeros(heads, d, d))
                s = lam[:, None, None] * s + k[:, :, None] * v[:, None, :]
                states[i] = s
                o = torch.einsum("hk,hkv->hv", q, s).reshape(-1)
                gs = cfg["group_norm_size"]
                o = w[p + "attention.g_norm.weight"] * _rms(o.view(gs, -1), 1.0, eps).reshape(-1)
                o = o * torch.sigmoid(w[p + "attention.g_proj.weight"] @ a)
            else:  # softmax attention
                q, k, v = qkv.split((heads * d, kv * d, kv * d))
                q = _rms(q.view(heads, d), w[p + "attention.query_layernorm.weight"], eps)
                k = _rms(k.view(kv, d), w[p + "attention.key_layernorm.weight"], eps)
                keys.setdefault(i, []).append((_rope(k, t, rot, theta), v.view(kv, d)))
                q = _rope(q, t, rot, theta)
                ks = torch.stack([kk for kk, _ in keys[i]], 1)
                vs = torch.stack([vv for _, vv in keys[i]], 1)
                rep = heads // kv
                att = torch.softmax(torch.einsum("hd,hsd->hs", q, ks.repeat_interleave(rep, 0)) / math.sqrt(d), -1)
                o = torch.einsum("hs,hsd->hd", att, vs.repeat_interleave(rep, 0)).reshape(-1)
            hcur = hcur + w[p + "attention.dense.weight"] @ o
            m = _rms(hcur, w[p + "post_attention_layernorm.weight"], eps)

            def swiglu(prefix, y):
                return w[prefix + "down_proj.weight"] @ (
                    torch.nn.functional.silu(w[prefix + "gate_proj.weight"] @ y) * (w[prefix + "up_proj.weight"] @ y)
                )

            if i < cfg["first_k_dense_replace"]:
                hcur = hcur + swiglu(p + "mlp.", m)
                continue
            scores = torch.sigmoid(w[p + "mlp.gate.weight"] @ m)
            choice = scores + w[p + "mlp.gate.expert_bias"]
            groups = choice.view(cfg["n_group"], -1)
            best = groups.topk(2, -1).values.sum(-1).topk(cfg["topk_group"]).indices
            mask = torch.full_like(groups, float("-inf"))
            mask[best] = 0
            picked = (choice + mask.reshape(-1)).topk(cfg["num_experts_per_tok"]).indices
            weights = scores[picked] / (scores[picked].sum() + 1e-20) * cfg["routed_scaling_factor"]
            routed = sum(wt * swiglu(f"{p}mlp.experts.{e}.", m) for wt, e in zip(weights, picked.tolist(), strict=True))
            hcur = hcur + routed + swiglu(p + "mlp.shared_experts.", m)
        out_rows.append(w["lm_head.weight"] @ _rms(hcur, w["model.norm.weight"], eps))
    return torch.stack(out_rows)


def test_runtime_equals_the_oracle(checkpoint):
    path = checkpoint("bailing_moe_linear")
    model = load_model(path)
    ids = torch.randint(3, 320, (40,), generator=torch.Generator().manual_seed(2)).tolist()
    want = oracle_logits(path, ids)
    with torch.inference_mode():
        got = model(torch.tensor([ids]))[0]
    # the oracle sums token by token, the runtime in chunks: equal up to this CPU's fp32 rounding
    assert (got - want).abs().max() <= rounding_bound(model, torch.tensor([ids]))
    assert want.abs().max() > 0.5  # logits of a meaningful size


def test_greedy_decoding_equals_the_oracle(checkpoint):
    path = checkpoint("bailing_moe_linear")
    engine = Engine.from_pretrained(path)
    engine.eos_token_ids = ()
    prompt = torch.randint(3, 320, (24,), generator=torch.Generator().manual_seed(5)).tolist()
    out = engine.generate([], Segment(token_ids=prompt, kind="query"), mode="full", max_new_tokens=6)
    ids = list(prompt)
    for _ in range(6):
        ids.append(int(oracle_logits(path, ids)[-1].argmax()))
    assert out.token_ids == ids[len(prompt) :]


def test_layer_groups_and_release_fields():
    assert ring_layer_types(20, 5).count("full_attention") == 4  # Ring-mini: layers 4, 9, 14, 19
    assert ring_layer_types(7, 3) == ["linear_attention", "linear_attention", "full_attention"] * 2 + ["full_attention"]
    cfg = read_config(
        {"model_type": "bailing_moe_linear", "num_hidden_layers": 4, "layer_group_size": 2, "hidden_size": 64,
         "num_attention_heads": 4, "head_dim": 16, "rotary_dim": 4, "use_linear_silu": True, "num_experts": 8,
         "n_group": 2, "topk_group": 1, "group_norm_size": 2}
    )  # fmt: skip
    assert cfg.rotary_dim == 4 and cfg.ring_linear_silu and cfg.mlp_only_layers == (0,)
    for bad, match in (({"score_function": "softmax"}, "score_function"), ({"use_bias": True}, "use_bias")):
        with pytest.raises(ValueError, match=match):
            read_config({"model_type": "bailing_moe_linear", "num_hidden_layers": 2, **bad})


def test_linear_rope_off_leaves_the_lightning_state_unrotated(tmp_path):
    """``linear_rope: false``: only the softmax layers rotate; a cached Lightning state then moves unchanged,
    and composing stays exact in the first layer (variant B)."""
    from hypic_rag.testing.synthetic import build_checkpoint

    engine = Engine.from_pretrained(build_checkpoint("bailing_moe_linear", tmp_path, {"linear_rope": False}),
                                    min_cached_tokens=1, seam_variant="B")  # fmt: skip
    mixer = engine.model.linear_mixers()[0]
    b = torch.randn(4, 16, 16)
    assert torch.equal(mixer.place_state(b, 17, engine.model.inv_freq), b)
    gen = torch.Generator().manual_seed(3)
    segs = [Segment(token_ids=torch.randint(3, 320, (n,), generator=gen).tolist()) for n in (30, 25, 41)]
    q = Segment(token_ids=[5, 6, 7], kind="query")
    engine.generate(segs[::-1], q, max_new_tokens=1)
    _, full = engine.prefill(segs, q, mode="full")
    _, got = engine.prefill(segs, q, mode="hypic")
    torch.testing.assert_close(got.linear(0).recurrent, full.linear(0).recurrent, atol=1e-5, rtol=1e-5)
