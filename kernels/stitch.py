"""Attention of new tokens (seams, the query, decode steps) over a prompt's reassembled KV.

Cached keys keep the rotation they were stored with; each carries the position shift that moves it
to where the prompt now puts it (``R(p + d) = R(d) R(p)``). ``stitch`` fuses that re-rotation of the
partial rotary dims with GQA, masking by absolute position (a key is visible to a query at or after
it, which is causal within the new tokens) and an online softmax; the torch reference re-rotates and
then calls ``scaled_dot_product_attention``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .backend import HAS_TRITON, resolve
from .rope import apply_rope, rope_cos_sin


def _check(q, k, v, q_positions, k_positions, k_shift) -> None:
    if q.dim() != 4 or k.dim() != 4 or k.shape != v.shape or q.shape[0] != k.shape[0] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q must be [B, Hq, T, D] and k, v [B, Hkv, S, D]; got {tuple(q.shape)}, {tuple(k.shape)}")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"{q.shape[1]} query heads do not group over {k.shape[1]} key heads")
    if q_positions.shape != (q.shape[2],) or k_positions.shape != (k.shape[2],) or k_shift.shape != (k.shape[2],):
        raise ValueError("q_positions must be [T], k_positions and k_shift [S]")


def stitch_reference(q, k, v, q_positions, k_positions, k_shift, inv_freq, scale=None) -> torch.Tensor:
    """Torch reference of ``stitch``."""
    if bool(k_shift.any()):
        cos, sin = rope_cos_sin(inv_freq, k_shift)
        k = apply_rope(k.float(), cos, sin).to(k.dtype)
    mask = k_positions[None, :] <= q_positions[:, None]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)


def stitch(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_positions: torch.Tensor,
    k_positions: torch.Tensor,
    k_shift: torch.Tensor,
    inv_freq: torch.Tensor,
    *,
    scale: float | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """``[B, Hq, T, D]``: queries ``q`` (rotated at ``q_positions``) attending over keys ``k`` moved by
    ``k_shift`` to ``k_positions``, and values ``v`` (``[B, Hkv, S, D]``). ``inv_freq`` holds the RoPE
    frequencies of the first ``2 * len(inv_freq)`` dims."""
    _check(q, k, v, q_positions, k_positions, k_shift)
    if resolve(backend, q) == "triton":
        return _stitch_triton(q, k, v, q_positions, k_positions, k_shift, inv_freq, scale)
    return stitch_reference(q, k, v, q_positions, k_positions, k_shift, inv_freq, scale)


if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _stitch_kernel(
        Q, K, V, QPOS, KPOS, KSHIFT, INV_FREQ, O, T, S, scale,
        HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, HALF: tl.constexpr,
        BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr,
    ):  # fmt: skip
        """One block of BM queries of one head per program; keys stream past in blocks of BN."""
        bh = tl.program_id(1)
        b = bh // HQ
        hq = bh % HQ
        hk = hq // (HQ // HKV)
        rm = tl.program_id(0) * BM + tl.arange(0, BM)
        rd = tl.arange(0, BD)
        mm = rm < T
        md = rd < D
        q_off = ((b * HQ + hq) * T + rm[:, None]) * D + rd[None, :]
        q = tl.load(Q + q_off, mask=mm[:, None] & md[None, :], other=0.0).to(tl.float32)
        qpos = tl.load(QPOS + rm, mask=mm, other=0)
        rotary = rd < 2 * HALF
        partner = tl.where(rd < HALF, rd + HALF, rd - HALF)
        partner = tl.where(rotary, partner, rd)
        sign = tl.where(rd < HALF, -1.0, 1.0)
        freq = tl.load(INV_FREQ + (rd % HALF), mask=rotary, other=0.0).to(tl.float32)
        m_i = tl.full([BM], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BM], dtype=tl.float32)
        acc = tl.zeros([BM, BD], dtype=tl.float32)
        for start in range(0, S, BN):
            rn = start + tl.arange(0, BN)
            mn = rn < S
            kv_row = (b * HKV + hk) * S + rn
            kmask = mn[:, None] & md[None, :]
            kb = tl.load(K + kv_row[:, None] * D + rd[None, :], mask=kmask, other=0.0).to(tl.float32)
            kp = tl.load(K + kv_row[:, None] * D + partner[None, :], mask=kmask, other=0.0).to(tl.float32)
            shift = tl.load(KSHIFT + rn, mask=mn, other=0).to(tl.float32)
            angle = shift[:, None] * freq[None, :]
            k_rot = tl.where(rotary[None, :], kb * tl.cos(angle) + sign[None, :] * kp * tl.sin(angle), kb)
            kpos = tl.load(KPOS + rn, mask=mn, other=0)
            s = tl.dot(q, tl.trans(k_rot), input_precision="ieee") * scale
            visible = (kpos[None, :] <= qpos[:, None]) & mn[None, :]
            s = tl.where(visible, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp(s - m_safe[:, None])
            alpha = tl.exp(m_i - m_safe)
            vb = tl.load(V + kv_row[:, None] * D + rd[None, :], mask=kmask, other=0.0).to(tl.float32)
            acc = acc * alpha[:, None] + tl.dot(p, vb, input_precision="ieee")
            l_i = l_i * alpha + tl.sum(p, axis=1)
            m_i = m_new
        out = acc / l_i[:, None]
        tl.store(O + q_off, out.to(O.dtype.element_ty), mask=mm[:, None] & md[None, :])


def _stitch_triton(q, k, v, q_positions, k_positions, k_shift, inv_freq, scale):
    b, hq, t, d = q.shape
    hkv, s = k.shape[1], k.shape[2]
    out = torch.empty_like(q)
    scale = d**-0.5 if scale is None else scale
    bm = 16 if t <= 16 else 64
    grid = (triton.cdiv(t, bm), b * hq)
    _stitch_kernel[grid](
        q.contiguous(), k.contiguous(), v.contiguous(), q_positions.contiguous(), k_positions.contiguous(),
        k_shift.contiguous(), inv_freq.float().contiguous(), out, t, s, scale,
        hq, hkv, d, inv_freq.shape[0], bm, 64, max(16, triton.next_power_of_2(d)),
    )  # fmt: skip
    return out
