"""stitch: attention over reassembled KV equals plain attention over explicitly rotated keys."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hypic_rag.kernels.backend import HAS_TRITON
from hypic_rag.kernels.rope import apply_rope, rope_cos_sin, rope_inv_freq
from hypic_rag.kernels.stitch import stitch

BACKENDS = ["torch", pytest.param("triton", marks=pytest.mark.skipif(not HAS_TRITON, reason="needs triton"))]


def _case(hq=4, hkv=2, d=32, rotary=8, cached=(20, 13), new=7, dtype=torch.float32, seed=0):
    """Two cached segments stored at positions 0..L-1, moved behind each other, then new tokens."""
    gen = torch.Generator().manual_seed(seed)
    inv = rope_inv_freq(rotary, 10000.0)
    raw_k = [torch.randn(1, hkv, n, d, generator=gen) for n in (*cached, new)]
    v = torch.cat([torch.randn(1, hkv, n, d, generator=gen) for n in (*cached, new)], dim=2)
    stored, shifts, positions, offset = [], [], [], 0
    for kk, n in zip(raw_k[:-1], cached, strict=True):
        cos, sin = rope_cos_sin(inv, torch.arange(n))
        stored.append(apply_rope(kk, cos, sin))  # as a cache entry holds it
        shifts.append(torch.full((n,), offset))
        positions.append(torch.arange(offset, offset + n))
        offset += n
    new_pos = torch.arange(offset, offset + new)
    cos, sin = rope_cos_sin(inv, new_pos)
    stored.append(apply_rope(raw_k[-1], cos, sin))  # fresh keys, already in place
    shifts.append(torch.zeros(new, dtype=torch.long))
    positions.append(new_pos)
    q = apply_rope(torch.randn(1, hq, new, d, generator=gen), cos, sin)
    k_pos = torch.cat(positions)
    # What the prompt would hold had every key been rotated at its final position directly.
    cos_all, sin_all = rope_cos_sin(inv, k_pos)
    truth_k = apply_rope(torch.cat(raw_k, dim=2), cos_all, sin_all)
    return [x.to(dtype) for x in (q, torch.cat(stored, dim=2), v, truth_k)] + [new_pos, k_pos, torch.cat(shifts), inv]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("hq,hkv,d,rotary", [(4, 2, 32, 8), (2, 2, 16, 16), (6, 1, 24, 8)])
def test_stitch_equals_plain_attention_over_rotated_keys(backend, hq, hkv, d, rotary):
    q, k, v, truth_k, q_pos, k_pos, shift, inv = _case(hq, hkv, d, rotary)
    mask = k_pos[None, :] <= q_pos[:, None]
    expected = F.scaled_dot_product_attention(q, truth_k, v, attn_mask=mask, enable_gqa=True)
    out = stitch(q, k, v, q_pos, k_pos, shift, inv, backend=backend)
    assert out.shape == q.shape
    assert (out - expected).abs().max() < 1e-4


@pytest.mark.skipif(not HAS_TRITON, reason="needs triton")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("new", [1, 7, 70])
def test_triton_stitch_agrees_with_torch(dtype, new):
    q, k, v, _, q_pos, k_pos, shift, inv = _case(cached=(40, 90), new=new, dtype=dtype, seed=new)
    ref = stitch(q, k, v, q_pos, k_pos, shift, inv, backend="torch").float()
    tri = stitch(q, k, v, q_pos, k_pos, shift, inv, backend="triton").float()
    assert (ref - tri).abs().max() < (1e-4 if dtype == torch.float32 else 2e-3)


def test_stitch_rejects_bad_shapes():
    q, k, v, _, q_pos, k_pos, shift, inv = _case()
    with pytest.raises(ValueError, match="k_positions and k_shift"):
        stitch(q, k, v, q_pos, k_pos[:-1], shift, inv)
    with pytest.raises(ValueError, match="do not group"):
        stitch(q[:, :3], k, v, q_pos, k_pos, shift, inv)
